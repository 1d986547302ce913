"""torch.distributed backend "nexar".

``import nexar.torch`` registers the backend; then, under torchrun or nexar-run::

    import torch.distributed as dist
    import nexar.torch  # noqa: F401

    dist.init_process_group("nexar")    # env:// as usual
    model = torch.nn.parallel.DistributedDataParallel(model)

How the ranks find each other:

* **torchrun** (or any ``env://``, ``tcp://`` or ``file://`` rendezvous): torch's store
  carries the rendezvous. The group's rank 0 starts a nexar seed on a free port and
  publishes its address and a fresh cluster token in the store; every rank joins through
  it. The seed host is ``MASTER_ADDR`` (127.0.0.1 without it). The token travels through
  torch's store, so it is as private as that store.
* **nexar-run** (no RANK or MASTER_ADDR, but NEXAR_SEED_ADDR): ``env://`` is taken over by
  nexar's own launch variables: the world joins as ``nexar.init()`` does, rank 0 opens a
  torch TCPStore on a free port and broadcasts it over nexar. ``init_method="nexar://"``
  does the same explicitly, under any launcher ``nexar.init()`` understands.

Every process group (the default one and each ``new_group``) gets its own nexar
communicator. Tensors must be CPU tensors; a device tensor gets a clear error. When a rank
dies, operations of the others raise (RuntimeError naming the failed rank) within
NEXAR_FAILURE_TIMEOUT_MS (3 s) instead of hanging.

Timeouts are torch's: ``init_process_group(timeout=...)`` and ``new_group(timeout=...)``
set a group's, an operation's own option overrides it, and an operation that cannot
complete raises within it (plus about a second) with "Timed out" in its message, naming the
rank it waited for. Sparse COO tensors all-reduce with SUM, as with Gloo.
``monitored_barrier`` below stands in for torch's, which torch 1.13 keeps to Gloo.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
from typing import Optional, Sequence

import torch.distributed as dist
from torch.distributed import TCPStore

# The module, not torch.distributed.rendezvous() (the function of the same name).
_rendezvous_module = importlib.import_module("torch.distributed.rendezvous")

from . import _core

try:
    from ._torch import ProcessGroupNexar
except ImportError as e:  # pragma: no cover - depends on how nexar was built
    raise ImportError(
        "nexar.torch: the torch backend module (nexar._torch) is missing or does not match "
        "this torch; it is built when CMake finds libtorch and the compiler is GCC"
    ) from e

BACKEND = "nexar"

__all__ = ["BACKEND", "ProcessGroupNexar", "create_process_group", "monitored_barrier"]

# A world communicator joined by the nexar:// rendezvous, waiting for the backend creator of
# the default group (same rank and size), which takes it instead of joining a second time.
_pending_world: Optional[_core.Communicator] = None


def _config() -> _core.Config:
    """Config.from_env(), tuned like nexar.init() for more local ranks than cores.

    join_from_env() applies this itself; the store-based join below uses nexar.join(),
    which does not read the launcher's variables, so the same rule is repeated here."""
    cfg = _core.Config.from_env()
    local = os.environ.get("NEXAR_LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_WORLD_SIZE")
    tuned = "NEXAR_SPIN_US" in os.environ or "NEXAR_YIELD_WHEN_IDLE" in os.environ
    if local and local.isdigit() and int(local) > len(os.sched_getaffinity(0)) and not tuned:
        cfg.spin = 0.001
        cfg.yield_when_idle = True
    return cfg


def _route_address(host: str) -> str:
    """This host's address on its route to `host` (no packet is sent)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _advertised_host() -> str:
    """Where the other ranks can reach this one (rank 0): MASTER_ADDR when set, else the
    address on the route to nexar's seed, else loopback."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        return master
    seed = os.environ.get("NEXAR_SEED_ADDR", "")
    host = seed.rsplit(":", 1)[0].strip("[]") if ":" in seed else seed
    if not host or host in ("localhost", "::1") or host.startswith("127."):
        return "127.0.0.1"
    return _route_address(host)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _join_through_store(store, rank: int, size: int, timeout: datetime.timedelta):
    """Forms a nexar communicator of `size` ranks, with the rendezvous in torch's store."""
    cfg = _config()
    seed = None
    if rank == 0:
        host = _advertised_host()
        listen = "[::]:0" if ":" in host.strip("[]") else "0.0.0.0:0"
        seed = _core.Seed(listen, size, formation_timeout=timeout, config=cfg)
        port = seed.address.rsplit(":", 1)[1]
        store.set("nexar/token", seed.token)
        store.set("nexar/seed", f"{_bracket(host)}:{port}")
    try:
        address = store.get("nexar/seed").decode()
        token = store.get("nexar/token").decode()
        comm = _core.join(address, token, rank=rank, world=size, join_timeout=timeout, config=cfg)
        if seed is not None:
            seed.wait(timeout)
    finally:
        if seed is not None:
            seed.stop()
    return comm


def create_process_group(store, rank: int, size: int, timeout: datetime.timedelta,
                         global_ranks: Sequence[int] = ()):
    """The backend's creator: a ProcessGroupNexar on a new nexar communicator of the group's
    ranks. `global_ranks` (each member's rank in the default group) only serves messages."""
    global _pending_world
    comm = _pending_world
    if comm is not None and comm.rank == rank and comm.size == size:
        _pending_world = None
    else:
        comm = _join_through_store(store, rank, size, timeout)
    return ProcessGroupNexar(comm._capsule(), timeout, True, list(global_ranks))


def _create_extended(options, pg_options=None):
    """torch's extended creator form (register_backend(..., extended_api=True)), which also
    tells each member's rank in the default group (empty for the default group itself)."""
    return create_process_group(options.store, options.group_rank, options.group_size,
                                options.timeout, options.global_ranks_in_group or ())


def monitored_barrier(group=None, timeout: Optional[datetime.timedelta] = None,
                      wait_all_ranks: bool = False) -> None:
    """torch.distributed.monitored_barrier for groups of backend "nexar" (torch 1.13 keeps its
    own to Gloo). Rank 0 of the group waits for every other member, then releases them; a
    member that has not arrived within `timeout` (default: the group's) makes rank 0 raise a
    RuntimeError naming it, or, with `wait_all_ranks`, naming every member that did not
    arrive. Any other member raises if rank 0 does not release it in time. Collective over
    the group; it blocks, and its messages use tag nexar.MAX_TAG of the group's
    communicator, which the group's own send/recv should leave alone."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if pg is dist.GroupMember.NON_GROUP_MEMBER:
        return
    if not isinstance(pg, ProcessGroupNexar):
        raise RuntimeError(
            f"nexar.torch.monitored_barrier: the group's backend is "
            f"{dist.get_backend(group)}, not nexar (use torch.distributed.monitored_barrier)")
    if timeout is None:
        pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    else:
        pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _nexar_rendezvous(url: str, timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                      **kwargs):
    """Rendezvous handler: the world from nexar's launch variables, and a torch TCPStore
    opened by its rank 0 on a free port (broadcast over nexar)."""
    global _pending_world
    world = _core.join_from_env(_config())
    rank, size = world.rank, world.size
    message = bytearray(512)
    store = None
    if rank == 0:
        store = TCPStore(_advertised_host(), 0, size, True, timeout, wait_for_workers=False)
        text = f"{_bracket(_advertised_host())}|{store.port}".encode()
        message[: len(text)] = text
    world.broadcast(message, root=0)
    if store is None:
        host, port = bytes(message).rstrip(b"\0").decode().rsplit("|", 1)
        store = TCPStore(host.strip("[]"), int(port), size, False, timeout)
    _pending_world = world
    yield (store, rank, size)
    raise RuntimeError("nexar:// rendezvous cannot run again")


def _launched_by_nexar() -> bool:
    """Started by nexar-run (or with an external nexar seed) and not by torch's launcher."""
    return bool(os.environ.get("NEXAR_SEED_ADDR")) and not os.environ.get("RANK") and not (
        os.environ.get("MASTER_ADDR")
    )


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create_extended, extended_api=True)
    handlers = _rendezvous_module._rendezvous_handlers
    if "nexar" not in handlers:
        _rendezvous_module.register_rendezvous_handler("nexar", _nexar_rendezvous)
    # env:// is the default init_method; under nexar-run it has no RANK or MASTER_ADDR to
    # read, so there (and only there, where torch's handler would fail) nexar's variables
    # take its place.
    original = handlers.get("env")
    if original is not None and not getattr(original, "_nexar_wrapper", False):

        def env_or_nexar(url, *args, **kwargs):
            if _launched_by_nexar():
                return _nexar_rendezvous(url, *args, **kwargs)
            return original(url, *args, **kwargs)

        env_or_nexar._nexar_wrapper = True  # type: ignore[attr-defined]
        handlers["env"] = env_or_nexar


_register()
