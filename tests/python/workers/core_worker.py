"""One rank of a multi-process job using nexar's Python API (run by nexar-run; see
test_multiprocess.py). Every rank can compute every rank's input (seeded by rank), so each
checks its own results against NumPy.

    core_worker.py check          every entry point against NumPy; prints "OK <rank> <size>"
    core_worker.py kill VICTIM    rank VICTIM kills itself after a barrier; the others must
                                  get RankFailedError from a collective, promptly
    core_worker.py freeze VICTIM  rank VICTIM stops (SIGSTOP) instead: its port stays open,
                                  so only the silence (NEXAR_FAILURE_TIMEOUT_MS) tells; the
                                  others raise, then kill it so that the job can end
    core_worker.py stall VICTIM   rank VICTIM is late to an all_reduce by 4 s: the others
                                  print "STALLED <rank>" and wait in it; then all complete
    core_worker.py slow VICTIM    rank VICTIM comes 30 ms late to each of 20 all_reduces
                                  (a straggler for the trace's lateness score); each rank
                                  prints "STATS <rank> <json of comm.stats()>"
"""

import os
import signal
import sys
import time

import numpy as np

import nexar


def data(rank, count, dtype=np.float32, salt=0):
    rng = np.random.default_rng(7919 * rank + count + salt)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-1, 1, count).astype(dtype)
    return rng.integers(-5, 6, count).astype(dtype)


def check(comm):
    r, n = comm.rank, comm.size
    every = range(n)

    for count in (0, 1, 7, 1031, 100003):
        x = data(r, count)
        comm.all_reduce(x)
        want = np.sum([data(i, count).astype(np.float64) for i in every], axis=0)
        np.testing.assert_allclose(x, want.astype(np.float32), rtol=1e-5, atol=1e-5)

    x = data(r, 33, np.int64)
    y = np.zeros(33, np.int64)
    comm.iall_reduce(x, y, op=nexar.MAX).wait()
    np.testing.assert_array_equal(y, np.max([data(i, 33, np.int64) for i in every], axis=0))

    b = data(0, 17, np.float64) if r == 0 else np.zeros(17)
    comm.broadcast(b, root=0)
    np.testing.assert_array_equal(b, data(0, 17, np.float64))

    out = comm.reduce(data(r, 9, np.int32), np.zeros(9, np.int32), root=n - 1)
    if r == n - 1:
        np.testing.assert_array_equal(out, np.sum([data(i, 9, np.int32) for i in every], axis=0))

    g = comm.all_gather(data(r, 5), np.zeros(5 * n, np.float32))
    np.testing.assert_array_equal(g, np.concatenate([data(i, 5) for i in every]))

    full = np.sum([data(i, 11, np.int64) for i in every], axis=0)
    off, length = nexar.block_of(11, n, r)
    rs = comm.reduce_scatter(data(r, 11, np.int64), np.zeros(length, np.int64))
    np.testing.assert_array_equal(rs, full[off:off + length])

    a = comm.all_to_all(data(r, 3 * n, np.int32), np.zeros(3 * n, np.int32))
    np.testing.assert_array_equal(
        a, np.concatenate([data(i, 3 * n, np.int32)[3 * r:3 * r + 3] for i in every]))

    gathered = comm.gather(data(r, 4), np.zeros(4 * n, np.float32) if r == 0 else None, root=0)
    if r == 0:
        np.testing.assert_array_equal(gathered, np.concatenate([data(i, 4) for i in every]))

    sc = comm.scatter(data(0, 2 * n) if r == 0 else None, np.zeros(2, np.float32), root=0)
    np.testing.assert_array_equal(sc, data(0, 2 * n)[2 * r:2 * r + 2])

    s = comm.scan(data(r, 6, np.int64), np.zeros(6, np.int64))
    np.testing.assert_array_equal(s, np.sum([data(i, 6, np.int64) for i in range(r + 1)], axis=0))

    # point-to-point around the ring, and RPC to the next rank
    right, left = (r + 1) % n, (r - 1) % n
    got = np.zeros(100, np.float64)
    req = comm.irecv(got, left, tag=3)
    comm.send(np.full(100, float(r)), right, tag=3)
    assert req.wait().source == left
    np.testing.assert_array_equal(got, np.full(100, float(left)))

    comm.register_rpc(9, lambda caller, args: bytes(reversed(args)) + bytes([caller]))
    comm.barrier()
    assert comm.rpc(right, 9, b"abc") == b"cba" + bytes([r])
    comm.barrier()

    sub = comm.split(r % 2)
    z = np.array([r], np.int64)
    sub.all_reduce(z)
    assert z[0] == sum(i for i in every if i % 2 == r % 2)
    print(f"OK {r} {n}", flush=True)


def kill(comm, victim, sig):
    pids = np.zeros(comm.size, np.int64)
    comm.all_gather(np.array([os.getpid()], np.int64), pids)
    start = time.monotonic()
    x = np.ones(1000, np.float32)
    try:
        # Inside the try: the victim stops right after its own barrier returns, and its
        # last barrier message may still wait in its engine's queue (a small send completes
        # once copied), so a survivor's barrier can be the operation that finds it failed.
        comm.barrier()
        if comm.rank == victim:
            os.kill(os.getpid(), sig)
        while time.monotonic() - start < 60:
            comm.all_reduce(x)
    except nexar.RankFailedError as e:
        assert victim in e.failed_ranks, e.failed_ranks
        print(f"RAISED {comm.rank} {time.monotonic() - start:.2f} {type(e).__name__}", flush=True)
        if sig == signal.SIGSTOP:
            try:
                os.kill(int(pids[victim]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return
    print(f"HUNG {comm.rank}", flush=True)
    sys.exit(1)


def stall(comm, victim):
    x = np.ones(10, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    comm.barrier()
    if comm.rank == victim:
        time.sleep(4)
    else:
        print(f"STALLED {comm.rank}", flush=True)
    comm.all_reduce(x)
    print(f"DONE {comm.rank}", flush=True)


def slow(comm, victim):
    import json
    x = np.ones(1000, np.float32)
    comm.barrier()
    for _ in range(20):
        if comm.rank == victim:
            time.sleep(0.03)
        comm.all_reduce(x)
    st = comm.stats()
    comm.barrier()  # every peer was still there when each rank read its stats
    print(f"STATS {comm.rank} {json.dumps({'ops': st['ops'], 'peers': {str(k): v for k, v in st['peers'].items()}})}",
          flush=True)


def main():
    mode = sys.argv[1]
    with nexar.init() as comm:
        if mode == "check":
            check(comm)
        elif mode == "stall":
            stall(comm, int(sys.argv[2]))
        elif mode == "slow":
            slow(comm, int(sys.argv[2]))
        else:
            sig = signal.SIGKILL if mode == "kill" else signal.SIGSTOP
            kill(comm, int(sys.argv[2]), sig)


if __name__ == "__main__":
    main()
