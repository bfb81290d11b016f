"""Drawing a merged trace: one row per rank, compute above, communication by kind below.

``draw`` is what ``dl.timeline`` shows; the colours (``KIND_COLOURS``) are the same for a
collective in every chart. ``tools/trace_analysis.py`` re-exports these names.
"""

from __future__ import annotations

from typing import Any

from ddp_lab.i18n import _t
from ddp_lab.tools.trace_read import RankTrace

# One colour per kind of call, so the same collective looks the same in every chart.
KIND_COLOURS = {
    "all_reduce": "tab:blue",
    "allreduce": "tab:blue",
    "broadcast": "tab:orange",
    "all_gather": "tab:green",
    "all_gather_into_tensor": "tab:green",
    "_allgather_base": "tab:green",
    "reduce_scatter": "tab:red",
    "reduce_scatter_tensor": "tab:red",
    "_reduce_scatter_base": "tab:red",
    "send": "tab:purple",
    "recv": "tab:pink",
    "barrier": "tab:gray",
    "all_to_all": "tab:olive",
    "reduce": "tab:cyan",
    "gather": "tab:brown",
    "scatter": "tab:brown",
}


def draw(
    runs: dict[int, RankTrace],
    ax: Any = None,
    start_ms: float | None = None,
    end_ms: float | None = None,
) -> Any:
    """Draw ranks as rows: compute (grey) above, communication coloured by kind below.

    The rank's own ``record_function`` ranges are thin black bars on top, with their names.

    Gaps are times when the rank neither computed nor communicated (Python, waiting on a
    ``work.wait()``, the profiler itself). ``start_ms``/``end_ms`` zoom in.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.8 * len(runs)))
    kinds: dict[str, str] = {}
    ticks, labels = [], []
    for row, (rank, run) in enumerate(sorted(runs.items())):
        y = -row * 1.2
        compute = [(s / 1e3, (e - s) / 1e3) for s, e in run.compute]
        ax.broken_barh(compute, (y + 0.05, 0.4), color="0.6")
        for call in run.calls:
            colour = KIND_COLOURS.get(call.kind, "tab:olive")
            kinds.setdefault(call.kind, colour)
            ax.broken_barh(
                [(call.start / 1e3, (call.end - call.start) / 1e3)],
                (y - 0.45, 0.4),
                facecolor=colour,
                edgecolor="black",
                linewidth=0.3,
            )
        for name, start, end in run.ranges:  # the rank's own record_function ranges
            ax.broken_barh([(start / 1e3, (end - start) / 1e3)], (y + 0.5, 0.08), color="black")
            ax.text(start / 1e3, y + 0.62, name, fontsize=7, va="bottom", clip_on=True)
        ticks += [y + 0.25, y - 0.25]
        labels += [
            _t("rank {rank} compute", rank=rank),
            _t("rank {rank} communication", rank=rank),
        ]
    ax.set_yticks(ticks, labels)
    ax.set_xlabel(_t("time since the run's first event (ms)"))
    if start_ms is not None or end_ms is not None:
        ax.set_xlim(start_ms, end_ms)
    handles = [Patch(color="0.6", label=_t("compute"))]
    handles += [Patch(color=c, label=k) for k, c in kinds.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.figure.tight_layout()
    return ax
