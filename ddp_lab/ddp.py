"""Naive DDP: broadcast rank 0's state at construction, average gradients after backward.

This is the smallest correct data-parallel wrapper: every rank holds a full replica, the
replicas start identical because rank 0's parameters and buffers are broadcast when the
wrapper is built, and they stay identical because every rank applies the same averaged
gradient. ``NaiveDDP`` trains to the same parameters as ``torch.nn.parallel.
DistributedDataParallel`` (tested on 2 and 4 ranks, see tests/test_ddp.py).

How the teaching version differs from PyTorch's ``DistributedDataParallel``:
- gradients are averaged by an explicit ``sync_gradients()`` call after ``backward()``, one
  blocking ``all_reduce`` per parameter (torch does it during backward, in buckets, and
  overlaps it with the backward computation: see ``ddp_lab.bucketed_ddp``);
- a parameter that needs a gradient but got none in this backward gets a zero gradient, so
  every rank runs the same collectives (torch raises an error unless
  ``find_unused_parameters=True``);
- no ``device_ids``, ``no_sync``, comm hooks, static graph or mixed precision.

Buffers follow torch 2.13 (``torch/nn/parallel/distributed.py``, ``__init__``):
``forward_sync_buffers`` (default True) copies rank 0's buffers before each training
forward and never affects the sync at construction; the deprecated ``broadcast_buffers``
still works, with its old meaning: ``broadcast_buffers=False`` also leaves the buffers out
of the sync at construction (``forward_sync_buffers=False`` does not).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.i18n import _t


def resolve_buffer_sync(
    broadcast_buffers: bool | None, forward_sync_buffers: bool | None
) -> tuple[bool, bool]:
    """(sync buffers before forward, sync buffers at construction), as torch 2.13 decides.

    Mirrors ``DistributedDataParallel.__init__``: ``forward_sync_buffers`` wins and leaves
    the construction sync on; the deprecated ``broadcast_buffers`` sets both (with a
    FutureWarning); neither given means both on.
    """
    import warnings

    if broadcast_buffers is not None:
        if forward_sync_buffers is not None:
            why = _t(
                "Both `broadcast_buffers` and `forward_sync_buffers` were given: "
                "`broadcast_buffers` is deprecated and ignored."
            )
        else:
            why = _t(
                "`broadcast_buffers` is deprecated (torch 2.13): use "
                "`forward_sync_buffers`. Unlike `broadcast_buffers=False`, "
                "`forward_sync_buffers=False` still syncs the buffers at construction."
            )
        warnings.warn(why, FutureWarning, stacklevel=3)
    if forward_sync_buffers is not None:
        return bool(forward_sync_buffers), True
    sync = True if broadcast_buffers is None else bool(broadcast_buffers)
    return sync, sync


def check_wrappable(module: Any, what: str) -> None:
    """Raise a clear error before anything starts if ``module`` cannot be wrapped."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            _t("{what} wraps a torch.nn.Module, got {value!r}.", what=what, value=module)
        )
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            _t(
                "{what} needs an initialised process group: call "
                "dist.init_process_group(...) first (or use dl.spawn(..., "
                "backend='gloo')).",
                what=what,
            )
        )


def module_states(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter (frozen ones too) and every buffer: what must start identical."""
    return [p.data for p in module.parameters()] + list(module.buffers())


@torch.no_grad()
def broadcast_state(tensors: list[torch.Tensor], src: int = 0, group: Any = None) -> None:
    """Overwrite ``tensors`` on every rank with rank ``src``'s values, in place.

    Torch coalesces the tensors into a few large broadcasts (``_broadcast_coalesced``);
    one broadcast per tensor gives the same values.
    """
    for tensor in tensors:
        dist.broadcast(tensor, src=src, group=group)


@torch.no_grad()
def average_gradients(params: list[nn.Parameter], group: Any = None) -> None:
    """Replace every ``param.grad`` by its mean over the ranks of ``group``, in place."""
    world_size = dist.get_world_size(group)
    for p in params:
        if p.grad is None:
            # Every rank must call the same collectives in the same order, or they hang.
            p.grad = torch.zeros_like(p)
        # Divide first, then sum, like torch's reducer: the same rounding as torch DDP.
        p.grad.div_(world_size)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)


class NaiveDDP(nn.Module):
    """Data parallel in a few lines: a replica per rank, kept identical by collectives.

    Use it like ``DistributedDataParallel``, plus one call after ``backward()``::

        model = NaiveDDP(net)            # rank 0's parameters and buffers everywhere
        loss = loss_fn(model(x), y)      # x is this rank's part of the global batch
        loss.backward()
        model.sync_gradients()           # gradients averaged over the ranks
        optimizer.step()

    Args:
        broadcast_buffers: deprecated like torch's (2.13); False also skips the buffers in
            the sync at construction.
        forward_sync_buffers: like torch DDP, copy rank 0's buffers (e.g. BatchNorm running
            statistics) to every rank before each training forward (default True); the
            construction sync copies them whatever this says.
    """

    def __init__(
        self,
        module: nn.Module,
        broadcast_buffers: bool | None = None,
        process_group: Any = None,
        forward_sync_buffers: bool | None = None,
    ) -> None:
        check_wrappable(module, "NaiveDDP")
        forward_sync, init_buffers = resolve_buffer_sync(broadcast_buffers, forward_sync_buffers)
        super().__init__()
        self.module = module
        self.forward_sync_buffers = forward_sync
        self.process_group = process_group
        self._sync_buffers_next = True
        # Ranks built their models from different random states (or only rank 0 loaded a
        # checkpoint): from here on, every rank holds rank 0's model.
        states = module_states(module) if init_buffers else [p.data for p in module.parameters()]
        broadcast_state(states, src=0, group=process_group)

    @property
    def broadcast_buffers(self) -> bool:
        """The deprecated name of ``forward_sync_buffers`` (as in torch 2.13)."""
        return self.forward_sync_buffers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; first copy rank 0's buffers if ``forward_sync_buffers``."""
        if self.forward_sync_buffers and self._sync_buffers_next:
            broadcast_state(list(self.module.buffers()), src=0, group=self.process_group)
        # torch's rule: buffers are synced before a forward only if the previous forward
        # was a training one (grad enabled); after an eval forward they are not.
        self._sync_buffers_next = torch.is_grad_enabled()
        return self.module(*args, **kwargs)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters whose gradients are averaged (frozen ones are left alone)."""
        return (p for p in self.module.parameters() if p.requires_grad)

    def sync_gradients(self) -> None:
        """Average the gradients over the ranks; call it after ``backward()``."""
        average_gradients(list(self.trainable_parameters()), group=self.process_group)


@torch.no_grad()
def max_difference_across_ranks(module: nn.Module, group: Any = None) -> float:
    """The largest difference of any parameter or buffer element between two ranks.

    0.0 means every rank holds bitwise the same model. Each rank must call it.
    """
    states = [t.detach().reshape(-1).double() for t in module_states(module)]
    flat = torch.cat(states) if states else torch.zeros(1, dtype=torch.float64)
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    return float((high - low).max()) if flat.numel() else 0.0
