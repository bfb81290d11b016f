"""Pictures of a traced DataParallel step: transfers, a timeline, memory per device.

Each ``*_data`` function computes what its plot draws (tested without a browser); each
``plot_*`` function draws it with matplotlib; ``chunk_sizes_widget`` is the interactive
explorer of default vs balanced chunk sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddp_lab.i18n import N_, _t, lookup
from ddp_lab.parallel._device import HOST, Trace, count_saved, phase, trace
from ddp_lab.parallel.balanced import balanced_chunk_sizes, default_chunk_sizes


def _label(prefix: str, name: str) -> str:
    """``_LEGEND[prefix.name]`` in the current language, or ``name`` if there is none."""
    key = f"{prefix}.{name}"
    return lookup(_LEGEND, key) if key in _LEGEND else name


def _row_label(thread: str) -> str:
    """A timeline row: "main thread", "replica N" (parallel_apply's thread "replica-N")."""
    if thread == "MainThread":
        return _t("main thread")
    if thread.startswith("replica-") and thread[8:].isdigit():
        return _t("replica {n}", n=int(thread[8:]))
    return thread


STEPS = ("scatter", "broadcast", "gather", "scatter_grad", "reduce_add")


def traced_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    output_device: int = 0,
) -> Trace:
    """Run forward, loss and backward of ``model`` (a DataParallel) under ``trace()``.

    With ``loss_fn=None`` the model computes its loss inside ``forward`` (``model(x, y)``
    returns one loss per device) and the step's loss is their mean.

    The step runs with one intra-op thread: the simulated devices share the CPU's cores, and
    with torch's default (one thread per core) every replica thread opens a pool of its own.
    On 2 busy cores those pools, spinning after the forward, made the backward of chapter
    03's small CNN take from 2 ms to 3 s (a GPU replica uses no host thread pool either).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _traced_step(model, x, y, loss_fn, output_device)
    finally:
        torch.set_num_threads(threads)


def _traced_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    output_device: int,
) -> Trace:
    with trace() as t:
        out = model(x) if loss_fn is not None else model(x, y)
        # the loss runs on the output device only, over the whole batch
        with phase("loss", output_device), count_saved(output_device, name="loss"):
            loss = loss_fn(out, y) if loss_fn is not None else out.mean()
        with phase("backward"):
            loss.backward()
    return t


def transfer_table(t: Trace) -> dict[str, dict[tuple[int, int], int]]:
    """Bytes moved in each step of a traced DataParallel step, per (source, destination)."""
    table: dict[str, dict[tuple[int, int], int]] = {s: {} for s in STEPS}
    for (name, src, dst), nbytes in t.bytes_moved().items():
        table.setdefault(name, {})[(src, dst)] = nbytes
    return table


def plot_transfers(t: Trace, n_devices: int) -> Any:
    """One panel per step: arrows from source to destination, labelled in KiB."""
    import matplotlib.pyplot as plt

    table = transfer_table(t)
    steps = [s for s in table if table[s]]
    fig, axes = plt.subplots(1, len(steps), figsize=(3.1 * len(steps), 3.2))
    axes = [axes] if len(steps) == 1 else list(axes)
    ys = {HOST: n_devices} | {d: n_devices - 1 - d for d in range(n_devices)}
    titles = {
        "scatter": _t("1 scatter inputs"),
        "broadcast": _t("2 replicate (broadcast)"),
        "gather": _t("4 gather outputs"),
        "scatter_grad": _t("5 scatter output grads"),
        "reduce_add": _t("6 sum parameter grads"),
        "gather_grad": _t("input grads to host"),
    }
    for ax, step in zip(axes, steps, strict=True):
        for name, y in ys.items():
            label = _t("host") if name == HOST else _t("dev {n}", n=name)
            ax.text(
                0.5,
                y,
                label,
                ha="center",
                va="center",
                bbox={"boxstyle": "round", "fc": "#eef" if name != 0 else "#fdd"},
            )
        pairs = table[step]
        # the "hub" is the end every arrow shares (host or device 0); label the other end
        ends = [set(p) for p in pairs]
        hub = set.intersection(*ends) if ends else set()
        for (src, dst), nbytes in pairs.items():
            other = dst if src in hub else src
            ax.annotate(
                "",
                xy=(0.62, ys[dst]),
                xytext=(0.62, ys[src]),
                arrowprops={
                    "arrowstyle": "->",
                    "color": "C0",
                    "connectionstyle": f"arc3,rad={-0.4 if ys[dst] < ys[src] else 0.4}",
                },
            )
            size = f"{nbytes / 1024:.0f} KiB" if nbytes >= 1024 else f"{nbytes} B"
            ax.text(0.9, ys[other], size, fontsize=7, va="center")
        ax.set_title(titles.get(step, step), fontsize=9)
        ax.set_xlim(0, 1.3)
        ax.set_ylim(-0.7, n_devices + 0.7)
        ax.axis("off")
    fig.tight_layout()
    return fig


def timeline_data(t: Trace) -> list[tuple[str, str, float, float]]:
    """(row, phase, start ms, duration ms) for each timed phase, in start order."""
    rows = []
    for e in sorted(t.phases(), key=lambda e: e.start):
        rows.append((_row_label(e.thread), e.name, e.start * 1e3, (e.end - e.start) * 1e3))
    return rows


def plot_timeline(t: Trace) -> Any:
    """Horizontal bars: when each phase ran, one row per thread."""
    import matplotlib.pyplot as plt

    data = timeline_data(t)
    replicas = [_t("replica {n}", n=i) for i in range(64)]
    rows = sorted(
        {r for r, *_ in data},
        key=lambda r: (replicas.index(r) if r in replicas else len(replicas), r),
    )
    names = sorted({p for _, p, *_ in data})
    colors = {p: f"C{i}" for i, p in enumerate(names)}
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    for row, name, start, dur in data:
        ax.barh(rows.index(row), dur, left=start, color=colors[name], edgecolor="k")
    for name, c in colors.items():
        ax.barh(0, 0, color=c, label=_label("phase", name))
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(_t("time (ms)"))
    ax.legend(fontsize=8, ncol=len(colors), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    return fig


def memory_by_device(
    t: Trace, model: nn.Module, n_devices: int, output_device: int = 0
) -> dict[int, dict[str, int]]:
    """Bytes each device holds at the end of a traced step, by kind (a simple model).

    Counts the parameter copy and its gradient on every used device, the input chunk,
    the activations saved for backward and the replica's output; on ``output_device``
    also the gathered output, its gradient, the loss's saved tensors and the summed
    gradients. Caching allocators, workspaces and fragmentation are left out.
    """
    n_params = sum(p.numel() * p.element_size() for p in model.parameters())
    n_bufs = sum(b.numel() * b.element_size() for b in model.buffers())
    used = sorted({e.src for e in t.phases() if e.name == "forward"})
    mem: dict[int, dict[str, int]] = {d: {} for d in range(n_devices)}

    def add(d: int, kind: str, nbytes: int) -> None:
        mem[d][kind] = mem[d].get(kind, 0) + nbytes

    for d in used:
        add(d, "parameters", n_params + n_bufs)
        add(d, "gradients", n_params)
    for e in t.copies("scatter"):
        add(e.dst, "input chunk", e.nbytes)
    for e in t.events:
        if e.kind == "alloc" and e.name in ("activations", "output", "loss"):
            add(e.dst, e.name, e.nbytes)
        elif e.kind == "alloc" and e.name == "gathered":
            add(output_device, "gathered output + grad", 2 * e.nbytes)
    if output_device not in used:
        add(output_device, "parameters", n_params + n_bufs)
    add(output_device, "summed gradients", n_params)
    return mem


def plot_memory(mem: dict[int, dict[str, int]], title: str = "") -> Any:
    """Stacked bars of ``memory_by_device`` in KiB."""
    import matplotlib.pyplot as plt

    kinds = sorted({k for m in mem.values() for k in m})
    fig, ax = plt.subplots(figsize=(6, 3))
    bottom = [0.0] * len(mem)
    for i, kind in enumerate(kinds):
        vals = [mem[d].get(kind, 0) / 1024 for d in sorted(mem)]
        ax.bar(
            [_t("dev {n}", n=d) for d in sorted(mem)],
            vals,
            bottom=bottom,
            label=_label("mem", kind),
            color=f"C{i}",
        )
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("KiB")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    return fig


def chunk_plot_data(batch_size: int, num_devices: int, gpu0_bsz: int) -> dict[str, list[int]]:
    """What the chunk-size widget draws: the default and the balanced split."""
    return {
        "default": default_chunk_sizes(batch_size, num_devices),
        "balanced": balanced_chunk_sizes(batch_size, num_devices, gpu0_bsz),
    }


def chunk_sizes_widget() -> Any:
    """Sliders for batch size, device count and gpu0_bsz; bars of both splits."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    def draw(batch_size: int, num_devices: int, gpu0_bsz: int) -> None:
        data = chunk_plot_data(batch_size, num_devices, gpu0_bsz)
        fig, ax = plt.subplots(figsize=(6, 2.6))
        xs = range(num_devices)
        ax.bar(
            [x - 0.2 for x in xs],
            data["default"],
            0.4,
            label=_t("default (torch.chunk)"),
        )
        ax.bar([x + 0.2 for x in xs], data["balanced"], 0.4, label=_t("balanced"))
        ax.axhline(gpu0_bsz, ls=":", c="gray")
        ax.set_xticks(list(xs), [_t("dev {n}", n=x) for x in xs])
        ax.set_ylabel(_t("rows"))
        ax.legend(fontsize=8)
        plt.show()

    style = {"description_width": "initial"}  # the names are not cut to "num_devi..."
    return w.interactive(
        draw,
        batch_size=w.IntSlider(30, 1, 128, description=_t("batch size"), style=style),
        num_devices=w.IntSlider(4, 1, 8, description=_t("devices"), style=style),
        gpu0_bsz=w.IntSlider(4, 0, 64, description=_t("gpu0_bsz"), style=style),
    )


# Legend names of the phases and memory kinds (``_label``).
_LEGEND = {
    "phase.scatter": N_("scatter"),
    "phase.replicate": N_("replicate"),
    "phase.forward": N_("forward"),
    "phase.gather": N_("gather"),
    "phase.loss": N_("loss"),
    "phase.backward": N_("backward"),
    "mem.parameters": N_("parameters"),
    "mem.gradients": N_("gradients"),
    "mem.input chunk": N_("input chunk"),
    "mem.activations": N_("activations"),
    "mem.output": N_("output"),
    "mem.loss": N_("loss"),
    "mem.gathered output + grad": N_("gathered output + grad"),
    "mem.summed gradients": N_("summed gradients"),
}
