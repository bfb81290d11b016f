"""The collectives of ``torch.distributed``: what each one does to every rank's data.

For each operation this module has a *model* (the data on every rank before and after,
computed in plain Python), a function that runs the *real* operation on the same input
(``run_op``, called on every rank under ``dl.spawn``), a picture of before and after
(``draw``), the documented backend support table and a live probe of a backend
(``probe``). The tests check the model against the real operations.

How this differs from PyTorch's documentation: the pictures show the actual numbers a real
call produces on a small input (rank r starts with 10(r+1)+i in slot i), and the support
table for the learner's machine is measured, not copied.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.i18n import _t
from ddp_lab.tools.doctor_facts import collective

OPS = (
    "send_recv",
    "broadcast",
    "reduce",
    "all_reduce",
    "gather",
    "all_gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)
ROOT = 0

_Y, _N, _Q = "✓", "✘", "?"
_ROWS = (
    "send",
    "recv",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)


def _table(*cols: str) -> dict[str, dict[str, str]]:
    return {
        op: dict(
            zip(
                ("gloo/cpu", "gloo/gpu", "mpi/cpu", "mpi/gpu", "nccl/cpu", "nccl/gpu"),
                col.split(),
                strict=True,
            )
        )
        for op, col in zip(_ROWS, cols, strict=True)
    }


# The table of the torch.distributed documentation (PyTorch 2.x, docs/source/distributed.md).
DOCUMENTED = _table(
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✘ ✘ ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
)
# The table in the course's source notes (002), copied from an older release of the docs.
NOTES_TABLE = _table(
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✓ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✘",
    "✘ ✘ ✘ ✘ ✘ ✓",
    "✘ ✘ ✓ ? ✘ ✓",
    "✓ ✘ ✓ ? ✘ ✓",
)


def table_differences() -> list[tuple[str, str, str, str]]:
    """(op, backend/device, notes, docs) for every cell where the notes' table is out of date."""
    return [
        (op, col, NOTES_TABLE[op][col], DOCUMENTED[op][col])
        for op in _ROWS
        for col in DOCUMENTED[op]
        if NOTES_TABLE[op][col] != DOCUMENTED[op][col]
    ]


def _v(rank: int, slot: int) -> float:
    return float(10 * (rank + 1) + slot)


def model(op: str, world_size: int) -> tuple[list[list[float]], list[list[float | None]]]:
    """(before, after): the slots of every rank around ``op`` (root/src/dst is rank 0).

    ``None`` in ``after`` marks a slot whose content PyTorch leaves unspecified (the non-root
    ranks of ``reduce``).
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    n = world_size
    full = [[_v(r, i) for i in range(n)] for r in range(n)]
    one = [[_v(r, 0)] for r in range(n)]
    column_sums = [sum(full[r][i] for r in range(n)) for i in range(n)]
    if op == "send_recv":  # rank 0 sends its slots to rank 1
        return full, [full[0] if r == 1 else full[r] for r in range(n)]
    if op == "broadcast":
        return full, [full[ROOT][:] for _ in range(n)]
    if op == "reduce":
        return full, [column_sums if r == ROOT else [None] * n for r in range(n)]
    if op == "all_reduce":
        return full, [column_sums[:] for _ in range(n)]
    if op == "gather":
        return one, [[_v(k, 0) for k in range(n)] if r == ROOT else [] for r in range(n)]
    if op == "all_gather":
        return one, [[_v(k, 0) for k in range(n)] for _ in range(n)]
    if op == "scatter":
        return [full[ROOT] if r == ROOT else [] for r in range(n)], [
            [_v(ROOT, r)] for r in range(n)
        ]
    if op == "reduce_scatter":
        return full, [[column_sums[r]] for r in range(n)]
    if op == "all_to_all":
        return full, [[_v(k, r) for k in range(n)] for r in range(n)]
    return one, one  # barrier: no data moves, every rank only waits for the others


def run_op(rank: int, op: str, device: str = "cpu") -> list[float | None]:
    """Run the real ``op`` on this rank's input from ``model``; return this rank's slots after."""
    n = dist.get_world_size()
    before, after = model(op, n)

    def vec(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    mine = vec(before[rank])
    if op == "send_recv":
        if rank == 0:
            dist.send(mine, dst=1)
        elif rank == 1:
            dist.recv(mine, src=0)
        return mine.tolist()
    if op == "broadcast":
        dist.broadcast(mine, src=ROOT)
        return mine.tolist()
    if op == "reduce":
        dist.reduce(mine, dst=ROOT)
        return mine.tolist() if rank == ROOT else [None] * n
    if op == "all_reduce":
        dist.all_reduce(mine)
        return mine.tolist()
    if op == "gather":
        out = [vec([0.0]) for _ in range(n)] if rank == ROOT else None
        dist.gather(mine, out, dst=ROOT)
        return [t.item() for t in out] if out is not None else []
    if op == "all_gather":
        out = [vec([0.0]) for _ in range(n)]
        dist.all_gather(out, mine)
        return [t.item() for t in out]
    if op == "scatter":
        got = vec([0.0])
        dist.scatter(got, list(mine.chunk(n)) if rank == ROOT else None, src=ROOT)
        return got.tolist()
    if op == "reduce_scatter":
        got = vec([0.0])
        dist.reduce_scatter(got, list(mine.chunk(n)))
        return got.tolist()
    if op == "all_to_all":
        out = [vec([0.0]) for _ in range(n)]
        dist.all_to_all(out, list(mine.chunk(n)))
        return [t.item() for t in out]
    dist.barrier()
    return mine.tolist()


TIMED_OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def timed_collectives(
    rank: int, sizes: Sequence[int], reps: int = 5, ops: Sequence[str] = TIMED_OPS
) -> list[tuple[str, int, float]]:
    """Run each of ``ops`` ``reps`` times at each size (bytes of one rank's input, float32).

    Every call sits in a ``record_function`` range named after the op (what
    ``trace_analysis.collective_times`` reports as its label) after a barrier, so the ranks
    start it together. The single-tensor forms are used (``all_gather_single``,
    ``reduce_scatter_single``: what FSDP calls). Returns (op, bytes, seconds) per call as
    Python saw it: ``perf_counter`` around the call, dispatch and wait included.
    """
    from torch.profiler import record_function

    n = dist.get_world_size()
    # dist.all_gather_single, or on torch before 2.13 its old name (doctor_facts.collective)
    gather = collective("all_gather_single")
    scatter = collective("reduce_scatter_single")
    calls = {
        "all_reduce": lambda x, out: dist.all_reduce(x),
        "broadcast": lambda x, out: dist.broadcast(x, src=ROOT),
        "all_gather": lambda x, out: gather(out, x),
        "reduce_scatter": lambda x, out: scatter(out, x),
    }
    seen = []
    for size in sizes:
        x = torch.ones(size // 4)
        outs = {
            "all_gather": torch.empty(n * x.numel()),
            "reduce_scatter": torch.empty(x.numel() // n),
        }
        for _ in range(reps):
            for op in ops:
                dist.barrier()
                t0 = time.perf_counter()
                with record_function(op):
                    calls[op](x, outs.get(op))
                seen.append((op, size, time.perf_counter() - t0))
    return seen


def _probe_rank(rank: int, device: str) -> dict[str, str]:
    results = {}
    n = dist.get_world_size()
    for op in OPS:
        try:
            got = run_op(rank, op, device)
            want = model(op, n)[1][rank]
            results[op] = _Y if got == want else f"{_N} wrong result {got} != {want}"
        except Exception as exc:  # noqa: BLE001  # an unsupported op raises on every rank
            results[op] = f"{_N} {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return results


def probe(backend: str = "gloo", device: str = "cpu", nprocs: int = 2) -> dict[str, str]:
    """Try every collective on ``backend`` with tensors on ``device``; '✓' or '✘ why' per op.

    Each op runs on ``nprocs`` ranks and its result is compared with ``model``.
    """
    from ddp_lab.runtime.launcher import spawn

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    results = spawn(
        _probe_rank, args=(device,), nprocs=nprocs, backend=backend, quiet=True, timeout=60
    )
    merged = {}
    for op in OPS:
        bad = [r[op] for r in results if r[op] != _Y]
        merged[op] = bad[0] if bad else _Y
    return merged


def _color(value: float | None, world_size: int) -> Any:
    import matplotlib.pyplot as plt

    if value is None:
        return "#dddddd"
    origin = int(value) // 10 - 1
    if 0 <= origin < world_size and value < 10 * (origin + 1) + world_size:
        return plt.get_cmap("tab10")(origin)
    return "#f2c14e"  # a sum of several ranks' values


def draw(op: str, world_size: int = 4, axes: Any = None) -> Any:
    """Draw every rank's slots before and after ``op``; return the figure."""
    import matplotlib.pyplot as plt

    before, after = model(op, world_size)
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 0.55 * world_size + 1.0))
    fig = axes[0].figure
    titles = (_t("before"), _t("after"))
    width = max(max(len(row) for row in before), max(len(row) for row in after), 1)
    for ax, rows, title in zip(axes, (before, after), titles, strict=True):
        for r, row in enumerate(rows):
            y = world_size - 1 - r
            ax.text(-0.6, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=9)
            for i, value in enumerate(row):
                ax.add_patch(plt.Rectangle((i, y), 0.95, 0.8, color=_color(value, world_size)))
                label = "?" if value is None else f"{value:g}"
                ax.text(i + 0.47, y + 0.4, label, ha="center", va="center", fontsize=9)
        ax.set_xlim(-2.2, width + 0.2)
        ax.set_ylim(-0.2, world_size)
        ax.set_title(f"{op}: {title}")
        ax.axis("off")
    fig.tight_layout()
    return fig
