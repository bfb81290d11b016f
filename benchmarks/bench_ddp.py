"""Step time of mini-DDP (NaiveDDP, BucketedDDP) vs torch's DistributedDataParallel.

All variants train the same MLP on the same data in one run, 2 ranks on gloo by default,
in interleaved rounds so that a busy machine slows them alike. Prints the median step time
of each and its ratio to torch DDP. Goal: BucketedDDP <= 1.3x torch DDP.

    .venv/bin/python benchmarks/bench_ddp.py [--ranks 2] [--steps 20] [--width 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab as dl
from ddp_lab.bucketed_ddp import BucketedDDP
from ddp_lab.ddp import NaiveDDP

VARIANTS = ("torch DDP", "BucketedDDP", "NaiveDDP")


def make_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _bench(rank: int, width: int, depth: int, batch: int, steps: int, warmup: int) -> dict:
    torch.manual_seed(0)
    net = make_model(width, depth)
    models = {
        "torch DDP": DDP(make_model(width, depth)),
        "BucketedDDP": BucketedDDP(make_model(width, depth)),
        "NaiveDDP": NaiveDDP(make_model(width, depth)),
    }
    for m in models.values():
        m.module.load_state_dict(net.state_dict())
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, 256, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    times: dict[str, list[float]] = {k: [] for k in models}
    for step in range(warmup + steps):
        for name, model in models.items():  # interleaved: the same load for everyone
            start = time.perf_counter()
            opts[name].zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if isinstance(model, NaiveDDP):
                model.sync_gradients()
            opts[name].step()
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    n_params = sum(p.numel() for p in net.parameters())
    return {
        "times": times,
        "params": n_params,
        "buckets": len(models["BucketedDDP"].buckets),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    args = parser.parse_args()
    results = dl.spawn(
        _bench,
        args=(args.width, args.depth, args.batch, args.steps, args.warmup),
        nprocs=args.ranks,
        backend="gloo",
        timeout=600,
    )
    r0 = results[0]
    print(
        f"{args.ranks} ranks, gloo, MLP with {r0['params'] / 1e6:.1f} M parameters "
        f"({r0['params'] * 4 / 2**20:.0f} MiB of gradients, {r0['buckets']} buckets), "
        f"batch {args.batch} per rank, {args.steps} timed steps, {r0['threads']} "
        "torch thread(s) per rank"
    )
    # A step ends on every rank together (the all-reduce), so rank 0's times speak for all.
    medians = {k: statistics.median(v) for k, v in r0["times"].items()}
    for name in VARIANTS:
        ratio = medians[name] / medians["torch DDP"]
        print(f"{name:12s} median step {medians[name] * 1000:8.1f} ms   {ratio:5.2f}x torch DDP")
    goal = medians["BucketedDDP"] / medians["torch DDP"]
    print(
        f"goal BucketedDDP <= 1.3x torch DDP: {'met' if goal <= 1.3 else 'NOT met'} ({goal:.2f}x)"
    )


if __name__ == "__main__":
    main()
