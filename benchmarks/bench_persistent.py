"""Dispatch time of a trivial cell: persistent ranks (%%ranks) vs a one-shot launch.

A "trivial cell" does almost nothing (``y = rank + 1``), so the time is the cost of getting
work to the ranks and the answer back. Persistent ranks already exist and already have a
process group; the one-shot ``dl.spawn(..., backend="gloo")`` (what ``%%ddp`` does) forks
the ranks from its warm zygote and initialises a new process group every time. The first
call of each kind (zygote and group start) is not counted.

    .venv/bin/python benchmarks/bench_persistent.py [--repeats 30] [--nprocs 2 4]
"""

from __future__ import annotations

import argparse
import statistics
import time


def trivial(rank: int) -> int:
    """The one-shot version of the cell ``y = rank + 1``."""
    return rank + 1


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: not counted
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    import ddp_lab as dl
    from ddp_lab.runtime import persistent

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    rows = []
    for n in args.nprocs:
        dl.start(n, backend="gloo")
        cell = median_ms(lambda: persistent.run_cell("y = rank + 1\n"), args.repeats)
        pull = median_ms(lambda: dl.pull("y"), args.repeats)
        dl.stop()
        spawn = median_ms(lambda n=n: dl.spawn(trivial, nprocs=n, backend="gloo"), args.repeats)
        rows.append((n, cell, pull, spawn))
    print(f"median of {args.repeats} runs, milliseconds")
    print(f"{'ranks':>5} {'%%ranks cell':>13} {'dl.pull':>8} {'dl.spawn (gloo)':>16} {'ratio':>7}")
    for n, cell, pull, spawn in rows:
        print(f"{n:>5} {cell:>13.2f} {pull:>8.2f} {spawn:>16.1f} {spawn / cell:>6.0f}x")


if __name__ == "__main__":
    main()
