"""Overhead of tracing: ``dl.spawn(..., trace=...)`` vs the same launch untraced.

Two of the chapters' examples, each launched untraced and traced in interleaved rounds (a
busy machine slows both alike), in one run: chapter 05's ring all-reduce (4 ranks) and
chapter 07's bucketed DDP steps (2 ranks). Prints, per example, the median wall time of the
whole launch (what a learner waits for: profiler start, export and merge included) and the
median time of the function's own work inside the ranks, traced and untraced, and their
ratios. Goal: traced launch <= 1.3x untraced.

    .venv/bin/python benchmarks/bench_trace.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

import ddp_lab as dl
from ddp_lab import ring
from ddp_lab.bucketed_ddp import BucketedDDP
from ddp_lab.runtime import launcher


def ring_example(rank: int) -> float:
    """Chapter 05: the hand ring on 256 Ki floats, three times."""
    x = torch.ones(1 << 18)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(3):
        ring.ring_all_reduce(x.clone())
    return time.perf_counter() - start


def ddp_example(rank: int) -> float:
    """Chapter 07: BucketedDDP on an MLP with 2 MiB buckets, four steps after one warm-up."""
    torch.manual_seed(0)
    model = BucketedDDP(
        nn.Sequential(
            nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        ),
        bucket_cap_mb=2,
    )
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    nn.functional.cross_entropy(model(x), y).backward()
    start = time.perf_counter()
    for _ in range(4):
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
    return time.perf_counter() - start


EXAMPLES = {"ch05 ring, 4 ranks": (ring_example, 4), "ch07 BucketedDDP, 2 ranks": (ddp_example, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    launcher.wait_warm()
    folder = tempfile.mkdtemp(prefix="bench_trace_")
    path = os.path.join(folder, "run.json")
    wall = {(name, t): [] for name in EXAMPLES for t in (False, True)}
    inner = {(name, t): [] for name in EXAMPLES for t in (False, True)}
    for fn, n in EXAMPLES.values():  # one warm-up launch of each, both ways
        dl.spawn(fn, nprocs=n, backend="gloo")
        dl.spawn(fn, nprocs=n, backend="gloo", trace=path)
    for _ in range(args.rounds):
        for name, (fn, n) in EXAMPLES.items():
            for traced in (False, True):
                start = time.perf_counter()
                times = dl.spawn(fn, nprocs=n, backend="gloo", trace=path if traced else None)
                wall[name, traced].append(time.perf_counter() - start)
                inner[name, traced].append(max(times))
    os.remove(path)
    os.rmdir(folder)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.rounds} rounds, medians")
    print(
        f"{'example':28s} {'launch untraced':>16s} {'traced':>9s} {'ratio':>6s}"
        f" {'work untraced':>14s} {'traced':>9s} {'ratio':>6s}"
    )
    for name in EXAMPLES:
        w0, w1 = (statistics.median(wall[name, t]) for t in (False, True))
        i0, i1 = (statistics.median(inner[name, t]) for t in (False, True))
        print(
            f"{name:28s} {w0 * 1e3:13.0f} ms {w1 * 1e3:6.0f} ms {w1 / w0:5.2f}x"
            f" {i0 * 1e3:11.1f} ms {i1 * 1e3:6.1f} ms {i1 / i0:5.2f}x"
        )


if __name__ == "__main__":
    main()
