"""Dispatch time of a trivial cell: persistent ranks (%%ranks) vs a one-shot launch.

A "trivial cell" does almost nothing (``y = rank + 1``), so the time is the cost of getting
work to the ranks and the answer back. Persistent ranks already exist and already have a
process group; the one-shot ``dl.spawn(..., backend="gloo")`` (what ``%%ddp`` does) forks
the ranks from its warm zygote and initialises a new process group every time. The first
call of each kind (zygote and group start) is not counted.

"DDP cell" is a ``%%ranks`` cell that builds a small DistributedDataParallel (Linear 16 -> 4)
and runs one training step: what a chapter 07-10 cell costs on persistent ranks (their zygote
preloaded DDP's modules, so not even the first one pays for importing them; it is counted).

    .venv/bin/python benchmarks/bench_persistent.py [--repeats 30] [--nprocs 2 4]
"""

from __future__ import annotations

import argparse
import statistics
import time


def trivial(rank: int) -> int:
    """The one-shot version of the cell ``y = rank + 1``."""
    return rank + 1


DDP_CELL = """
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
model(torch.randn(8, 16)).square().mean().backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()
"""


def once_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


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
        first_ddp = once_ms(lambda: persistent.run_cell(DDP_CELL))
        ddp = median_ms(lambda: persistent.run_cell(DDP_CELL), args.repeats)
        cell = median_ms(lambda: persistent.run_cell("y = rank + 1\n"), args.repeats)
        pull = median_ms(lambda: dl.pull("y"), args.repeats)
        dl.stop()
        spawn = median_ms(lambda n=n: dl.spawn(trivial, nprocs=n, backend="gloo"), args.repeats)
        rows.append((n, cell, pull, spawn, first_ddp, ddp))
    print(f"median of {args.repeats} runs, milliseconds")
    print(
        f"{'ranks':>5} {'%%ranks cell':>13} {'dl.pull':>8} {'dl.spawn (gloo)':>16} {'ratio':>7}"
        f" {'first DDP cell':>15} {'DDP cell':>9}"
    )
    for n, cell, pull, spawn, first_ddp, ddp in rows:
        print(
            f"{n:>5} {cell:>13.2f} {pull:>8.2f} {spawn:>16.1f} {spawn / cell:>6.0f}x"
            f" {first_ddp:>15.1f} {ddp:>9.1f}"
        )


if __name__ == "__main__":
    main()
