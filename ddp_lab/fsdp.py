"""FSDP from scratch (ZeRO-3, teaching version): parameters live as flat per-rank shards.

Each *unit* (by default every child of the wrapped module that owns parameters, plus
the root for parameters owned directly by it) flattens its parameters into one float32
vector, padded to a multiple of the world size; each rank keeps only its slice of it,
as an ``nn.Parameter``, so ``FullyShardedDP(model).parameters()`` yields this rank's
shards and an ordinary optimizer steps them (the optimizer state is sharded too).

- Before a unit's forward, its shards are **all-gathered** into the full flat vector
  (cast to ``compute_dtype`` first, so the all-gather already moves fewer bytes); the
  unit's parameters become views of it. After its forward the storage is **freed**.
- Autograd saved those views for backward; a hook on the unit's output **gathers again**
  into the same storage just before backward reaches the unit. Each call of a unit has its
  own gathered vector, so two forwards before one backward (``m(x1).sum() + m(x2).sum()``)
  work: each call is regathered, and reduce-scattered, on its own.
- The gather is an ``autograd.Function``; its backward, the unit's gradient hook, starts
  an asynchronous **reduce-scatter** of the full gradient (divided by the world size
  first): each rank receives the averaged gradient of its own shard only. It frees the
  full parameters again. When backward ends, a callback waits for the reduce-scatters
  and writes ``shard.grad`` (in float32).

How the teaching version differs from torch's ``fully_shard``
(``torch/distributed/fsdp/_fully_shard/``) and ``FullyShardedDataParallel``
(``torch/distributed/fsdp/fully_sharded_data_parallel.py``):
- units are the direct children (or the modules you pass); no nesting, no parameters
  shared across units, every parameter trainable; activation checkpointing inside a unit
  is not supported;
- a unit called k times before a backward keeps k gathered copies until backward reaches
  them, and reduce-scatters k times;
- no prefetching: each gather runs when it is needed (torch prefetches the next unit's
  all-gather); the reduce-scatters are asynchronous, as in torch;
- shards are 1-D slices of one flat vector per unit (FSDP1's ``FlatParameter``; FSDP2
  shards every parameter on dim 0 as a ``DTensor``);
- ``compute_dtype`` casts gathered parameters, each unit's floating-point inputs and the
  gradient reduction (FSDP2's ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)``
  set to the same dtype); master weights and ``shard.grad`` stay float32.
"""

from __future__ import annotations

from typing import Any

import torch

from ddp_lab.fsdp_base import (
    FSDPTimeline,
    FullyShardedBase,
    _all_gather,
    _default_units,
    _Reduction,
    _Unit,
)
from ddp_lab.i18n import _t
from ddp_lab.tools.doctor_facts import collective

__all__ = ["FSDPTimeline", "FullyShardedDP", "plot_fsdp_timeline"]
__all__ += ["_all_gather", "_default_units"]  # the machinery's helpers, ddp_lab.fsdp_base's


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Any) -> Any:
    return collective("reduce_scatter_single")(out, inp, group=group, async_op=True)


class FullyShardedDP(FullyShardedBase):
    """ZeRO-3: shard parameters, gradients and optimizer state over the ranks.

    The machinery (gather, free, hooks) is ``ddp_lab.fsdp_base.FullyShardedBase``'s; this class
    adds the default gradient reduction: an asynchronous reduce-scatter of each unit's gradient.
    The arguments are ``FullyShardedBase``'s (its docstring says what each one does).
    """

    def _reduce_default(self, unit: _Unit, grad_full: torch.Tensor) -> None:
        grad = grad_full / self.world_size  # divide first, as DDP does
        out = torch.empty(unit.shard_size, dtype=grad.dtype)
        self._poll()
        start = self._now()
        work = _reduce_scatter(out, grad.contiguous(), self.process_group)
        unit.pending.append(_Reduction(work, out, start))


def plot_fsdp_timeline(step: FSDPTimeline, ax: Any = None) -> Any:
    """Draw one FSDP step: all-gathers, compute per unit, reduce-scatters."""
    import matplotlib.pyplot as plt

    rows = {"all-gather": 2, "compute": 1, "reduce-scatter": 0}
    colors = {"all-gather": "tab:green", "compute": "tab:blue", "reduce-scatter": "tab:orange"}
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.4))
    ms = 1000.0
    for kind, unit, start, end in step.events:
        width = max(end - start, 2e-5) * ms
        ax.broken_barh(
            [(start * ms, width)],
            (rows[kind] - 0.4, 0.8),
            color=colors[kind],
            edgecolor="black",
            linewidth=0.5,
        )
        ax.text(start * ms + width / 2, rows[kind], unit, ha="center", va="center", fontsize=7)
    ax.set_yticks(
        [0, 1, 2],
        [
            _t("reduce-scatter"),
            _t("compute"),
            _t("all-gather"),
        ],
    )
    ax.set_xlabel(_t("ms since the forward began"))
    ax.set_title(_t("one FullyShardedDP step: gather, compute, free; gather again, reduce-scatter"))
    return ax
