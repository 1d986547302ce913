"""Point-to-point: send/recv/isend/irecv (data and bulk lanes), send_iov, wildcards, zero
copies into the caller's buffers, and the errors for unusable buffers."""

import threading
import time

import numpy as np
import pytest

import nexar
from conftest import SIZES, run_ranks


@pytest.mark.parametrize("n", [s for s in SIZES if s > 1])
@pytest.mark.parametrize("count", (0, 1, 7, 100003))
def test_ring_send_recv(worlds, n, count):
    """Each rank sends to the next and receives from the previous; blocking send on even
    ranks, isend on odd ones; the data lands in the caller's array."""
    def rank(c):
        right, left = (c.rank + 1) % n, (c.rank - 1) % n
        out = np.arange(count, dtype=np.float64) + c.rank
        into = np.zeros(count, np.float64)
        r = c.irecv(into, left, tag=5)
        if c.rank % 2:
            c.isend(out, right, tag=5).wait()
        else:
            c.send(out, right, tag=5)
        st = r.wait()
        assert (st.source, st.tag, st.bytes) == (left, 5, count * 8)
        assert r.status.source == left
        return into

    for r, into in enumerate(run_ranks(worlds[n], rank)):
        np.testing.assert_array_equal(into, np.arange(count, dtype=np.float64) + (r - 1) % n)


def test_wildcards_and_status(worlds):
    comms = worlds[3]

    def rank(c):
        if c.rank == 0:
            got = {}
            buf = np.zeros(4, np.int32)
            for _ in range(2):
                st = c.recv(buf, nexar.ANY_SOURCE, nexar.ANY_TAG)
                got[st.source] = (st.tag, buf.copy(), st.bytes)
            return got
        c.send(np.full(4, c.rank, np.int32), 0, tag=10 + c.rank)
        return None

    got = run_ranks(comms, rank)[0]
    assert sorted(got) == [1, 2]
    for src, (tag, buf, nbytes) in got.items():
        assert tag == 10 + src and nbytes == 16
        np.testing.assert_array_equal(buf, np.full(4, src, np.int32))


def test_buffer_kinds_and_bulk_lane(worlds):
    """bytes/bytearray/memoryview/numpy in, writable ones out; the bulk lane matches bulk
    receives only; send_iov sends the concatenation of its parts."""
    def rank(c):
        if c.rank == 0:
            c.send(b"hello", 1, tag=1)
            c.bulk_send(np.arange(5000, dtype=np.uint8), 1, tag=1)
            c.send_iov([b"ab", bytearray(b"cd"), memoryview(b"ef")], 1, tag=2)
            c.isend_iov([b"xy", b"z"], 1, tag=3).wait()
            return None
        small = bytearray(16)
        st = c.recv(small, 0, tag=1)
        big = np.zeros(5000, np.uint8)
        c.ibulk_recv(big, 0, tag=1).wait()
        iov = bytearray(6)
        c.recv(memoryview(iov), 0, tag=2)
        three = bytearray(3)
        c.irecv(three, 0, tag=3).wait()
        return bytes(small[:st.bytes]), big, bytes(iov), bytes(three)

    small, big, iov, three = run_ranks(worlds[2], rank)[1]
    assert small == b"hello"
    np.testing.assert_array_equal(big, np.arange(5000, dtype=np.uint8))
    assert iov == b"abcdef" and three == b"xyz"


def test_truncated_message(worlds):
    def rank(c):
        if c.rank == 0:
            c.send(np.zeros(10, np.float32), 1, tag=3)
            return None
        with pytest.raises(nexar.TruncatedError) as e:
            c.recv(np.zeros(2, np.float32), 0, tag=3)
        return e.value

    err = run_ranks(worlds[2], rank)[1]
    assert err.code == nexar.ErrorCode.TRUNCATED and "recv" in err.message


def test_partial_element_is_an_error(worlds):
    def rank(c):
        if c.rank == 0:
            c.send(b"123456", 1, tag=4)  # 6 bytes
            return None
        with pytest.raises(nexar.InvalidArgumentError, match="not a whole number of 4-byte"):
            c.recv(np.zeros(4, np.float32), 0, tag=4)
        return True

    run_ranks(worlds[2], rank)


@pytest.mark.parametrize("make,problem", [
    (lambda: np.zeros((4, 4), np.float32)[:, 0], "not contiguous"),
    (lambda: np.frombuffer(b"\0" * 16, np.float32), "read-only"),
    (lambda: b"\0" * 16, "read-only"),
], ids=("strided", "readonly_numpy", "bytes"))
def test_unusable_receive_buffers(worlds, make, problem):
    c = worlds[2][0]
    with pytest.raises(nexar.InvalidArgumentError, match=f"recv: data is {problem}"):
        c.recv(make(), 1)
    with pytest.raises(nexar.InvalidArgumentError, match=f"irecv: data is {problem}"):
        c.irecv(make(), 1)


def test_unusable_send_buffers(worlds):
    c = worlds[2][0]
    with pytest.raises(nexar.InvalidArgumentError, match="send: data is not contiguous"):
        c.send(np.arange(10.0)[::2], 1)
    with pytest.raises(TypeError, match="send: data must be a buffer"):
        c.send([1, 2, 3], 1)
    with pytest.raises(TypeError, match="send: data is None"):
        c.send(None, 1)
    with pytest.raises(nexar.InvalidArgumentError):
        c.send(b"x", 5)  # no rank 5: nexar's own check


def test_recv_releases_the_gil(worlds):
    """While one thread waits in recv, Python code on another keeps running."""
    c0, c1 = worlds[2]
    ticks = []
    buf = np.zeros(1, np.int64)

    def receiver():
        c1.recv(buf, 0, tag=77)

    t = threading.Thread(target=receiver)
    t.start()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        ticks.append(1)
    c0.send(np.array([42]), 1, tag=77)
    t.join(10)
    assert not t.is_alive() and buf[0] == 42
    assert len(ticks) > 1000


def test_dropped_request_keeps_its_buffer(worlds):
    """An irecv whose Request is dropped still completes into a buffer kept alive for it."""
    c0, c1 = worlds[2]
    target = np.zeros(1000, np.float32)
    view = memoryview(target)
    c1.irecv(view, 0, tag=88)  # Request dropped at once
    del view
    c0.send(np.ones(1000, np.float32), 1, tag=88)
    deadline = time.monotonic() + 10
    while target[-1] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    np.testing.assert_array_equal(target, np.ones(1000, np.float32))


def test_cancel_unmatched_receive(worlds):
    c = worlds[2][1]
    r = c.irecv(bytearray(8), 0, tag=99)
    assert not r.test()
    r.cancel()
    with pytest.raises(nexar.CancelledError):
        r.wait()
    assert isinstance(r.exception(), nexar.CancelledError)
