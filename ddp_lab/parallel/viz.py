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

from ddp_lab.course.i18n import Messages
from ddp_lab.parallel._device import HOST, Trace, count_saved, phase, trace
from ddp_lab.parallel.balanced import balanced_chunk_sizes, default_chunk_sizes

MESSAGES = Messages(
    __name__,
    {
        "step_scatter": {
            "en": "1 scatter inputs",
            "zh": "1 切分分发输入",
        },
        "step_broadcast": {
            "en": "2 replicate (broadcast)",
            "zh": "2 复制模型（广播）",
        },
        "step_gather": {
            "en": "4 gather outputs",
            "zh": "4 收集输出",
        },
        "step_scatter_grad": {
            "en": "5 scatter output grads",
            "zh": "5 切分分发输出梯度",
        },
        "step_reduce_add": {
            "en": "6 sum parameter grads",
            "zh": "6 参数梯度求和",
        },
        "step_gather_grad": {
            "en": "input grads to host",
            "zh": "输入梯度回到主机",
        },
        "axis_time": {
            "en": "time (ms)",
            "zh": "时间（毫秒）",
        },
        "main_thread": {
            "en": "main thread",
            "zh": "主线程",
        },
        "axis_rows": {
            "en": "rows",
            "zh": "行数",
        },
        "default_chunks": {
            "en": "default (torch.chunk)",
            "zh": "默认（torch.chunk）",
        },
        "balanced_chunks": {
            "en": "balanced",
            "zh": "均衡",
        },
        "device": {"en": "dev {n}", "zh": "设备 {n}"},
        "host": {"en": "host", "zh": "主机"},
        "replica_thread": {"en": "replica {n}", "zh": "副本 {n}"},
        "phase.scatter": {"en": "scatter", "zh": "切分分发"},
        "phase.replicate": {"en": "replicate", "zh": "复制模型"},
        "phase.forward": {"en": "forward", "zh": "前向"},
        "phase.gather": {"en": "gather", "zh": "收集"},
        "phase.loss": {"en": "loss", "zh": "损失"},
        "phase.backward": {"en": "backward", "zh": "反向"},
        "mem.parameters": {"en": "parameters", "zh": "参数"},
        "mem.gradients": {"en": "gradients", "zh": "梯度"},
        "mem.input chunk": {"en": "input chunk", "zh": "输入分块"},
        "mem.activations": {"en": "activations", "zh": "激活"},
        "mem.output": {"en": "output", "zh": "输出"},
        "mem.loss": {"en": "loss", "zh": "损失"},
        "mem.gathered output + grad": {
            "en": "gathered output + grad",
            "zh": "收集后的输出及其梯度",
        },
        "mem.summed gradients": {"en": "summed gradients", "zh": "求和后的梯度"},
        "widget_batch": {"en": "batch size", "zh": "批大小"},
        "widget_devices": {"en": "devices", "zh": "设备数"},
        "widget_gpu0": {"en": "gpu0_bsz", "zh": "gpu0_bsz（设备 0 的行数）"},
    },
)


def _label(prefix: str, name: str) -> str:
    """``MESSAGES[prefix + name]`` in the current language, or ``name`` if there is none."""
    key = f"{prefix}.{name}"
    return MESSAGES(key) if key in MESSAGES else name


def _row_label(thread: str) -> str:
    """A timeline row: "main thread", "replica N" (parallel_apply's thread "replica-N")."""
    if thread == "MainThread":
        return MESSAGES("main_thread")
    if thread.startswith("replica-") and thread[8:].isdigit():
        return MESSAGES("replica_thread", n=int(thread[8:]))
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
    """
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
        "scatter": MESSAGES("step_scatter"),
        "broadcast": MESSAGES("step_broadcast"),
        "gather": MESSAGES("step_gather"),
        "scatter_grad": MESSAGES("step_scatter_grad"),
        "reduce_add": MESSAGES("step_reduce_add"),
        "gather_grad": MESSAGES("step_gather_grad"),
    }
    for ax, step in zip(axes, steps, strict=True):
        for name, y in ys.items():
            label = MESSAGES("host") if name == HOST else MESSAGES("device", n=name)
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
    replicas = [MESSAGES("replica_thread", n=i) for i in range(64)]
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
    ax.set_xlabel(MESSAGES("axis_time"))
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
            [MESSAGES("device", n=d) for d in sorted(mem)],
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
            label=MESSAGES("default_chunks"),
        )
        ax.bar([x + 0.2 for x in xs], data["balanced"], 0.4, label=MESSAGES("balanced_chunks"))
        ax.axhline(gpu0_bsz, ls=":", c="gray")
        ax.set_xticks(list(xs), [MESSAGES("device", n=x) for x in xs])
        ax.set_ylabel(MESSAGES("axis_rows"))
        ax.legend(fontsize=8)
        plt.show()

    style = {"description_width": "initial"}  # the names are not cut to "num_devi..."
    return w.interactive(
        draw,
        batch_size=w.IntSlider(30, 1, 128, description=MESSAGES("widget_batch"), style=style),
        num_devices=w.IntSlider(4, 1, 8, description=MESSAGES("widget_devices"), style=style),
        gpu0_bsz=w.IntSlider(4, 0, 64, description=MESSAGES("widget_gpu0"), style=style),
    )
