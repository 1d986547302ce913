"""Every collective of nexar.Communicator against NumPy references, at 1 to 4 ranks, with
random data, odd sizes, zero and one element, in place and out of place, blocking and
non-blocking; results must land in the caller's arrays and agree bitwise across ranks."""

import numpy as np
import pytest

import nexar
from conftest import SIZES, run_ranks

COUNTS = (0, 1, 7, 1031)
NUMPY_TYPES = (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.uint32,
               np.int64, np.uint64)
OPS = (nexar.SUM, nexar.PROD, nexar.MIN, nexar.MAX, nexar.AVG)


def values(rank, count, dtype, op=nexar.SUM, salt=0):
    """Random data for `rank`, in a range where the reduction cannot overflow."""
    rng = np.random.default_rng(1000 * rank + 17 * count + salt)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(-1, 1, count).astype(dt)
    if op == nexar.PROD:
        return rng.integers(1, 3, count).astype(dt)
    low = 0 if dt.kind == "u" else -4
    return rng.integers(low, 9, count).astype(dt)


def reference(arrays, op):
    stack = np.stack(arrays)
    acc = stack.astype(np.float64) if stack.dtype.kind == "f" else stack
    if op == nexar.SUM:
        r = acc.sum(axis=0)
    elif op == nexar.PROD:
        r = acc.prod(axis=0)
    elif op == nexar.MIN:
        r = acc.min(axis=0)
    elif op == nexar.MAX:
        r = acc.max(axis=0)
    else:
        r = acc.sum(axis=0) / len(arrays)
    return r.astype(arrays[0].dtype)


def close(got, want):
    if want.dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2,
                                   atol=1e-2)
    elif want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5 if want.dtype == np.float32 else 1e-12,
                                   atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def same_everywhere(results):
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes(), "results differ between ranks"


def call(comm, nonblocking, name, *args, **kw):
    """comm.<name>(...) or comm.i<name>(...).wait(): both forms must give the same."""
    if nonblocking:
        req = getattr(comm, "i" + name)(*args, **kw)
        assert isinstance(req, nexar.Request)
        return req.wait()
    return getattr(comm, name)(*args, **kw)


# ---- all_reduce ----------------------------------------------------------------------------

TYPE_OPS = [(t, op) for t in NUMPY_TYPES for op in OPS
            if op != nexar.AVG or np.dtype(t).kind == "f"]  # AVG is for floating types


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype,op", TYPE_OPS,
                         ids=[f"{np.dtype(t).name}-{op.name}" for t, op in TYPE_OPS])
def test_all_reduce_types_and_ops(worlds, n, dtype, op):
    inputs = [values(r, 37, dtype, op) for r in range(n)]

    def rank(c):
        x = inputs[c.rank].copy()
        assert c.all_reduce(x, op=op) is x
        return x

    results = run_ranks(worlds[n], rank)
    same_everywhere(results)
    close(results[0], reference(inputs, op))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS + (70001,))
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_all_reduce_sizes(worlds, n, count, in_place, nonblocking):
    inputs = [values(r, count, np.float32) for r in range(n)]

    def rank(c):
        x = inputs[c.rank].copy()
        if in_place:
            out = call(c, nonblocking, "all_reduce", x)
            assert out is x
            return x
        y = np.full(count, -7.0, np.float32)
        out = call(c, nonblocking, "all_reduce", x, y)
        assert out is y
        np.testing.assert_array_equal(x, inputs[c.rank])  # send is left alone
        return y

    results = run_ranks(worlds[n], rank)
    same_everywhere(results)
    close(results[0], reference(inputs, nexar.SUM))


# ---- broadcast, reduce ---------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_broadcast(worlds, n, count, nonblocking):
    root = n - 1
    data = values(root, count, np.int64)

    def rank(c):
        x = data.copy() if c.rank == root else np.zeros(count, np.int64)
        assert call(c, nonblocking, "broadcast", x, root=root) is x
        return x

    for x in run_ranks(worlds[n], rank):
        np.testing.assert_array_equal(x, data)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_reduce(worlds, n, count, in_place, nonblocking):
    root = n // 2
    inputs = [values(r, count, np.float64, salt=3) for r in range(n)]

    def rank(c):
        x = inputs[c.rank].copy()
        if in_place:
            out = call(c, nonblocking, "reduce", x, op=nexar.MAX, root=root)
            if c.rank == root:
                assert out is x
            else:
                assert out is None
                np.testing.assert_array_equal(x, inputs[c.rank])
            return x
        y = np.zeros(count, np.float64)
        out = call(c, nonblocking, "reduce", x, y, op=nexar.MAX, root=root)
        assert out is (y if c.rank == root else None)
        return y

    results = run_ranks(worlds[n], rank)
    close(results[root], reference(inputs, nexar.MAX))


# ---- all_gather, reduce_scatter, all_to_all ----------------------------------------------

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_all_gather(worlds, n, count, in_place, nonblocking):
    inputs = [values(r, count, np.int32) for r in range(n)]
    want = np.concatenate(inputs)

    def rank(c):
        if in_place:
            buf = np.zeros(n * count, np.int32)
            buf[c.rank * count:(c.rank + 1) * count] = inputs[c.rank]
            assert call(c, nonblocking, "all_gather", buf) is buf
            return buf
        y = np.zeros(n * count, np.int32)
        assert call(c, nonblocking, "all_gather", inputs[c.rank], y) is y
        return y

    for y in run_ranks(worlds[n], rank):
        np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_reduce_scatter(worlds, n, count, in_place, nonblocking):
    inputs = [values(r, count, np.float32, salt=5) for r in range(n)]
    total = reference(inputs, nexar.SUM)

    def rank(c):
        off, length = nexar.block_of(count, n, c.rank)
        x = inputs[c.rank].copy()
        if in_place:
            assert call(c, nonblocking, "reduce_scatter", x) is x
            # the block lands at its own position, the rest is left as it was
            np.testing.assert_array_equal(x[:off], inputs[c.rank][:off])
            np.testing.assert_array_equal(x[off + length:], inputs[c.rank][off + length:])
            return x[off:off + length].copy()
        y = np.zeros(length, np.float32)
        assert call(c, nonblocking, "reduce_scatter", x, y) is y
        return y

    results = run_ranks(worlds[n], rank)
    for r, y in enumerate(results):
        off, length = nexar.block_of(count, n, r)
        close(y, total[off:off + length])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", (0, 1, 5, 257))
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_all_to_all(worlds, n, block, in_place, nonblocking):
    inputs = [values(r, n * block, np.uint64) for r in range(n)]

    def rank(c):
        x = inputs[c.rank].copy()
        if in_place:
            assert call(c, nonblocking, "all_to_all", x) is x
            return x
        y = np.zeros(n * block, np.uint64)
        assert call(c, nonblocking, "all_to_all", x, y) is y
        return y

    for r, y in enumerate(run_ranks(worlds[n], rank)):
        want = np.concatenate([inputs[i][r * block:(r + 1) * block] for i in range(n)])
        np.testing.assert_array_equal(y, want)


# ---- gather, scatter ---------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_gather(worlds, n, count, in_place, nonblocking):
    root = n - 1
    inputs = [values(r, count, np.int8) for r in range(n)]

    def rank(c):
        if c.rank == root and in_place:
            buf = np.zeros(n * count, np.int8)
            buf[root * count:(root + 1) * count] = inputs[root]
            assert call(c, nonblocking, "gather", buf, root=root) is buf
            return buf
        y = np.zeros(n * count, np.int8) if c.rank == root else None
        out = call(c, nonblocking, "gather", inputs[c.rank], y, root=root)
        assert out is y
        return y

    results = run_ranks(worlds[n], rank)
    np.testing.assert_array_equal(results[root], np.concatenate(inputs))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_scatter(worlds, n, count, in_place, nonblocking):
    root = 0
    data = values(root, n * count, np.float64)

    def rank(c):
        send = data.copy() if c.rank == root else None
        if c.rank == root and in_place:
            assert call(c, nonblocking, "scatter", send, root=root) is send
            np.testing.assert_array_equal(send, data)
            return send[:count].copy()
        y = np.zeros(count, np.float64)
        assert call(c, nonblocking, "scatter", send, y, root=root) is y
        return y

    for r, y in enumerate(run_ranks(worlds[n], rank)):
        np.testing.assert_array_equal(y, data[r * count:(r + 1) * count])


# ---- scans -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("exclusive", (False, True), ids=("scan", "exclusive_scan"))
@pytest.mark.parametrize("in_place", (True, False), ids=("in_place", "out_of_place"))
def test_scans(worlds, n, count, exclusive, in_place):
    inputs = [values(r, count, np.int64) for r in range(n)]
    name = "exclusive_scan" if exclusive else "scan"

    def rank(c):
        x = inputs[c.rank].copy()
        if in_place:
            assert getattr(c, name)(x) is x
            return x
        y = np.full(count, 99, np.int64)
        assert call(c, c.rank % 2 == 1, name, x, y) is y
        return y

    results = run_ranks(worlds[n], rank)
    for r, y in enumerate(results):
        if exclusive and r == 0:
            want = inputs[0] if in_place else np.full(count, 99, np.int64)  # left unchanged
        else:
            upto = r if exclusive else r + 1
            want = np.sum(inputs[:upto], axis=0).astype(np.int64)
        np.testing.assert_array_equal(y, want)


# ---- variable-size forms -----------------------------------------------------------------

def var_counts(n):
    return [(3 * i + 1) % 5 for i in range(n)]  # includes zero for n >= 4


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_all_gather_v(worlds, n, nonblocking):
    counts = var_counts(n)
    inputs = [values(r, counts[r], np.float32) for r in range(n)]

    def rank(c):
        y = np.zeros(sum(counts), np.float32)
        assert call(c, nonblocking, "all_gather_v", inputs[c.rank], y, counts) is y
        return y

    for y in run_ranks(worlds[n], rank):
        np.testing.assert_array_equal(y, np.concatenate(inputs))


@pytest.mark.parametrize("n", SIZES)
def test_gather_v_and_scatter_v(worlds, n):
    counts = var_counts(n)
    displs = [int(d) * 2 for d in np.cumsum([0] + counts[:-1])]  # with gaps
    root = n - 1
    inputs = [values(r, counts[r], np.int32) for r in range(n)]
    extent = displs[-1] + counts[-1]

    def rank(c):
        if c.rank == root:
            y = np.full(extent, -1, np.int32)
            assert c.gather_v(inputs[c.rank], y, counts, displs, root=root) is y
        else:
            y = None
            assert c.gather_v(inputs[c.rank], root=root) is None  # counts at the root only
        back = np.zeros(counts[c.rank], np.int32)
        c.scatter_v(y, counts if c.rank == root else None, back, displs, root=root)
        return y, back

    results = run_ranks(worlds[n], rank)
    gathered = results[root][0]
    for r in range(n):
        np.testing.assert_array_equal(gathered[displs[r]:displs[r] + counts[r]], inputs[r])
        np.testing.assert_array_equal(results[r][1], inputs[r])


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_v(worlds, n):
    # rank i sends (i + j) % 3 elements to rank j
    send_counts = [[(i + j) % 3 for j in range(n)] for i in range(n)]
    inputs = [values(i, sum(send_counts[i]), np.float64) for i in range(n)]

    def rank(c):
        i = c.rank
        recv_counts = [send_counts[j][i] for j in range(n)]
        y = np.zeros(sum(recv_counts), np.float64)
        assert c.all_to_all_v(inputs[i], send_counts[i], y, recv_counts) is y
        return y

    results = run_ranks(worlds[n], rank)
    for i, y in enumerate(results):
        parts = []
        for j in range(n):
            start = sum(send_counts[j][:i])
            parts.append(inputs[j][start:start + send_counts[j][i]])
        np.testing.assert_array_equal(y, np.concatenate(parts))


# ---- fused forms -------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("nonblocking", (False, True), ids=("blocking", "nonblocking"))
def test_all_reduce_bucketed(worlds, n, nonblocking):
    sizes = (0, 3, 1031, 1)
    inputs = [[values(r, s, np.float32, salt=s) for s in sizes] for r in range(n)]

    def rank(c):
        bufs = [a.copy() for a in inputs[c.rank]]
        out = call(c, nonblocking, "all_reduce_bucketed", bufs)
        assert out is bufs
        return bufs

    results = run_ranks(worlds[n], rank)
    for k in range(len(sizes)):
        close(results[0][k], reference([inputs[r][k] for r in range(n)], nexar.SUM))


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_sharded(worlds, n):
    count = 1031
    inputs = [values(r, count, np.float64) for r in range(n)]
    total = reference(inputs, nexar.SUM)

    def rank(c):
        off, length = nexar.block_of(count, n, c.rank)
        y = np.zeros(count)
        shard = np.zeros(length)
        c.all_reduce_sharded(inputs[c.rank], y, shard)
        only = np.zeros(length)
        c.all_reduce_sharded(inputs[c.rank], None, only)  # reduce-scatter only
        return y, shard, only, off, length

    for y, shard, only, off, length in run_ranks(worlds[n], rank):
        close(y, total)
        close(shard, total[off:off + length])
        close(only, total[off:off + length])


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_compressed(worlds, n):
    count = 100
    inputs = [values(r, count, np.float32) for r in range(n)]

    def rank(c):
        full = nexar.ErrorFeedback(nexar.CompressionKind.TOP_K, ratio=1.0)
        x = inputs[c.rank].copy()
        c.all_reduce_compressed(x, full)  # ratio 1: everything is sent
        sparse = nexar.ErrorFeedback(nexar.CompressionKind.RANDOM_K, ratio=0.1, seed=3)
        z = inputs[c.rank].copy()
        c.all_reduce_compressed(z, sparse)
        return x, z, full.steps, len(sparse.residual)

    results = run_ranks(worlds[n], rank)
    close(results[0][0], reference(inputs, nexar.SUM))
    same_everywhere([r[1] for r in results])
    assert results[0][2] == 1
    assert results[0][3] == count * 4  # residual of a float32 tensor
    assert np.count_nonzero(results[0][1]) <= 10  # random_k: ceil(0.1 * 100) positions


# ---- barrier -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
def test_barrier(worlds, n):
    def rank(c):
        c.barrier()
        assert c.ibarrier().wait() is None
        return True

    assert all(run_ranks(worlds[n], rank))


# ---- types from other exporters ----------------------------------------------------------

@pytest.mark.parametrize("n", (2, 3))
def test_bytes_like_objects_and_dtype_override(worlds, n):
    """bytearray and memoryview work; dtype= reinterprets untyped bytes."""
    inputs = [values(r, 9, np.float32) for r in range(n)]

    def rank(c):
        raw = bytearray(inputs[c.rank].tobytes())
        c.all_reduce(raw, dtype=nexar.DataType.FLOAT32 if c.rank else "float32")
        mv = memoryview(bytearray(inputs[c.rank].tobytes())).cast("f")
        c.all_reduce(mv)  # typed memoryview: float32 from its format
        return np.frombuffer(raw, np.float32), np.frombuffer(mv, np.float32)

    for a, b in run_ranks(worlds[n], rank):
        close(a, reference(inputs, nexar.SUM))
        close(b, reference(inputs, nexar.SUM))


@pytest.mark.parametrize("n", (2, 4))
def test_types_without_a_datatype_move_as_bytes(worlds, n):
    """int16 and complex cannot be reduced, but collectives that only move data take them."""
    data = (np.arange(11) - 5).astype(np.int16)

    def rank(c):
        x = data.copy() if c.rank == 0 else np.zeros(11, np.int16)
        c.broadcast(x, root=0)
        z = np.full(2, c.rank + 1j, np.complex64)
        y = np.zeros(2 * n, np.complex64)
        c.all_gather(z, y)
        counts = [1] * n
        v = np.zeros(n, np.int16)
        c.all_gather_v(np.array([c.rank], np.int16), v, counts)
        return x, y, v

    for x, y, v in run_ranks(worlds[n], rank):
        np.testing.assert_array_equal(x, data)
        np.testing.assert_array_equal(y, np.repeat(np.arange(n) + 1j, 2).astype(np.complex64))
        np.testing.assert_array_equal(v, np.arange(n, dtype=np.int16))
