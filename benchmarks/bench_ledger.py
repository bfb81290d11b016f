"""What the per-rank ledger of torch.distributed calls costs (``ddp_lab.runtime._calls``).

In a ``dl.spawn`` launch every rank's ``dist.all_reduce`` is the counted wrapper; the
original function is its ``__ddp_lab_counted__``. Each rank calls both alternately, in
rounds of ``--calls`` all_reduces of a 1-element tensor (the cheapest real call, where a
fixed cost shows most), and rank 0 prints the median time per call of each and the
difference. On a loaded machine that difference is noise; so part 1 first measures the
wrapper's fixed cost exactly, in this process: the counted wrapper around a function that
does nothing, against that function, medians of interleaved rounds. Goal: the wrapper adds
at most a few microseconds, a few percent of the cheapest gloo call.

    .venv/bin/python benchmarks/bench_ledger.py [--nprocs 2] [--rounds 15] [--calls 500]
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.runtime import _calls


def _fixed_cost(rounds: int, calls: int) -> tuple[float, float]:
    """Median microseconds per call of a no-op, bare and counted (the wrapper's own cost)."""

    def noop(tensor: torch.Tensor, op: object = None) -> None:
        return None

    with tempfile.TemporaryFile() as f:
        f.truncate(_calls._SLOT.size)
        slot = mmap.mmap(f.fileno(), _calls._SLOT.size)
        spec = _calls._FUNCTIONS["all_reduce"]
        counted = _calls._wrap(noop, "all_reduce", spec, slot, {"all_reduce": 0})
        t = torch.zeros(1)
        times: dict[str, list[float]] = {"bare": [], "counted": []}
        for _ in range(rounds):
            for name, fn in (("bare", noop), ("counted", counted)):
                start = time.perf_counter()
                for _ in range(calls):
                    fn(t)
                times[name].append((time.perf_counter() - start) / calls * 1e6)
        slot.close()
    return statistics.median(times["bare"]), statistics.median(times["counted"])


def _measure(rank: int, rounds: int, calls: int) -> tuple[list[float], list[float]]:
    dist.init_process_group("gloo")
    counted = dist.all_reduce
    original = counted.__ddp_lab_counted__
    t = torch.zeros(1)
    times: dict[str, list[float]] = {"original": [], "counted": []}
    for fn in (original, counted):  # warm up
        for _ in range(calls):
            fn(t)
    for _ in range(rounds):
        for name, fn in (("original", original), ("counted", counted)):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn(t)
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return times["original"], times["counted"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=500)
    args = p.parse_args()
    bare, counted = _fixed_cost(args.rounds, 20 * args.calls)
    print(f"wrapper alone (a no-op, counted vs bare), median of {args.rounds} rounds:")
    print(f"  bare {bare:.2f} us/call, counted {counted:.2f} us/call: +{counted - bare:.2f} us")
    results = dl.spawn(_measure, args=(args.rounds, args.calls), nprocs=args.nprocs, timeout=600)
    original, counted = results[0]
    a, b = statistics.median(original), statistics.median(counted)
    print(f"all_reduce of 1 float, {args.nprocs} gloo ranks, median of {args.rounds} rounds:")
    print(f"  original {a:.1f} us/call, counted {b:.1f} us/call: +{b - a:.2f} us ({b / a:.3f}x)")


if __name__ == "__main__":
    main()
