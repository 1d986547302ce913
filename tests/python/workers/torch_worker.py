"""One rank of a torch.distributed job on backend "nexar" (run under torchrun or nexar-run;
see test_torch_backend.py).

    torch_worker.py check          every operation against a reference computed from all
                                   ranks' inputs, then a few DDP steps; prints "TORCH OK r n"
    torch_worker.py kill VICTIM    rank VICTIM dies after a barrier; the others' all_reduce
                                   must raise within the failure timeout
    torch_worker.py timeouts       (3 or more ranks) operations a member never joins raise
                                   within the group's timeout, naming it; prints
                                   "TIMEOUTS OK r n"
"""

import datetime
import os
import signal
import sys
import time
import warnings

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401  registers backend "nexar"


def inp(rank, *shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1009 * rank + 31 * salt + 7)
    if dtype.is_floating_point:
        return torch.rand(*shape, generator=g).mul(2).sub(1).to(dtype)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def expect_error(fn, text):
    try:
        fn()
    except (RuntimeError, ValueError, nexar.Error) as e:
        assert text in str(e), f"expected {text!r} in: {e}"
        return
    raise AssertionError(f"no error (expected {text!r})")


def check_ops(r, n):
    every = range(n)
    ops = {
        dist.ReduceOp.SUM: lambda xs: torch.stack(xs).sum(0),
        dist.ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0),
        dist.ReduceOp.MIN: lambda xs: torch.stack(xs).min(0).values,
        dist.ReduceOp.MAX: lambda xs: torch.stack(xs).max(0).values,
        dist.ReduceOp.AVG: lambda xs: torch.stack(xs).mean(0),
    }
    for op, ref in ops.items():
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            t = inp(r, 37, dtype=dtype)
            dist.all_reduce(t, op=op)
            want = ref([inp(i, 37, dtype=dtype).double() for i in every]).to(dtype)
            tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
            torch.testing.assert_close(t.double(), want.double(), rtol=tol, atol=tol)
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND),
                 "ReduceOp BAND is not supported")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG),
                 "AVG needs a floating-point tensor")
    # Device tensors: the collectives torch routes through its dispatcher never reach a
    # backend for a device it has no kernel for; the ones it calls directly do.
    expect_error(lambda: dist.all_gather_into_tensor(torch.ones(3 * n, device="meta"),
                                                     torch.ones(3, device="meta")),
                 "CPU tensors only")

    # a non-contiguous tensor: reduced through a contiguous copy, copied back
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4).add(r).t()
    dist.all_reduce(m)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    torch.testing.assert_close(m, base * n + sum(every))

    # large enough for the ring algorithm
    big = inp(r, 300_001)
    dist.all_reduce(big)
    torch.testing.assert_close(big, sum(inp(i, 300_001) for i in every), rtol=1e-5, atol=1e-5)

    b = inp(0, 1031) if r == 0 else torch.zeros(1031)
    dist.broadcast(b, src=0)
    assert torch.equal(b, inp(0, 1031))

    root = n - 1
    t = inp(r, 9, dtype=torch.int32)
    dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
    if r == root:
        assert torch.equal(t, sum(inp(i, 9, dtype=torch.int32) for i in every))

    outs = [torch.zeros(5) for _ in every]
    dist.all_gather(outs, inp(r, 5))
    for i in every:
        assert torch.equal(outs[i], inp(i, 5))
    flat = torch.zeros(5 * n)
    dist.all_gather_into_tensor(flat, inp(r, 5))
    assert torch.equal(flat, torch.cat([inp(i, 5) for i in every]))

    gl = [torch.zeros(4) for _ in every] if r == root else None
    dist.gather(inp(r, 4), gather_list=gl, dst=root)
    if r == root:
        for i in every:
            assert torch.equal(gl[i], inp(i, 4))

    sl = [inp(100 + i, 3) for i in every] if r == 0 else None
    got = torch.zeros(3)
    dist.scatter(got, scatter_list=sl, src=0)
    assert torch.equal(got, inp(100 + r, 3))

    out = torch.zeros(6, dtype=torch.int64)
    dist.reduce_scatter(out, [inp(r, 6, dtype=torch.int64, salt=j) for j in every])
    assert torch.equal(out, sum(inp(i, 6, dtype=torch.int64, salt=r) for i in every))
    out2 = torch.zeros(2)
    dist.reduce_scatter_tensor(out2, inp(r, 2 * n))
    torch.testing.assert_close(out2, sum(inp(i, 2 * n) for i in every)[2 * r:2 * r + 2])

    a = torch.zeros(3 * n)
    dist.all_to_all_single(a, inp(r, 3 * n))
    assert torch.equal(a, torch.cat([inp(i, 3 * n)[3 * r:3 * r + 3] for i in every]))
    # uneven: rank i sends i + j + 1 rows of 2 to rank j
    send_rows = [r + j + 1 for j in every]
    recv_rows = [i + r + 1 for i in every]
    src = torch.cat([torch.full((k, 2), float(100 * r + j)) for j, k in enumerate(send_rows)])
    dst = torch.zeros(sum(recv_rows), 2)
    dist.all_to_all_single(dst, src, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    assert torch.equal(dst, torch.cat([torch.full((k, 2), float(100 * i + r))
                                       for i, k in enumerate(recv_rows)]))
    ins = [torch.full((j + 1,), float(r)) for j in every]
    outs = [torch.zeros(r + 1) for _ in every]
    dist.all_to_all(outs, ins)
    for i in every:
        assert torch.equal(outs[i], torch.full((r + 1,), float(i)))

    coalesced = [inp(r, 3), inp(r, 1000, salt=1), inp(r, 1, salt=2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "will be deprecated": DDP-era API, still supported
        dist.all_reduce_coalesced(coalesced)
    for k, (size, salt) in enumerate(((3, 0), (1000, 1), (1, 2))):
        torch.testing.assert_close(coalesced[k], sum(inp(i, size, salt=salt) for i in every))

    # point-to-point around the ring; recv from any source
    right, left = (r + 1) % n, (r - 1) % n
    if n > 1:
        got = torch.zeros(10)
        req = dist.irecv(got, src=left, tag=4)
        dist.send(torch.full((10,), float(r)), dst=right, tag=4)
        req.wait()
        assert torch.equal(got, torch.full((10,), float(left)))
        if r == 0:
            sources = set()
            for _ in range(n - 1):
                g = torch.zeros(1)
                sources.add(dist.recv(g, tag=6))
                assert int(g.item()) == 1000
            assert sources == set(range(1, n))
        else:
            dist.send(torch.tensor([1000.0]), dst=0, tag=6)

    # asynchronous work and its future
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    w.wait()
    assert w.is_completed()
    assert torch.equal(fut.wait()[0], torch.full((4,), float(n)))

    # a subgroup gets its own communicator
    evens = [i for i in every if i % 2 == 0]
    g = dist.new_group(evens, backend="nexar")
    if r in evens:
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=g)
        assert t.item() == sum(evens)
    dist.barrier()


def random_sparse(rank, salt, sparse_dims, dense_dims, nnz):
    """A sparse COO tensor of shape [5] * sparse_dims + [3] * dense_dims with `nnz` random
    entries, duplicates among them (not coalesced)."""
    g = torch.Generator().manual_seed(7919 * rank + salt)
    indices = torch.randint(0, 5, (sparse_dims, nnz), generator=g)
    values = torch.randn([nnz] + [3] * dense_dims, generator=g, dtype=torch.float64)
    return torch.sparse_coo_tensor(indices, values, [5] * sparse_dims + [3] * dense_dims)


def check_added_ops(r, n):
    """allgather_coalesced, sparse all_reduce, monitored_barrier and sequence numbers."""
    every = range(n)
    shapes = [(3, 2), (0,), (1,), (1031,), (2, 1, 3)]
    # torch 1.13 takes one dtype per call
    for dtype in (torch.float32, torch.int64, torch.complex64, torch.bfloat16):
        def inputs(rank):
            return [inp(rank, *shape, dtype=torch.float32, salt=k).to(dtype)
                    for k, shape in enumerate(shapes)]

        outs = [[torch.empty(shape, dtype=dtype) for shape in shapes] for _ in every]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "deprecated" in torch 1.13, still in its API
            dist.all_gather_coalesced(outs, inputs(r))
        for i in every:
            for got, want in zip(outs[i], inputs(i)):
                assert got.dtype == want.dtype and torch.equal(got, want), (i, got, want)
    # Ranks whose inputs differ in bytes get an error, never garbage.
    k = 3 + (r == n - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expect_error(lambda: dist.all_gather_coalesced([[torch.zeros(k)] for _ in every],
                                                       [torch.zeros(k)]),
                     "the ranks disagree")

    # Sparse all_reduce: SUM against the dense sum, with some ranks holding no entries.
    for sparse_dims, dense_dims in ((1, 0), (2, 0), (3, 0), (1, 1), (2, 2)):
        nnz = lambda i: 0 if i == 1 else 2 * i + 3  # noqa: E731
        t = random_sparse(r, 10 * sparse_dims + dense_dims, sparse_dims, dense_dims, nnz(r))
        want = sum(random_sparse(i, 10 * sparse_dims + dense_dims, sparse_dims, dense_dims,
                                 nnz(i)).to_dense() for i in every)
        dist.all_reduce(t)
        assert t.is_sparse
        torch.testing.assert_close(t.to_dense(), want, rtol=1e-12, atol=1e-12)
    expect_error(lambda: dist.all_reduce(random_sparse(r, 1, 1, 0, 2), op=dist.ReduceOp.MAX),
                 "SUM only")

    nexar.torch.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    nexar.torch.monitored_barrier()

    # Sequence numbers: the same on every member.
    pg = dist.distributed_c10d._get_default_group()
    seqs = [torch.zeros(1, dtype=torch.int64) for _ in every]
    dist.all_gather(seqs, torch.tensor([pg._get_sequence_number_for_group()]))
    assert len({int(s.item()) for s in seqs}) == 1, seqs


def raises_in_time(fn, limit, *texts, least=None):
    """fn() raises within `limit` seconds (plus a little), not before `least` (default: not
    much sooner than `limit`), with every text in its message."""
    least = limit - 0.1 if least is None else least
    start = time.monotonic()
    try:
        fn()
    except RuntimeError as e:
        took = time.monotonic() - start
        assert least <= took <= limit + 1.5, f"raised after {took:.2f} s, not ~{limit} s: {e}"
        for text in texts:
            assert text in str(e), f"expected {text!r} in: {e}"
        return
    raise AssertionError("no error")


def check_timeouts(r, n):
    """The group's timeout bounds operations a member never joins (torch's semantics), and
    the error names the member waited for. Ranks 1 and 2 form the group; rank 2 stays away."""
    g = dist.new_group([1, 2], timeout=datetime.timedelta(seconds=2))
    if r == 1:
        raises_in_time(lambda: dist.barrier(g), 2, "Timed out", "rank 2")
        # The group is broken now: the next collective may raise at once, naming the earlier
        # failure, but never later than its timeout.
        raises_in_time(lambda: dist.all_reduce(torch.ones(5), group=g), 2, "timeout", least=0)
        raises_in_time(lambda: dist.recv(torch.zeros(3), src=2, group=g), 2, "Timed out", "rank 2")
        # An operation's own timeout overrides the group's.
        opts = dist.BarrierOptions()
        opts.timeout = datetime.timedelta(seconds=1)
        raises_in_time(g.barrier(opts=opts).wait, 1, "Timed out")
    dist.barrier()  # the world group is still whole

    # monitored_barrier names the members that did not come.
    late = list(range(n - 1, 0, -2))  # the last rank and every second one below it
    one = datetime.timedelta(seconds=1)
    if r not in late:
        if r == 0:
            raises_in_time(lambda: nexar.torch.monitored_barrier(timeout=one), 1,
                           f"rank {min(late)} ", "failed to pass monitoredBarrier")
        else:
            raises_in_time(lambda: nexar.torch.monitored_barrier(timeout=one), 1, "did not release")
    dist.barrier()
    if r not in late:
        if r == 0:
            raises_in_time(lambda: nexar.torch.monitored_barrier(timeout=one, wait_all_ranks=True),
                           1, *[f"rank {i} " for i in late])
        else:
            raises_in_time(lambda: nexar.torch.monitored_barrier(timeout=one), 1, "did not release")
    dist.barrier()


def check_ddp(r, n):
    torch.manual_seed(r)  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(50 + r)
    for _ in range(4):
        x = torch.randn(16, 8, generator=g)
        y = x.sum(1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.zeros_like(params) for _ in range(n)]
    dist.all_gather(everyone, params)
    for other in everyone:
        assert torch.equal(other, params), "parameters differ between ranks after DDP steps"


def check_mismatch(r, n):
    """One rank all_reduces float64 where the others all_reduce float32, the same bytes: every
    rank raises within a second, the error naming both calls, instead of summing garbage."""
    for _ in range(4):  # the members agree on their shared-memory mailboxes first
        dist.all_reduce(torch.ones(3))
    odd = r == n - 1
    x = torch.ones(4, dtype=torch.float64) if odd else torch.ones(8, dtype=torch.float32)
    start = time.monotonic()
    try:
        dist.all_reduce(x)
        dist.barrier()  # a rank whose part completed hears of it here
    except RuntimeError as e:
        took = time.monotonic() - start
        assert took < 1.0, f"raised after {took:.2f} s: {e}"
        for text in ("called all_reduce(f32, sum)", "called all_reduce(f64, sum)"):
            assert text in str(e), f"expected {text!r} in: {e}"
        return
    raise AssertionError("no error")


def main():
    mode = sys.argv[1]
    dist.init_process_group("nexar")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "nexar"
    if mode == "check":
        check_ops(r, n)
        check_added_ops(r, n)
        check_ddp(r, n)
        dist.barrier()
        print(f"TORCH OK {r} {n}", flush=True)
    elif mode == "timeouts":
        check_timeouts(r, n)
        print(f"TIMEOUTS OK {r} {n}", flush=True)
    elif mode == "mismatch":
        check_mismatch(r, n)
        print(f"MISMATCH OK {r} {n}", flush=True)
        os._exit(0)  # the group is revoked: nothing left to tear down in order
    else:
        victim = int(sys.argv[2])
        start = time.monotonic()
        try:
            # Inside the try, as in core_worker.py: the victim dies right after its own
            # barrier returns, while its last barrier message may still wait in its
            # engine's queue, so a survivor's barrier can be what finds it failed.
            dist.barrier()
            if r == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            while time.monotonic() - start < 60:
                dist.all_reduce(torch.ones(100))
        except RuntimeError as e:
            assert "rank_failed" in str(e) or "failed" in str(e), str(e)
            print(f"RAISED {r} {time.monotonic() - start:.2f}", flush=True)
            os._exit(0)  # the group's peers are gone; no orderly teardown to wait for
        print(f"HUNG {r}", flush=True)
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
