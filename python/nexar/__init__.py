"""nexar: point-to-point messaging, RPC and collectives between processes over QUIC.

Make a communicator, then call it from every rank::

    import numpy as np
    import nexar

    comm = nexar.init()                 # one rank of a job launched by nexar-run, torchrun,
                                        # mpirun or srun (nexar.bootstrap_local(n) gives n
                                        # ranks in this process, for tests)
    x = np.ones(1 << 20, dtype=np.float32)
    comm.all_reduce(x)                  # in place, on every rank
    req = comm.iall_reduce(x, op=nexar.MAX)
    req.wait()

Buffers are any object with the buffer protocol (NumPy arrays, bytearray, memoryview) or
CPU torch tensors (through DLPack; torch is not imported by this package). Nothing is
copied: results land in the caller's memory, which must be C-contiguous, and writable
where results go. Element types come from the buffers; ``dtype=`` reinterprets them.

Blocking calls release the GIL while they wait; RPC handlers and failure callbacks take
it when they run. Every error is a ``nexar.Error`` (with ``code`` and ``message``).
``import nexar.torch`` registers the torch.distributed backend "nexar".
"""

from __future__ import annotations

import atexit as _atexit
import weakref as _weakref
from typing import Iterable, List, Optional, Sequence

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    ANY_SOURCE,
    ANY_TAG,
    MAX_TAG,
    Agreement,
    Algorithm,
    CancelledError,
    ClosedError,
    Communicator,
    CompressionKind,
    Config,
    Congestion,
    DataType,
    Error,
    ErrorCode,
    ErrorFeedback,
    FailurePolicy,
    InvalidArgumentError,
    IoError,
    LinkKind,
    LogLevel,
    PeerClosedError,
    PeerError,
    PeerFailedError,
    ProtocolError,
    RankFailedError,
    ReduceOp,
    RejectedError,
    Request,
    RevokedError,
    RpcCall,
    RpcError,
    RpcFailedError,
    Seed,
    Status,
    TcpCipher,
    TimeoutError,
    TlsError,
    TruncatedError,
    Tuning,
    UnknownRpcError,
    block_of,
    dtype_of,
    launched_from_env,
    parse_dtype,
    read_token_file,
    size_of,
    token_from_env,
)

__version__ = "0.1.0"

# Shorthands, as torch.distributed has them.
SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX
AVG = ReduceOp.AVG

# World communicators made through this module, closed at exit: closing stops nexar's
# threads (RPC handlers among them) before the interpreter goes away under them.
_worlds: "_weakref.WeakSet[Communicator]" = _weakref.WeakSet()


def _track(comm: Optional[Communicator]) -> Optional[Communicator]:
    if comm is not None:
        _worlds.add(comm)
    return comm


@_atexit.register
def _close_worlds() -> None:
    for comm in list(_worlds):
        try:
            comm.close()
        except Error:
            pass


def init(config: Optional[Config] = None) -> Communicator:
    """Joins the job this process was launched into and returns its world communicator.

    The environment says where the job is: ``nexar-run`` (NEXAR_* variables), torchrun
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI, PMI or Slurm; docs/CONFIG.md
    lists every variable. Under torchrun rank 0 runs nexar's seed on MASTER_PORT, so a
    program that also calls ``torch.distributed.init_process_group`` with ``env://`` must
    give nexar another port (NEXAR_SEED_PORT); ``import nexar.torch`` and backend "nexar"
    avoid that. ``config`` defaults to ``Config.from_env()``.
    """
    return _track(_core.join_from_env(config))


def join_from_env(config: Optional[Config] = None) -> Communicator:
    """Same as :func:`init`."""
    return init(config)


def join(seed: str, token: str, **options) -> Communicator:
    """Joins a cluster through its seed (``"host:port"``) with the cluster token.

    Keyword options: rank (-1: any), world (0: any), seed_fingerprint, seed_ca_pem, bind,
    advertise, ifname, join_timeout (seconds), config.
    """
    return _track(_core.join(seed, token, **options))


def bootstrap_local(n: int, config: Optional[Config] = None) -> List[Communicator]:
    """Returns ``n`` communicators (ranks 0..n-1) in this process, connected over real QUIC on
    127.0.0.1: for tests and single-process programs. Collectives need every rank to call
    them, so run each rank on a thread of its own (the calls release the GIL)."""
    comms = _core.bootstrap_local(n, config)
    for c in comms:
        _track(c)
    return comms


def wait_all(requests: Iterable[Request]) -> list:
    """Waits for every request (in order) and returns their results."""
    return [r.wait() for r in requests]


def test_all(requests: Sequence[Request]) -> bool:
    """True when every request has completed (never blocks)."""
    return all(r.test() for r in requests)


__all__ = [
    n
    for n in dir()
    if not n.startswith("_") and n not in ("annotations", "Iterable", "List", "Optional", "Sequence")
]
