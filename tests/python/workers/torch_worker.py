"""One rank of a torch.distributed job on backend "nexar" (run under torchrun or nexar-run;
see test_torch_backend.py).

    torch_worker.py check          every operation against a reference computed from all
                                   ranks' inputs, then a few DDP steps; prints "TORCH OK r n"
    torch_worker.py kill VICTIM    rank VICTIM dies after a barrier; the others' all_reduce
                                   must raise within the failure timeout
"""

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
    except (RuntimeError, ValueError) as e:
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


def main():
    mode = sys.argv[1]
    dist.init_process_group("nexar")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "nexar"
    if mode == "check":
        check_ops(r, n)
        check_ddp(r, n)
        dist.barrier()
        print(f"TORCH OK {r} {n}", flush=True)
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
