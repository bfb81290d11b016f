"""FSDP's machinery without its gradient reduction (no exercise's answer here).

``ddp_lab.fsdp.FullyShardedDP`` (read its docstring for how FSDP works here and how it
differs from torch's ``fully_shard``) is ``FullyShardedBase`` plus the reduce-scatter of each
unit's gradient, which exercise 10.fsdp_reduce asks the learner to write. This module holds the
rest (sharding, all-gather before use, free after it, gather again for backward, the hooks), so
that the grader's ranks can train with the learner's ``reduce_grad`` while ``ddp_lab.fsdp`` is
hidden from them. It mirrors the split in torch: ``_fsdp_param_group.py`` (the machinery) and
``_fsdp_collectives.py`` (``foreach_reduce``: the reduce-scatter) in
``torch/distributed/fsdp/_fully_shard/``.
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
from ddp_lab.tools.doctor_facts import collective


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    collective("all_gather_single")(out, inp, group=group)


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
    def forward(
        ctx: Any, shard: torch.Tensor, owner: FullyShardedBase, unit: _Unit
    ) -> torch.Tensor:
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


class FullyShardedBase(nn.Module):
    """ZeRO-3's machinery: sharded parameters, gathered for use and freed; the gradient
    reduction is ``reduce_grad``'s (``ddp_lab.fsdp.FullyShardedDP`` adds the default one).

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
        self._reduce_default(unit, grad_full)

    def _reduce_default(self, unit: _Unit, grad_full: torch.Tensor) -> None:
        """The reduction without ``reduce_grad``: ``ddp_lab.fsdp.FullyShardedDP``'s."""
        raise NotImplementedError(
            _t(
                "FullyShardedBase reduces gradients only with the reduce_grad you pass; "
                "ddp_lab.fsdp.FullyShardedDP reduce-scatters them itself."
            )
        )

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
