"""DistributedDataParallel training on synthetic data with torch.distributed backend "nexar".

    build/bin/nexar-run -n 4 /usr/bin/python3 examples/python/ddp_train.py
    /usr/bin/python3 -m torch.distributed.run -r 1 -t 1 --nproc_per_node 4 \\
        examples/python/ddp_train.py

(PYTHONPATH=build/python when nexar is not pip-installed.) Every rank trains the same small
regression model on its own shard of a synthetic data set; DDP averages the gradients over
nexar. The loss printed per epoch is the mean over all ranks' samples, so it is the same on
every rank, and the script checks that it is, bit for bit, together with the parameters.

--compare-gloo trains a second copy of the model on the same data through a Gloo process
group in the same job and checks that its losses match nexar's to 1e-5 relative.
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar.torch  # noqa: F401  registers backend "nexar" (and the nexar-run rendezvous)


def make_model(features, hidden):
    torch.manual_seed(0)  # the same start on every rank (DDP would broadcast rank 0's anyway)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, 1))


def batches(rank, epoch, args):
    """This rank's shard of epoch `epoch`: y = x . w + noise, w fixed for the whole job."""
    w = torch.linspace(-1, 1, args.features).unsqueeze(1)
    g = torch.Generator().manual_seed(10_000 * epoch + rank)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.features, generator=g)
        y = x @ w + 0.1 * torch.randn(args.batch, 1, generator=g)
        yield x, y


def train(group, args):
    """Returns the mean loss of every epoch (over all ranks' samples) and the parameters."""
    rank = dist.get_rank()
    model = DDP(make_model(args.features, args.hidden), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    losses = []
    for epoch in range(args.epochs):
        total = torch.zeros(2, dtype=torch.float64)  # sum of losses, number of batches
        for x, y in batches(rank, epoch, args):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        dist.all_reduce(total, group=group)
        losses.append((total[0] / total[1]).item())
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses, params


def same_on_every_rank(t, group):
    everyone = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t, group=group)
    return all(torch.equal(e, t) for e in everyone)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="nexar", help="torch.distributed backend (nexar)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="batches per epoch and rank")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--compare-gloo", action="store_true",
                   help="also train through Gloo and check the losses match to 1e-5")
    args = p.parse_args()

    torch.set_num_threads(1)  # one process per core share; the ranks run side by side
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    losses, params = train(None, args)
    for epoch, loss in enumerate(losses, 1):
        print(f"[rank {rank}/{size}] epoch {epoch} loss {loss:.9f} ({args.backend})", flush=True)
    ok = same_on_every_rank(torch.tensor(losses, dtype=torch.float64), None)
    ok = same_on_every_rank(params, None) and ok
    if rank == 0:
        print(f"losses and parameters identical on all {size} ranks: {ok}", flush=True)

    if args.compare_gloo:
        gloo = dist.new_group(backend="gloo")
        gloo_losses, _ = train(gloo, args)
        worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, gloo_losses))
        match = worst <= 1e-5
        if rank == 0:
            print(f"gloo losses {['%.9f' % v for v in gloo_losses]}", flush=True)
            print(f"largest relative difference to gloo: {worst:.3g} (<= 1e-5: {match})",
                  flush=True)
        ok = ok and match
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
