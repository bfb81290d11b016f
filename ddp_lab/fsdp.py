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

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from ddp_lab.i18n import _t


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Any) -> Any:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=True)


@dataclass
class FSDPTimeline:
    """One step: (kind, unit, start, end) in seconds since forward began."""

    events: list[tuple[str, str, float, float]] = field(default_factory=list)


class _Unit:
    def __init__(self, name: str, module: nn.Module, params: list[nn.Parameter]) -> None:
        self.name, self.module = name, module
        self.params = params
        self.numels = [p.numel() for p in params]
        self.shapes = [p.shape for p in params]
        self.full: torch.Tensor | None = None  # the latest call's gathered vector
        self.pending: list[_Reduction] = []  # one per call reduced in this backward
        self.forward_start = self.backward_start = -1.0
        self.size = self.shard_size = 0
        self.shard: nn.Parameter


class _Reduction:
    """One reduce-scatter of a unit's gradient: its work, its output, when it started."""

    def __init__(self, work: Any, out: torch.Tensor, start: float) -> None:
        self.work, self.out, self.start = work, out, start
        self.noted = False


class _Done:
    """A finished Work, for gradients reduced synchronously."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Gather(torch.autograd.Function):
    """Forward: all-gather a unit's shards. Backward: reduce-scatter its gradient."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, owner: FullyShardedDP, unit: _Unit) -> torch.Tensor:
        ctx.owner, ctx.unit = owner, unit
        full = owner._gather_new(unit)
        ctx.full = full.detach()  # an alias of the storage, to free it in backward
        return full

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[None, None, None]:
        ctx.owner._reduce_scatter_grad(ctx.unit, ctx.full, grad_full)
        return None, None, None  # shard.grad is written when backward ends


def _default_units(module: nn.Module) -> list[nn.Module]:
    """The children that own parameters; a ModuleList or ModuleDict (never called
    itself) gives its children instead."""
    units = []
    for child in module.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            units += _default_units(child)
        elif any(True for _ in child.parameters()):
            units.append(child)
    return units


class FullyShardedDP(nn.Module):
    """ZeRO-3: shard parameters, gradients and optimizer state over the ranks.

    Args:
        module: the model (the same initial weights on every rank: rank 0's are broadcast).
        compute_dtype: dtype for gathered parameters, compute and gradient reduction
            (None: the parameters' dtype).
        units: the submodules to gather one at a time, each called once per forward
            (default: the children that own parameters, looking inside ModuleList and
            ModuleDict); parameters outside them form the root unit.
        record_timeline: keep an ``FSDPTimeline`` per step in ``self.timeline``.
        reduce_grad: replaces the reduce-scatter (exercise 10.fsdp_reduce): called with a
            unit's full flat gradient, returns this rank's shard of the average, blocking.
    """

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        units: Iterable[nn.Module] | None = None,
        process_group: Any = None,
        record_timeline: bool = False,
        reduce_grad: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.reduce_grad = reduce_grad
        self.module = module
        self.compute_dtype = compute_dtype
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.record_timeline = record_timeline
        self.timeline: list[FSDPTimeline] = []
        self.gathered_bytes = 0  # full parameters alive now
        self.peak_gathered_bytes = 0
        self._queued = False
        self._t0 = 0.0
        self._events: list[tuple[str, str, float, float]] = []
        self._state_keys = list(module.state_dict().keys())
        # every (owner module, attribute) of each parameter, tied ones included
        self._aliases: dict[int, list[tuple[nn.Module, str, str]]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                raise ValueError(
                    _t(
                        "Parameter {name} is frozen; FullyShardedDP (the teaching version) "
                        "shards trainable parameters only.",
                        name=name,
                    )
                )
            owner_name, _, attr = name.rpartition(".")
            self._aliases.setdefault(id(p), []).append(
                (module.get_submodule(owner_name), attr, name)
            )
        chosen = list(units) if units is not None else _default_units(module)
        names = {id(m): n for n, m in module.named_modules()}
        seen: dict[int, str] = {}
        self.units: list[_Unit] = []
        for m in [*chosen, module]:
            params = []
            for p in m.parameters():
                if id(p) in seen:
                    if m is module:
                        continue  # already in a child unit
                    raise ValueError(
                        _t(
                            "Parameter {name} is used by two units; FullyShardedDP (the teaching "
                            "version) needs each parameter in exactly one unit. Put both users in "
                            "one unit.",
                            name=self._aliases[id(p)][0][2],
                        )
                    )
                seen[id(p)] = names[id(m)] or "<root>"
                params.append(p)
            if params:
                self.units.append(_Unit(names[id(m)] or "<root>", m, params))
        self._root = self.units[-1] if self.units and self.units[-1].module is module else None
        shards = []
        with torch.no_grad():
            for unit in self.units:
                for p in unit.params:
                    dist.broadcast(
                        p.data, src=dist.get_global_rank(self._group(), 0), group=process_group
                    )
                flat = torch.cat([p.detach().reshape(-1) for p in unit.params])
                unit.size = flat.numel()
                unit.shard_size = -(-unit.size // self.world_size)
                padded = torch.zeros(unit.shard_size * self.world_size, dtype=flat.dtype)
                padded[: unit.size] = flat
                start = self.rank * unit.shard_size
                unit.shard = nn.Parameter(padded[start : start + unit.shard_size].clone())
                shards.append(unit.shard)
                for p in unit.params:  # the module keeps plain tensors, set before use
                    for owner, attr, _ in self._aliases[id(p)]:
                        owner._parameters.pop(attr, None)
                        setattr(owner, attr, p.detach())  # placeholder until the first gather
                if unit is not self._root:
                    unit.module.register_forward_pre_hook(self._make_pre_forward(unit))
                    unit.module.register_forward_hook(self._make_post_forward(unit))
        self.shards = nn.ParameterList(shards)

    def _group(self) -> Any:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _event(self, kind: str, unit: _Unit, start: float) -> None:
        if self.record_timeline:
            self._events.append((kind, unit.name, start, self._now()))

    # ----- gather and free --------------------------------------------------------------

    def _gather_into(self, unit: _Unit, full: torch.Tensor) -> None:
        self._poll()
        start = self._now()
        shard = unit.shard.detach()
        if self.compute_dtype is not None:
            shard = shard.to(self.compute_dtype)
        _all_gather(full, shard, self.process_group)
        self.gathered_bytes += full.numel() * full.element_size()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)
        self._event("all-gather", unit, start)

    def _gather_new(self, unit: _Unit) -> torch.Tensor:
        dtype = self.compute_dtype or unit.shard.dtype
        full = torch.empty(unit.shard_size * self.world_size, dtype=dtype)
        self._gather_into(unit, full)
        return full

    def _free(self, full: torch.Tensor | None) -> None:
        if full is not None and full.untyped_storage().size() > 0:
            self.gathered_bytes -= full.numel() * full.element_size()
            full.untyped_storage().resize_(0)

    def _regather(self, unit: _Unit, full: torch.Tensor | None) -> None:
        if full is not None and full.untyped_storage().size() == 0:
            full.untyped_storage().resize_(full.numel() * full.element_size())
            # .data: write without bumping the version autograd checks on saved tensors
            self._gather_into(unit, full.data)

    def _use_full(self, unit: _Unit) -> None:
        unit.full = _Gather.apply(unit.shard, self, unit)
        views = unit.full[: unit.size].split(unit.numels)
        for p, view, shape in zip(unit.params, views, unit.shapes, strict=True):
            for owner, attr, _ in self._aliases[id(p)]:
                setattr(owner, attr, view.view(shape))

    def _cast(self, args: Any) -> Any:
        if self.compute_dtype is None:
            return args
        return tuple(
            a.to(self.compute_dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        )

    def _make_pre_forward(self, unit: _Unit) -> Any:
        def hook(module: nn.Module, args: tuple) -> tuple:
            self._use_full(unit)
            unit.forward_start = self._now()
            return self._cast(args)

        return hook

    def _make_post_forward(self, unit: _Unit) -> Any:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            self._event("compute", unit, unit.forward_start)
            self._after_forward(unit, out)

        return hook

    def _after_forward(self, unit: _Unit, out: Any) -> None:
        full = unit.full  # this call's vector: a later call of the unit gets its own
        self._free(full)
        if not torch.is_grad_enabled():
            return
        outputs = out if isinstance(out, (tuple, list)) else [out]
        fired = [False]

        def pre_backward(grad: torch.Tensor) -> torch.Tensor:
            if not fired[0]:  # once, whichever output's gradient comes first
                fired[0] = True
                self._regather(unit, full)
                unit.backward_start = self._now()
            return grad

        for t in outputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(pre_backward)

    # ----- backward ---------------------------------------------------------------------

    @torch.no_grad()
    def _reduce_scatter_grad(
        self, unit: _Unit, full: torch.Tensor, grad_full: torch.Tensor
    ) -> None:
        if unit.backward_start >= 0:
            self._event("compute", unit, unit.backward_start)
        self._free(full)
        if not self._queued:
            Variable._execution_engine.queue_callback(self._finish_backward)
            self._queued = True
        if self.reduce_grad is not None:  # the learner's version, synchronous
            out = self.reduce_grad(grad_full.contiguous())
            unit.pending.append(_Reduction(_Done(), out, self._now()))
            return
        grad = grad_full / self.world_size  # divide first, as DDP does
        out = torch.empty(unit.shard_size, dtype=grad.dtype)
        self._poll()
        start = self._now()
        work = _reduce_scatter(out, grad.contiguous(), self.process_group)
        unit.pending.append(_Reduction(work, out, start))

    def _poll(self) -> None:
        """Note the reduce-scatters seen finished (gloo's Work has no future to call back)."""
        for unit in self.units:
            for r in unit.pending:
                if not r.noted and r.work.is_completed():
                    r.noted = True
                    self._event("reduce-scatter", unit, r.start)

    @torch.no_grad()
    def _finish_backward(self) -> None:
        self._queued = False
        self._poll()
        for unit in self.units:
            for r in unit.pending:
                r.work.wait()
                if not r.noted:
                    self._event("reduce-scatter", unit, r.start)
                grad = r.out.to(unit.shard.dtype)
                if unit.shard.grad is None:
                    unit.shard.grad = grad
                else:
                    unit.shard.grad += grad
            unit.pending = []
        if self.record_timeline:
            self.timeline.append(FSDPTimeline(sorted(self._events, key=lambda e: e[2])))
            self._events = []

    # ----- the module -------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module; each unit is gathered for its own forward and freed after it."""
        self._t0 = time.perf_counter()
        self._events = []
        if self._root is not None:
            self._use_full(self._root)
            self._root.forward_start = self._now()
        out = self.module(*self._cast(args), **kwargs)
        if self._root is not None:
            self._event("compute", self._root, self._root.forward_start)
            self._after_forward(self._root, out)
        return out

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter (all its names, tied ones too) and buffer, full, on every rank."""
        result: dict[str, torch.Tensor] = {}
        for unit in self.units:
            full = torch.empty(unit.shard_size * self.world_size, dtype=unit.shard.dtype)
            _all_gather(full, unit.shard.detach(), self.process_group)
            for p, view, shape in zip(
                unit.params, full[: unit.size].split(unit.numels), unit.shapes, strict=True
            ):
                for _, _, name in self._aliases[id(p)]:
                    result[name] = view.view(shape).clone()
        for name, b in self.module.named_buffers():
            result[name] = b.detach().clone()
        return {k: result[k] for k in self._state_keys}  # the original module's order

    def shard_bytes(self) -> int:
        """Bytes of this rank's parameter shards."""
        return sum(u.shard.numel() * u.shard.element_size() for u in self.units)


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
