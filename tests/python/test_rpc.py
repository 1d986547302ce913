"""RPC with Python callables: replies, concurrency, exceptions raised by handlers reaching
the caller, unknown functions, timeouts."""

import threading

import numpy as np
import pytest

import nexar
from conftest import SIZES, run_ranks


@pytest.mark.parametrize("n", SIZES)
def test_every_rank_calls_every_rank(worlds, n):
    comms = worlds[n]
    for c in comms:
        me = c.rank
        c.register_rpc(1, lambda caller, args, me=me: f"{me}<-{caller}:".encode() + args)

    def rank(c):
        c.barrier()  # every handler is registered
        replies = [c.rpc(d, 1, f"x{d}".encode()) for d in range(n)]
        calls = [c.rpc_async(d, 1, np.array([d], np.int8)) for d in range(n)]
        more = [call.wait() for call in calls]
        c.barrier()  # nobody unregisters while others still call
        return replies, more

    for r, (replies, more) in enumerate(run_ranks(comms, rank)):
        assert replies == [f"{d}<-{r}:x{d}".encode() for d in range(n)]
        assert more == [f"{d}<-{r}:".encode() + bytes([d]) for d in range(n)]
    for c in comms:
        c.unregister_rpc(1)


def test_python_exception_reaches_the_caller(worlds):
    c0, c1 = worlds[2]

    def handler(caller, args):
        raise ValueError(f"bad input {args!r} from {caller}")

    c1.register_rpc(2, handler)
    try:
        with pytest.raises(nexar.RpcFailedError) as e:
            c0.rpc(1, 2, b"abc")
        assert isinstance(e.value, nexar.RpcError) and isinstance(e.value, nexar.Error)
        assert e.value.code == nexar.ErrorCode.RPC_FAILED
        assert "ValueError: bad input b'abc' from 0" in e.value.message
        with pytest.raises(nexar.RpcFailedError, match="ValueError"):
            c0.rpc_async(1, 2).wait()
    finally:
        c1.unregister_rpc(2)


def test_bad_reply_type_is_an_error(worlds):
    c0, c1 = worlds[2]
    c1.register_rpc(3, lambda caller, args: 12345)
    try:
        with pytest.raises(nexar.RpcFailedError, match="must be a buffer"):
            c0.rpc(1, 3)
    finally:
        c1.unregister_rpc(3)


def test_none_reply_is_empty(worlds):
    c0, c1 = worlds[2]
    c1.register_rpc(4, lambda caller, args: None)
    try:
        assert c0.rpc(1, 4) == b""
    finally:
        c1.unregister_rpc(4)


def test_unknown_function(worlds):
    c0 = worlds[2][0]
    with pytest.raises(nexar.UnknownRpcError):
        c0.rpc(1, 4242)


def test_timeout(worlds):
    c0, c1 = worlds[2]
    release = threading.Event()

    def slow(caller, args):
        release.wait(5)
        return b"late"

    c1.register_rpc(5, slow)
    try:
        with pytest.raises(nexar.TimeoutError) as e:
            c0.rpc(1, 5, timeout=0.2)
        assert isinstance(e.value, TimeoutError)  # also the builtin TimeoutError
    finally:
        release.set()
        c1.unregister_rpc(5)


def test_handlers_run_concurrently_with_python(worlds):
    """A handler calling back into its caller (nested RPC) works: the GIL is released while
    either side waits."""
    c0, c1 = worlds[2]
    c0.register_rpc(6, lambda caller, args: b"pong")
    c1.register_rpc(7, lambda caller, args: c1.rpc(caller, 6) + b"!")
    try:
        assert c0.rpc(1, 7) == b"pong!"
    finally:
        c0.unregister_rpc(6)
        c1.unregister_rpc(7)
