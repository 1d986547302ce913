"""One DistributedDataParallel training step, backend "nexar" against Gloo in the same job.

    build/bin/nexar-run -n 4 /usr/bin/python3 bench/ddp_step.py
    /usr/bin/python3 -m torch.distributed.run -r 1 -t 1 --nproc_per_node 4 bench/ddp_step.py

(PYTHONPATH=build/python when nexar is not pip-installed.) The model is an MLP of --layers
square layers of width --width (defaults: 6 x 2048, about 25.2 M parameters, 100 MB of float32
gradients per step). The default process group is nexar's; a second group of the same ranks
uses Gloo, and each trains its own copy of the model on the same batches.

For each backend it prints the median time of a full DDP step (forward, backward with the
gradient all_reduce overlapped, optimizer step), the median of the same step without
gradient synchronisation (DDP's no_sync(): compute only), and the all_reduce share: the part
of the step that synchronisation adds, (step - compute) / step. The two backends' runs are
interleaved step by step, so both see the same machine load.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar.torch  # noqa: F401  registers backend "nexar"


def model(width, layers):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def step(ddp, opt, x, y, sync):
    opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    if sync:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
    else:
        with ddp.no_sync():
            torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=10, help="measured steps per backend and mode")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("nexar")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"nexar": None, "gloo": dist.new_group(backend="gloo")}
    runs = {}
    for name, group in groups.items():
        ddp = DDP(model(args.width, args.layers), process_group=group,
                  bucket_cap_mb=args.bucket_mb)
        runs[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4))
    params = sum(p.numel() for p in runs["nexar"][0].parameters())

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)
    times = {(name, sync): [] for name in runs for sync in (True, False)}
    for i in range(args.warmup + args.steps):
        for name, (ddp, opt) in runs.items():
            for sync in (True, False):
                dist.barrier()  # every rank starts the step together
                t = step(ddp, opt, x, y, sync)
                if i >= args.warmup:
                    times[(name, sync)].append(t)

    # The slowest rank decides a step: take each step's maximum over the ranks.
    report = {}
    for key, ts in times.items():
        t = torch.tensor(ts, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        report[key] = statistics.median(t.tolist())
    if rank == 0:
        print(f"DDP step, {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB of "
              f"float32 gradients), {size} ranks, batch {args.batch} per rank, median of "
              f"{args.steps} steps (max over ranks)")
        print(f"{'backend':<8} {'step ms':>10} {'compute ms':>11} {'all_reduce share':>17}")
        for name in runs:
            full, compute = report[(name, True)], report[(name, False)]
            share = max(0.0, (full - compute) / full)
            print(f"{name:<8} {full * 1e3:>10.1f} {compute * 1e3:>11.1f} {share:>16.0%}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
