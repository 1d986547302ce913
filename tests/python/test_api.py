"""The package's surface: errors (classes, code, message), buffer checks of collectives,
dtypes, requests, split, close and context managers, Config, Seed + join."""

import pathlib
import re
import threading
import time

import numpy as np
import pytest

import nexar
from conftest import SIZES, run_ranks, short_config


def test_error_hierarchy():
    assert issubclass(nexar.InvalidArgumentError, nexar.Error)
    assert issubclass(nexar.InvalidArgumentError, ValueError)
    assert issubclass(nexar.TimeoutError, TimeoutError)
    assert issubclass(nexar.PeerFailedError, nexar.PeerError)
    assert issubclass(nexar.RpcFailedError, nexar.RpcError)
    assert issubclass(nexar.RankFailedError, nexar.Error)


def test_error_carries_code_and_message(worlds):
    c = worlds[2][0]
    with pytest.raises(nexar.Error) as e:
        c.send(b"x", 7)
    assert e.value.code == nexar.ErrorCode.INVALID_ARGUMENT
    assert e.value.message == str(e.value) and "send" in e.value.message
    assert e.value.failed_ranks == []


@pytest.mark.parametrize("call,problem", [
    (lambda c: c.all_reduce(np.zeros(8, np.float32), np.zeros((4, 4), np.float32)[:, 0]),
     "all_reduce: recv is not contiguous"),
    (lambda c: c.all_reduce(np.zeros(8, np.float32), np.frombuffer(bytes(32), np.float32)),
     "all_reduce: recv is read-only"),
    (lambda c: c.all_reduce(b"\0" * 8, dtype="float32"), "all_reduce: data is read-only"),
    (lambda c: c.all_reduce(np.zeros(8, np.float32), np.zeros(3, np.float32)),
     "all_reduce: recv holds 3 elements, 8 needed"),
    (lambda c: c.all_reduce(np.zeros(8, np.float32), np.zeros(8, np.float64)),
     "all_reduce: send holds float32 but recv holds float64"),
    (lambda c: c.all_reduce(np.zeros(8, np.int16)), "all_reduce: data holds int16, which nexar"
                                                     " cannot reduce"),
    (lambda c: c.all_gather(np.zeros(4, np.float32), np.zeros(7, np.float32)),
     "all_gather: recv holds 7 elements, 8 needed"),
    (lambda c: c.all_to_all(np.zeros(5, np.float32)), "all_to_all: data holds 5 elements, not 2"
                                                       " equal blocks"),
    (lambda c: c.broadcast(np.zeros(4)[::2], root=0), "broadcast: data is not contiguous"),
    (lambda c: c.all_reduce(bytearray(6), dtype="float32"),
     "all_reduce: send holds 6 bytes, not a whole number of float32"),
    (lambda c: c.iall_reduce(np.zeros(8, np.int32), op=nexar.AVG), "avg"),
], ids=("strided_out", "readonly_out", "readonly_inplace", "too_small", "mixed_types",
        "int16_reduce", "gather_small", "uneven_blocks", "strided_bcast", "partial", "avg_int"))
def test_collective_argument_errors(worlds, call, problem):
    """Bad buffers are refused before anything starts (so one rank alone may try), with a
    message naming the operation and the argument."""
    with pytest.raises(nexar.InvalidArgumentError) as e:
        call(worlds[2][0])
    assert problem in str(e.value)


def test_wrong_types():
    c = nexar.bootstrap_local(1)[0]
    with pytest.raises(TypeError, match="all_reduce: data must be a buffer"):
        c.all_reduce([1.0, 2.0])
    with pytest.raises(nexar.InvalidArgumentError, match="unknown dtype 'float128x'"):
        c.all_reduce(bytearray(8), dtype="float128x")
    c.close()


def test_dtypes():
    assert nexar.dtype_of(np.zeros(1, np.float16)) == nexar.DataType.FLOAT16
    assert nexar.dtype_of(np.zeros(1, np.uint64)) == nexar.DataType.UINT64
    assert nexar.dtype_of(bytearray(1)) == nexar.DataType.UINT8
    assert nexar.dtype_of(np.zeros(1, np.int16)) is None
    assert nexar.parse_dtype(np.float32) == nexar.DataType.FLOAT32
    assert nexar.parse_dtype(np.dtype("int64")) == nexar.DataType.INT64
    assert nexar.parse_dtype("bf16") == nexar.DataType.BFLOAT16
    assert nexar.size_of(nexar.DataType.BFLOAT16) == 2
    assert nexar.block_of(10, 4, 1) == (3, 3) and nexar.block_of(10, 4, 3) == (8, 2)


def test_requests(worlds):
    c0, c1 = worlds[2]
    r = c1.irecv(bytearray(4), 0, tag=12)
    assert not r.test() and not r.wait_for(0.01)
    assert "running" in repr(r)
    c0.send(b"abcd", 1, tag=12)
    assert r.wait_for(10) and r.test()
    assert r.exception() is None
    st = r.wait()
    assert st.bytes == 4 and "Status(source=0" in repr(st)
    reqs = [c0.isend(b"z", 1, tag=13), c1.irecv(bytearray(1), 0, tag=13)]
    assert [s.bytes for s in nexar.wait_all(reqs)] == [1, 1]
    assert nexar.test_all(reqs)


@pytest.mark.parametrize("n", (2, 3, 4))
def test_split(worlds, n):
    def rank(c):
        sub = c.split(c.rank % 2, key=-c.rank)  # reversed order inside each half
        x = np.array([c.rank], np.int64)
        sub.all_reduce(x)
        none = c.split(-1)
        return sub.rank, sub.size, int(x[0]), none

    for r, (srank, ssize, total, none) in enumerate(run_ranks(worlds[n], rank)):
        members = [m for m in range(n) if m % 2 == r % 2]
        assert ssize == len(members)
        assert srank == sorted(members, reverse=True).index(r)
        assert total == sum(members)
        assert none is None


def test_close_and_context_manager():
    comms = nexar.bootstrap_local(2, short_config())
    with comms[0] as c0, comms[1] as c1:
        assert c0.is_open and c0.rank == 0 and c1.size == 2
        assert "rank 0 of 2" in repr(c0)
    assert not c0.is_open and "closed" in repr(c0)
    with pytest.raises(nexar.ClosedError):
        c0.barrier()


def test_config():
    c = nexar.Config(op_timeout=12.5, spin=0, rpc_threads=4)
    assert c.op_timeout.total_seconds() == 12.5 and c.spin.total_seconds() == 0
    assert c.rpc_threads == 4 and "op_timeout" in c.describe()
    c.failure_timeout = 2
    assert c.failure_timeout.total_seconds() == 2
    assert c.bulk_scavenger
    c.bulk_scavenger = False
    assert "bulk_scavenger = off" in c.describe()
    assert c.congestion == nexar.Congestion.CUBIC
    c.congestion = nexar.Congestion.BBR
    assert "congestion = bbr" in c.describe()
    assert c.link == nexar.LinkKind.QUIC and c.tcp_cipher == nexar.TcpCipher.TLS
    c.link = nexar.LinkKind.TCP
    c.tcp_cipher = nexar.TcpCipher.NONE
    assert "link = tcp" in c.describe() and "tcp_cipher = none" in c.describe()
    assert c.connections_per_peer == 4
    c.connections_per_peer = 2
    assert "connections_per_peer = 2" in c.describe()
    assert c.engine_threads == 1
    c.engine_threads = 3
    assert "engine_threads = 3" in c.describe()
    with pytest.raises(TypeError):
        c.op_timeout = "soon"
    c.rpc_threads = 0
    with pytest.raises(nexar.InvalidArgumentError):
        c.validate()


@pytest.mark.parametrize("field,var,good,shown,bad,problem", [
    ("topology", "NEXAR_TOPOLOGY", "k_regular:4", "k_regular:4", "ring", "topology 'ring'"),
    ("topology", "NEXAR_TOPOLOGY", "HyperCube", "hypercube", "k_regular:3",
     "topology 'k_regular:3'"),
    ("shm_ring_bytes", "NEXAR_SHM_RING_BYTES", 4 << 20, "4 MiB", 3 << 20,
     "Config::shm_ring_bytes = 3 MiB (NEXAR_SHM_RING_BYTES) is out of range"),
    ("shm_collective_bytes", "NEXAR_SHM_COLLECTIVE_BYTES", 0, "0 bytes", (1 << 30) + 1,
     "Config::shm_collective_bytes = 1073741825 bytes (NEXAR_SHM_COLLECTIVE_BYTES)"),
    ("relay_hop_limit", "NEXAR_RELAY_HOPS", 7, "7", 256,
     "Config::relay_hop_limit = 256 (NEXAR_RELAY_HOPS) is out of range"),
    ("relay_window", "NEXAR_RELAY_WINDOW_BYTES", 64 << 10, "64 KiB", 32 << 10,
     "Config::relay_window = 32 KiB (NEXAR_RELAY_WINDOW_BYTES) is out of range"),
], ids=("topology", "topology_case", "shm_ring", "shm_collective", "relay_hops", "relay_window"))
def test_config_topology_shm_relay(monkeypatch, field, var, good, shown, bad, problem):
    """Set from Python, a field reads back as set (topology in its canonical text), shows in
    describe(), means what its variable means, and a bad value raises naming the field:
    topology at once (its text is parsed), the others in validate() as every field."""
    c = nexar.Config(**{field: good})
    want = shown if field == "topology" else good
    assert getattr(c, field) == want
    assert f"{field} = {shown}" in c.describe()
    c.validate()
    monkeypatch.setenv(var, str(good))
    assert getattr(nexar.Config.from_env(), field) == want
    with pytest.raises(nexar.InvalidArgumentError, match=re.escape(problem)):
        setattr(c, field, bad)
        c.validate()


def test_config_topology_reaches_the_world():
    cfg = short_config()
    cfg.topology = "k_regular:2"
    cfg.relay_hop_limit = 3
    comms = nexar.bootstrap_local(4, cfg)
    assert [c.neighbours() for c in comms] == [[1, 3], [0, 2], [1, 3], [0, 2]]
    assert run_ranks(comms, lambda c: int(c.all_reduce(np.array([c.rank]))[0])) == [6] * 4
    for c in comms:
        c.close()


INCLUDE = pathlib.Path(__file__).resolve().parents[2] / "include" / "nexar"

# Fields of the C++ nexar::Config that nexar.Config leaves out on purpose, each with its
# reason. Empty: Python has every one (tuning.impair, meant for tests, included).
NOT_IN_PYTHON = {}


def cpp_struct_fields(header, struct):
    """The data members of `struct <struct>` in include/nexar/<header>, in order."""
    text = (INCLUDE / header).read_text()
    body = text[text.index(f"\nstruct {struct} {{"):]
    body = body[:body.index("\n};")]
    return re.findall(r"^  (?!static\b)[A-Za-z_][\w:<>, ]*?\s+(\w+)\s*(?:\{.*\}|=.*)?;$", body,
                      re.M)


def cpp_config_fields():
    """Config's settings as describe() names them: Config's own fields, and Tuning's as
    "tuning.<field>"."""
    cpp = [f for f in cpp_struct_fields("config.hpp", "Config") if f != "tuning"]
    return cpp + ["tuning." + f for f in cpp_struct_fields("tuning.hpp", "Tuning")]


def python_fields(cls):
    return {n for n, v in vars(cls).items() if isinstance(v, property)}


def test_config_has_every_cpp_field():
    """nexar.Config drifts from nexar::Config: a field added in C++ must be bound (or listed
    in NOT_IN_PYTHON with a reason), and a bound one must still exist in C++."""
    cpp = cpp_config_fields()
    assert "op_timeout" in cpp and "log_level" in cpp and "tuning.segment_bytes" in cpp, cpp
    assert len(cpp) == len(set(cpp)), cpp
    # The parse agrees with what C++ itself lists: describe() names every setting of the
    # table (the text ones, tuning.impair and trace, only when set).
    cfg = nexar.Config(tuning=nexar.Tuning(impair="seed=1"), trace="/tmp/t")
    described = [line.split(" = ")[0] for line in cfg.describe().splitlines()]
    assert sorted(described) == sorted(cpp), "describe() and the C++ structs disagree"
    py = python_fields(nexar.Config) - {"tuning"}
    py |= {"tuning." + f for f in python_fields(nexar.Tuning)}
    assert set(NOT_IN_PYTHON) <= set(cpp), "NOT_IN_PYTHON names fields C++ no longer has"
    missing = [f for f in cpp if f not in py and f not in NOT_IN_PYTHON]
    assert not missing, f"nexar::Config fields missing from nexar.Config: {missing}"
    assert py <= set(cpp), f"nexar.Config fields C++ does not have: {sorted(py - set(cpp))}"


def test_tuning_is_set_in_place_and_reaches_describe():
    """cfg.tuning.X = v changes that Config's setting (not a copy), and validate() names it
    tuning.<field>."""
    cfg = nexar.Config()
    cfg.tuning.segment_bytes = 64 << 10
    assert cfg.tuning.segment_bytes == 64 << 10
    assert cfg.describe(all=False) == "tuning.segment_bytes = 64 KiB"
    cfg.tuning.segment_bytes = 1024  # below the 4 KiB minimum
    with pytest.raises(nexar.InvalidArgumentError, match="tuning.segment_bytes"):
        cfg.validate()
    assert nexar.Config(tuning=nexar.Tuning(broadcast_chain_bytes=0)).tuning.broadcast_chain_bytes == 0


def test_seed_and_join():
    """The library's seed and join(): a 3-rank cluster of this process's threads."""
    with nexar.Seed("127.0.0.1:0", 3) as seed:
        comms = [None] * 3

        def joiner(r):
            comms[r] = nexar.join(seed.address, seed.token, rank=r, world=3,
                                  config=short_config())

        threads = [threading.Thread(target=joiner, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        assert seed.wait(30) == 3
        for t in threads:
            t.join(30)
    assert [c.rank for c in comms] == [0, 1, 2]
    totals = run_ranks(comms, lambda c: int(c.all_reduce(np.array([c.rank + 1]))[0]))
    assert totals == [6, 6, 6]
    for c in comms:
        c.close()


def test_failure_api_on_healthy_world(worlds):
    cfg = short_config()
    cfg.on_failure = nexar.FailurePolicy.MANUAL  # agree() and shrink() refuse under ABORT
    comms = nexar.bootstrap_local(3, cfg)

    def rank(c):
        a = c.agree(0b1111 if c.rank else 0b0110)
        smaller = c.shrink()
        return c.world_ranks(), c.failed_ranks(), c.is_revoked(), a.value, a.failed, smaller.size

    for world, failed, revoked, value, afailed, size in run_ranks(comms, rank):
        assert world == [0, 1, 2] and failed == [] and not revoked
        assert value == 0b0110 and afailed == [] and size == 3
    with pytest.raises(nexar.InvalidArgumentError, match="failure policy is abort"):
        worlds[1][0].agree()
    for c in comms:
        c.close()


def test_sizes_exist():
    assert SIZES == (1, 2, 3, 4)


def test_lazy_connections():
    # A full mesh connected on first use: nothing at start, then what the ranks used.
    cfg = short_config()
    cfg.lazy_connect = True
    cfg.shm = False
    comms = nexar.bootstrap_local(4, cfg)
    assert [c.connected_peers() for c in comms] == [[], [], [], []]
    assert [c.neighbours() for c in comms] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]

    def pair(c):
        # 0 <-> 1 and 2 <-> 3 only.
        peer = c.rank ^ 1
        out = np.full(7, c.rank, dtype=np.int32)
        got = np.zeros(7, dtype=np.int32)
        req = c.isend(out, peer, tag=4)
        c.recv(got, peer, tag=4)
        req.wait()
        return int(got[0])

    assert run_ranks(comms, pair) == [1, 0, 3, 2]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and [c.connected_peers() for c in comms] != [[1], [0], [3], [2]]:
        time.sleep(0.01)
    assert [c.connected_peers() for c in comms] == [[1], [0], [3], [2]]
    for c in comms:
        c.close()
