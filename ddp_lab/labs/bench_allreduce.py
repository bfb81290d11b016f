"""An nccl-tests-style all-reduce benchmark: the hand-written ring next to ``dist.all_reduce``.

Like ``all_reduce_perf`` from nccl-tests it prints, for each message size, the element
count, the type, the time of one all-reduce, the algorithm bandwidth
``algbw = size / time`` and the bus bandwidth ``busbw = algbw * 2(N-1)/N`` (the rate at
which each rank's link carries data, comparable across N), plus a correctness column.

How it differs from nccl-tests: it runs on CPU with Gloo by default, measures both
implementations side by side in the same processes (alternating, so that both see the
same machine load), reports the median of the per-iteration times (each the slowest rank's
time) rather than the mean, and checks every result rather than one.

Command line: ``python -m ddp_lab.labs.bench_allreduce -n 2 4 -b 1K -e 64M``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.i18n import N_, _t, lookup
from ddp_lab.ring import ring_all_reduce

IMPLS = ("ring", "torch")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MESSAGES = {
    "legend.ring": N_("hand-written ring, N={n}"),
    "legend.torch": N_("dist.all_reduce, N={n}"),
}


def parse_size(text: str | int) -> int:
    """'64K' -> 65536, '16M' -> 16777216; ints pass through."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text).strip().upper().removesuffix("B")
        unit = s[-1:] if s[-1:] in _UNITS else ""
        try:
            value = int(float(s[: len(s) - len(unit)]) * _UNITS[unit])
        except ValueError:
            raise ValueError(
                _t(
                    "Sizes must be positive byte counts like 1024, 64K or 16M, got {value!r}.",
                    value=text,
                )
            ) from None
    if value < 1:
        raise ValueError(
            _t(
                "Sizes must be positive byte counts like 1024, 64K or 16M, got {value!r}.",
                value=text,
            )
        )
    return value


def size_sweep(min_bytes: int | str, max_bytes: int | str, factor: int = 4) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes``, multiplied by ``factor`` each time."""
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    sizes = []
    while lo <= hi:
        sizes.append(lo)
        lo *= factor
    return sizes


def bus_factor(world_size: int) -> float:
    """busbw / algbw for all-reduce: each rank sends (and receives) 2(N-1)/N of the data."""
    return 2 * (world_size - 1) / world_size if world_size > 1 else 1.0


def _impl(name: str, segment_bytes: int | None) -> Callable[[torch.Tensor], Any]:
    if name == "torch":
        return dist.all_reduce
    return lambda t: ring_all_reduce(t, segment_bytes=segment_bytes)


def _rank_main(
    rank: int,
    sizes: list[int],
    dtype: torch.dtype,
    impls: list[str],
    iters: int,
    warmup: int,
    segment_bytes: int | None,
) -> list[dict]:
    """One rank: time every implementation at every size, alternating between them."""
    n = dist.get_world_size()
    elt = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for size in sizes:
        count = max(1, size // elt)
        # Small integers: float sums are exact, so the check can be exact too.
        base = ((torch.arange(count) + rank) % 7).to(dtype)
        expected = sum(((torch.arange(count) + r) % 7).to(torch.float64) for r in range(n))
        times = {name: [] for name in impls}
        wrong = dict.fromkeys(impls, 0)
        fns = {name: _impl(name, segment_bytes) for name in impls}
        buf = base.clone()
        for i in range(warmup + iters):
            for name in impls:
                buf.copy_(base)
                dist.barrier()
                t0 = time.perf_counter()
                fns[name](buf)
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
                if i >= warmup:
                    times[name].append(elapsed.item())
                    wrong[name] += int((buf.to(torch.float64) != expected).sum().item())
        for name in impls:
            t = statistics.median(times[name])
            algbw = count * elt / t / 1e9
            rows.append(
                {
                    "impl": name,
                    "size": count * elt,
                    "count": count,
                    "type": str(dtype).replace("torch.", ""),
                    "nprocs": n,
                    "time_us": t * 1e6,
                    "algbw": algbw,
                    "busbw": algbw * bus_factor(n),
                    "wrong": wrong[name],
                    "segment_bytes": segment_bytes if name == "ring" else None,
                }
            )
    return rows


def run(
    nprocs: int = 2,
    sizes: Sequence[int | str] = ("1K", "64K", "1M", "16M"),
    dtype: torch.dtype = torch.float32,
    impls: Sequence[str] = IMPLS,
    iters: int = 5,
    warmup: int = 2,
    segment_bytes: int | None = None,
    printout: bool = True,
    timeout: float | None = None,
) -> list[dict]:
    """Benchmark all-reduce on ``nprocs`` Gloo ranks; print the table and return its rows."""
    from ddp_lab.runtime.launcher import spawn

    for name in impls:
        if name not in IMPLS:
            raise ValueError(
                _t(
                    "Unknown implementation {value!r}: choose from {choices}.",
                    value=name,
                    choices=", ".join(IMPLS),
                )
            )
    if (
        isinstance(iters, bool)
        or not isinstance(iters, int)
        or iters < 1
        or not isinstance(warmup, int)
        or warmup < 0
    ):
        raise ValueError(_t("iters must be a positive int and warmup a non-negative int."))
    byte_sizes = [parse_size(s) for s in sizes]
    rows = spawn(
        _rank_main,
        args=(byte_sizes, dtype, list(impls), iters, warmup, segment_bytes),
        nprocs=nprocs,
        backend="gloo",
        quiet=True,
        timeout=timeout,  # a full sweep on a busy laptop can take minutes: no limit by default
    )[0]
    if printout:
        print(format_table(rows))
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as an all_reduce_perf-style table, one line per size, impls side by side."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    by_size: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_size.setdefault(r["size"], {})[r["impl"]] = r
    head = f"{'size(B)':>11} {'count':>10} {'type':>8}"
    for name in impls:
        head += f" | {name + ' time(us)':>15} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    if set(IMPLS) <= set(impls):
        head += f" | {'ring/torch busbw':>16}"
    n = rows[0]["nprocs"] if rows else 0
    seg = next((r["segment_bytes"] for r in rows if r.get("segment_bytes")), None)
    ring_kind = f"segmented ring ({seg} B segments)" if seg else "ring without segments"
    lines = [f"# all-reduce, nprocs={n}, gloo, {ring_kind}, bandwidths in GB/s", head]
    for size, per in by_size.items():
        first = next(iter(per.values()))
        line = f"{size:>11} {first['count']:>10} {first['type']:>8}"
        for name in impls:
            r = per[name]
            line += (
                f" | {r['time_us']:>15.1f} {r['algbw']:>7.3f} {r['busbw']:>7.3f} {r['wrong']:>6}"
            )
        if set(IMPLS) <= set(impls):
            line += f" | {per['ring']['busbw'] / per['torch']['busbw']:>16.2f}"
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[dict], ax: Any = None) -> Any:
    """Bus bandwidth against message size, one line per implementation and world size."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    keys = list(dict.fromkeys((r["impl"], r["nprocs"]) for r in rows))
    for impl, n in keys:
        pts = [(r["size"], r["busbw"]) for r in rows if r["impl"] == impl and r["nprocs"] == n]
        ax.plot(
            *zip(*pts, strict=True),
            marker="o",
            linestyle="-" if impl == "ring" else "--",
            label=lookup(MESSAGES, f"legend.{impl}", n=n),
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel(_t("message size (bytes)"))
    ax.set_ylabel(_t("bus bandwidth (GB/s)"))
    ax.set_title(_t("all-reduce on gloo: hand-written ring vs dist.all_reduce"))
    ax.legend()
    ax.grid(True, alpha=0.3)
    return ax


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m ddp_lab.labs.bench_allreduce", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-n", "--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("-b", "--minbytes", default="1K")
    parser.add_argument("-e", "--maxbytes", default="64M")
    parser.add_argument("-f", "--stepfactor", type=int, default=4)
    parser.add_argument("-w", "--warmup", type=int, default=2)
    parser.add_argument("-i", "--iters", type=int, default=7)
    parser.add_argument("-d", "--dtype", default="float32")
    parser.add_argument("--segment-bytes", type=parse_size, default=None)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    args = parser.parse_args(argv)
    sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    for n in args.nprocs:
        run(
            n,
            sizes,
            getattr(torch, args.dtype),
            args.impls,
            args.iters,
            args.warmup,
            args.segment_bytes,
        )
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
