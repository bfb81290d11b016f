"""Overhead of tracing: ``dl.spawn(..., trace=...)`` vs the same launch untraced.

Two of the chapters' examples, each launched untraced and traced in interleaved rounds (a
busy machine slows both alike), in one run: chapter 05's ring all-reduce (4 ranks) and
chapter 07's bucketed DDP steps (2 ranks). Prints, per example, the median wall time of the
whole launch (what a learner waits for: profiler start, export and merge included) and the
median time of the function's own work inside the ranks, traced and untraced, and their
ratios, and the parent's merge time. Goal: traced launch <= 1.3x untraced. A third variant,
"traced, json merge", merges with the standard library's ``json`` instead of orjson (the
merge as it was), measured in the same rounds.

    .venv/bin/python benchmarks/bench_trace.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import ddp_lab as dl
from ddp_lab import ring
from ddp_lab.bucketed_ddp import BucketedDDP
from ddp_lab.runtime import _trace, launcher


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


VARIANTS = ("untraced", "traced, json merge", "traced")


def launch(fn: Callable, n: int, variant: str, path: str, merges: list[float]) -> list[float]:
    """One ``dl.spawn`` of ``fn``; ``merges`` gets the parent's merge time of a traced one.

    "traced, json merge" is the traced launch with the merge reading and writing the JSON
    through the standard library (``json``) instead of orjson, as it did before.
    """
    if variant == "untraced":
        return dl.spawn(fn, nprocs=n, backend="gloo")
    fast = (_trace._loads, _trace._dumps)
    merge = _trace.merge

    def timed_merge(*args: Any, **kw: Any) -> dict:
        start = time.perf_counter()
        try:
            return merge(*args, **kw)
        finally:
            merges.append(time.perf_counter() - start)

    _trace.merge = timed_merge
    if variant == "traced, json merge":
        _trace._loads, _trace._dumps = _trace._stdlib_loads, _trace._stdlib_dumps
    try:
        return dl.spawn(fn, nprocs=n, backend="gloo", trace=path)
    finally:
        _trace._loads, _trace._dumps = fast
        _trace.merge = merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    launcher.wait_warm()
    folder = tempfile.mkdtemp(prefix="bench_trace_")
    path = os.path.join(folder, "run.json")
    wall: dict[tuple, list[float]] = {(name, v): [] for name in EXAMPLES for v in VARIANTS}
    inner: dict[tuple, list[float]] = {(name, v): [] for name in EXAMPLES for v in VARIANTS}
    merges: dict[tuple, list[float]] = {(name, v): [] for name in EXAMPLES for v in VARIANTS}
    for fn, n in EXAMPLES.values():  # one warm-up launch of each, every way
        for variant in VARIANTS:
            launch(fn, n, variant, path, [])
    for _ in range(args.rounds):
        for name, (fn, n) in EXAMPLES.items():
            for variant in VARIANTS:
                start = time.perf_counter()
                times = launch(fn, n, variant, path, merges[name, variant])
                wall[name, variant].append(time.perf_counter() - start)
                inner[name, variant].append(max(times))
    os.remove(path)
    os.rmdir(folder)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.rounds} rounds, medians")
    print(
        f"{'example':28s} {'variant':19s} {'launch':>8s} {'ratio':>6s}"
        f" {'merge':>8s} {'work':>9s} {'ratio':>6s}"
    )
    for name in EXAMPLES:
        w0 = statistics.median(wall[name, "untraced"])
        i0 = statistics.median(inner[name, "untraced"])
        for variant in VARIANTS:
            w = statistics.median(wall[name, variant])
            i = statistics.median(inner[name, variant])
            m = merges[name, variant]
            merge = f"{statistics.median(m) * 1e3:5.1f} ms" if m else "       -"
            print(
                f"{name:28s} {variant:19s} {w * 1e3:5.0f} ms {w / w0:5.2f}x"
                f" {merge} {i * 1e3:6.1f} ms {i / i0:5.2f}x"
            )


if __name__ == "__main__":
    main()
