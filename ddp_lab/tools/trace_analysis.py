"""Reading a merged trace of all ranks: a timeline, and where each rank's time went.

The trace comes from ``dl.spawn(..., trace="run.json")`` or ``%%ddp --trace run.json``
(``ddp_lab/runtime/_trace.py`` merges the ranks' ``torch.profiler`` exports). Named after
Holistic Trace Analysis (HTA, ``hta/trace_analysis.py``), which does this for GPU traces.
The measures, per rank:

- **communication**: the union of the backend's communication events (``gloo:all_reduce``,
  ``gloo:send`` ...), on whatever thread ran them; a collective lasts from when the rank
  entered it until every peer's data arrived, so waiting for a late peer counts as
  communication here, as it does in a GPU trace;
- **compute**: the union of the operators (``aten::``, autograd) the profiler recorded on
  the rank's main thread, minus the time in ``c10d::`` calls and blocking ``gloo:`` calls
  there. On CPU the operators are what HTA calls computation kernels on a GPU; Python's
  own time between operators is neither (it is not in the trace). A rank that ran CUDA
  kernels is measured as HTA measures it: compute is the union of its kernels (the trace's
  ``kernel`` events, on the GPU's streams; NCCL's own kernels are communication, not
  compute), the time the GPU computed, not the CPU's time launching them;
- **exposed communication**: communication time during which no compute ran;
- **overlap %**: the time communication and compute ran at once, as a percentage of the
  communication time. This is HTA's ``get_comm_comp_overlap``
  (``hta/analyzers/communication_analysis.py``: both kinds of kernels merged into
  intervals, then time with both running / time with communication running).

How it differs from HTA: HTA reads GPU kernels per stream; here the "streams" are the
rank's main thread (compute) and the backend's worker threads (communication).

The trace is read in ``trace_read.py`` (``load``, the interval arithmetic) and drawn in
``trace_draw.py``; this module measures it (``summarize``, ``collective_times``,
``versus_model``), prints the tables and re-exports the names of both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ddp_lab.i18n import _t
from ddp_lab.tools.trace_draw import KIND_COLOURS, draw
from ddp_lab.tools.trace_read import (
    COMM_PREFIXES,
    Call,
    Interval,
    RankTrace,
    intersect,
    load,
    subtract,
    total,
    union,
)

__all__ = [
    "COMM_PREFIXES",
    "KIND_COLOURS",
    "Call",
    "CollectiveTime",
    "Interval",
    "RankSummary",
    "RankTrace",
    "collective_times",
    "draw",
    "format_summary",
    "format_versus_model",
    "intersect",
    "load",
    "subtract",
    "summarize",
    "timeline",
    "total",
    "union",
    "versus_model",
]


@dataclass
class RankSummary:
    """Where one rank's time went (microseconds), HTA's overlap measure included."""

    rank: int
    compute_us: float
    comm_us: float
    exposed_us: float
    calls: int
    bytes: int

    @property
    def overlap_pct(self) -> float:
        """Communication time with compute running, in % of the communication time."""
        if self.comm_us <= 0:
            return 0.0
        return 100.0 * (self.comm_us - self.exposed_us) / self.comm_us


def summarize(runs: dict[int, RankTrace], within: str | None = None) -> list[RankSummary]:
    """Compute, communication, exposed communication and overlap for every rank.

    ``within``: count only the time inside the rank's own ranges of that name
    (``torch.profiler.record_function(within)``), and the calls that start there.
    """
    out = []
    for rank, run in sorted(runs.items()):
        comm = union((c.start, c.end) for c in run.calls)
        compute = run.compute
        calls = run.calls
        if within is not None:
            window = union((s, e) for name, s, e in run.ranges if name == within)
            comm, compute = intersect(comm, window), intersect(compute, window)
            calls = [c for c in calls if any(s <= c.start < e for s, e in window)]
        comm_us = total(comm)
        overlapped = total(intersect(comm, compute))
        out.append(
            RankSummary(
                rank,
                compute_us=total(compute),
                comm_us=comm_us,
                exposed_us=comm_us - overlapped,
                calls=len(calls),
                bytes=sum(c.bytes for c in calls),
            )
        )
    return out


@dataclass
class CollectiveTime:
    """One collective, matched across ranks: its time in the trace (microseconds).

    ``label``: the name of the innermost ``record_function`` range it started in on the
    lowest rank (None when outside any), e.g. the API call that ran it: gloo names the
    backend's work, so a ``reduce_scatter_single`` shows up as a ``gloo:all_reduce``.
    ``ops_us``: the time the backend's thread spent in operators (``aten::copy_`` ...)
    during the call on the lowest rank: copies between its own buffers and the tensors,
    not communication.
    """

    kind: str
    seq: int
    bytes: int
    label: str | None
    first_start: float
    last_start: float
    last_end: float
    ops_us: float = 0.0

    @property
    def us(self) -> float:
        """From the last rank's start to the last rank's end: the call without late arrivals."""
        return self.last_end - self.last_start

    @property
    def waited_us(self) -> float:
        """How long the first rank to start waited for the last one."""
        return self.last_start - self.first_start


def collective_times(runs: dict[int, RankTrace]) -> list[CollectiveTime]:
    """Every collective of the run, matched across ranks by (kind, seq), in order of start.

    The k-th ``all_reduce`` of one rank is the k-th of every other (ranks call collectives
    in the same order). Calls that not every rank recorded (point-to-point, a missing rank)
    are left out.
    """
    matched: dict[tuple[str, int], list[tuple[int, Call]]] = {}
    for rank, run in runs.items():
        for call in run.calls:
            matched.setdefault((call.kind, call.seq), []).append((rank, call))
    out = []
    for (kind, seq), calls in matched.items():
        if len(calls) != len(runs) or kind in ("send", "recv", "recvAnySource"):
            continue
        low_rank, low = min(calls, key=lambda rc: rc[0])
        around = [(s, name) for name, s, e in runs[low_rank].ranges if s <= low.start < e]
        out.append(
            CollectiveTime(
                kind,
                seq,
                low.bytes,
                max(around)[1] if around else None,  # the innermost range
                first_start=min(c.start for _, c in calls),
                last_start=max(c.start for _, c in calls),
                last_end=max(c.end for _, c in calls),
                ops_us=total(intersect(runs[low_rank].backend_ops, [(low.start, low.end)])),
            )
        )
    return sorted(out, key=lambda c: c.first_start)


def versus_model(
    times: Sequence[CollectiveTime],
    n: int,
    alpha: float,
    beta: float,
    gamma: float = 0.0,
    seen: Sequence[Sequence[tuple[str, int, float]]] | None = None,
) -> list[dict]:
    """Each (collective, size): the median trace time next to ``costs.gloo_cpu``'s (us).

    ``times``: ``collective_times`` of a run of ``collectives.timed_collectives`` on ``n``
    ranks (calls labelled by their op); ``seen``: that run's return value (every rank's own
    Python-side times), to put the time Python saw next to the trace's: per call the
    slowest rank's, then the median. ``ops_us``: the median of ``CollectiveTime.ops_us``.
    """
    import statistics

    from ddp_lab import costs

    traced: dict[tuple[str, int], list[float]] = {}
    ops: dict[tuple[str, int], list[float]] = {}
    for c in times:
        if c.label in costs.GLOO_OPS:
            traced.setdefault((c.label, c.bytes), []).append(c.us)
            ops.setdefault((c.label, c.bytes), []).append(c.ops_us)
    python: dict[tuple[str, int], list[float]] = {}
    for calls in zip(*(seen or []), strict=True):
        python.setdefault(calls[0][:2], []).append(1e6 * max(s for _, _, s in calls))
    rows = []
    for (op, size), us in traced.items():
        measured = statistics.median(us)
        model = 1e6 * costs.gloo_cpu(op, n, size, alpha, beta, gamma)
        py = python.get((op, size))
        rows.append({"op": op, "bytes": size, "ranks": n, "trace_us": measured,
                     "python_us": statistics.median(py) if py else None,
                     "ops_us": statistics.median(ops[op, size]),
                     "model_us": model, "ratio": measured / model})  # fmt: skip
    return rows


def format_versus_model(rows: Sequence[dict]) -> str:
    """``versus_model``'s rows as a text table (milliseconds), headed in the learner's language."""
    heads = [_t("collective"), _t("size"), "N", _t("trace ms"), _t("of it operators ms"),
             _t("Python ms"), _t("model ms"), _t("trace/model")]  # fmt: skip
    cells = [
        [
            r["op"],
            _size(r["bytes"]),
            str(r["ranks"]),
            f"{r['trace_us'] / 1e3:.3f}",
            f"{r['ops_us'] / 1e3:.3f}",
            "-" if r["python_us"] is None else f"{r['python_us'] / 1e3:.3f}",
            f"{r['model_us'] / 1e3:.3f}",
            f"{r['ratio']:.2f}",
        ]
        for r in rows
    ]
    widths = [max(_width(h), *(_width(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(_pad(h, w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(_pad(c, w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} MiB"


def format_summary(rows: Sequence[RankSummary]) -> str:
    """The summary as a text table, headed in the learner's language."""
    heads = [
        _t("rank"),
        _t("compute ms"),
        _t("communication ms"),
        _t("exposed comm. ms"),
        _t("overlap %"),
        _t("calls"),
        _t("bytes"),
    ]
    cells = [
        [
            str(r.rank),
            f"{r.compute_us / 1e3:.2f}",
            f"{r.comm_us / 1e3:.2f}",
            f"{r.exposed_us / 1e3:.2f}",
            f"{r.overlap_pct:.1f}",
            str(r.calls),
            str(r.bytes),
        ]
        for r in rows
    ]
    widths = [max(_width(h), *(_width(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(_pad(h, w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(_pad(c, w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _width(text: str) -> int:
    # CJK characters take two columns in a monospaced font.
    return sum(2 if ord(ch) > 0x2E80 else 1 for ch in text)


def _pad(text: str, width: int) -> str:
    return " " * (width - _width(text)) + text


def timeline(
    path: str | os.PathLike,
    start_ms: float | None = None,
    end_ms: float | None = None,
    show: bool = True,
    within: str | None = None,
) -> list[RankSummary]:
    """Draw a merged trace inline and print the per-rank summary; return the summary rows.

    ``start_ms``/``end_ms`` zoom the drawing; ``within`` limits the summary to the ranks'
    ``record_function`` ranges of that name (see ``summarize``).
    """
    import matplotlib.pyplot as plt

    runs = load(path)
    draw(runs, start_ms=start_ms, end_ms=end_ms)
    if show:
        plt.show()
    rows = summarize(runs, within)
    print(format_summary(rows))
    return rows
