"""A merged trace read per rank: its communication calls, compute intervals and own ranges.

``load`` turns the merged Chrome trace (``runtime/_trace.py``) into one ``RankTrace`` per
rank; the interval arithmetic (``union``, ``total``, ``intersect``, ``subtract``, in
microseconds) is what ``trace_analysis`` measures with. ``tools/trace_analysis.py``
re-exports these names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddp_lab.i18n import _t

COMM_PREFIXES = ("gloo:", "nccl:")
Interval = tuple[float, float]

# --- interval arithmetic (microseconds) -------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals into disjoint ones, sorted."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total(intervals: Iterable[Interval]) -> float:
    """Length of the union of the intervals."""
    return sum(end - start for start, end in union(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The times that lie in both unions, as disjoint sorted intervals."""
    a, b = union(a), union(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The times in the union of ``a`` that are not in the union of ``b``."""
    out: list[Interval] = []
    cuts = union(b)
    for start, end in union(a):
        for cut_start, cut_end in cuts:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
        if end > start:
            out.append((start, end))
    return out


# --- the trace -------------------------------------------------------------------------


@dataclass
class Call:
    """One communication call as the backend recorded it on one rank (times in us)."""

    kind: str
    start: float
    end: float
    bytes: int = 0
    peer: int | None = None
    seq: int = 0


@dataclass
class RankTrace:
    """What one rank did: its communication calls, compute intervals, own labelled ranges."""

    rank: int
    calls: list[Call] = field(default_factory=list)
    compute: list[Interval] = field(default_factory=list)
    ranges: list[tuple[str, float, float]] = field(default_factory=list)
    # operators (copies, allocations) the backend's own threads ran, e.g. inside a collective
    backend_ops: list[Interval] = field(default_factory=list)


def load(source: str | os.PathLike | dict) -> dict[int, RankTrace]:
    """Read a merged trace (a file name or the loaded JSON) into one ``RankTrace`` per rank."""
    if isinstance(source, dict):
        data = source
    else:
        with open(source, encoding="utf-8") as f:
            data = json.load(f)
    info = data.get("ddp_lab")
    if not isinstance(info, dict) or "ranks" not in info:
        raise ValueError(
            _t(
                "This is not a trace of ddp_lab's launcher (no 'ddp_lab' section): write one "
                "with dl.spawn(..., trace='run.json') or %%ddp --trace run.json."
            )
        )
    mains = {int(r): t["main_tid"] for r, t in info["ranks"].items()}
    runs = {r: RankTrace(r) for r in sorted(mains)}
    busy: dict[int, list[Interval]] = {r: [] for r in runs}
    blocked: dict[int, list[Interval]] = {r: [] for r in runs}
    kernels: dict[int, list[Interval]] = {r: [] for r in runs}
    for e in data.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("pid") not in runs:
            continue
        rank, name = e["pid"], str(e.get("name", ""))
        start = float(e["ts"])
        end = start + float(e.get("dur", 0.0))
        on_main = e.get("tid") == mains[rank]
        if name.startswith(COMM_PREFIXES):
            args = e.get("args", {})
            runs[rank].calls.append(
                Call(
                    args.get("kind", name.split(":", 1)[1]),
                    start,
                    end,
                    int(args.get("bytes", 0)),
                    args.get("peer"),
                    int(args.get("seq", 0)),
                )
            )
            if on_main:
                blocked[rank].append((start, end))
        elif on_main and name.startswith("c10d::"):
            blocked[rank].append((start, end))
        elif e.get("cat") == "kernel":
            if not name.lower().startswith("nccl"):  # ncclDevKernel_*: communication
                kernels[rank].append((start, end))
        elif on_main and e.get("cat") == "cpu_op":
            busy[rank].append((start, end))
        elif on_main and e.get("cat") == "user_annotation":
            runs[rank].ranges.append((name, start, end))
        elif not on_main and e.get("cat") == "cpu_op":
            runs[rank].backend_ops.append((start, end))
    for rank, run in runs.items():
        run.calls.sort(key=lambda c: c.start)
        run.compute = union(kernels[rank]) if kernels[rank] else subtract(busy[rank], blocked[rank])
    return runs
