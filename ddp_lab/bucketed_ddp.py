"""Bucketed DDP: all-reduce gradient buckets during backward, overlapping communication.

Each trainable parameter gets a post-accumulate-grad hook. When a gradient is ready, the
hook copies it into its slot of its bucket's flat buffer, multiplied by 1/world_size; when
a bucket's last gradient is in, the buffer is sent with an asynchronous ``all_reduce`` and
backward goes on computing the earlier layers' gradients meanwhile. A callback queued on the autograd engine runs when backward ends:
it waits for every bucket and copies the averaged values back into ``param.grad``, so
``loss.backward()`` returns with synchronised gradients, as under torch's DDP.

How the teaching version differs from PyTorch's ``DistributedDataParallel``:
- the reducer is ~100 lines of Python instead of C++ (``torch/csrc/distributed/c10d/
  reducer.cpp``); as in torch, each gradient is copied into its slot of the bucket as soon
  as it is ready, already multiplied by 1/world_size (``Reducer::mark_variable_ready_dense``),
  and the bucket is all-reduced when its last gradient is in (torch can also make the
  gradients views of the bucket, ``gradient_as_bucket_view=True``);
- the buckets are fixed at construction by ``assign_buckets``: the plan torch's DDP
  rebuilds after its first iteration, assuming gradients arrive in reverse definition order
  (torch uses one unbounded bucket for the first iteration and then measures the order);
- a parameter without a gradient raises an error at the end of backward (torch's
  ``find_unused_parameters=True`` marks it ready instead); one dtype and device per model;
- no comm hooks, static graph, join or mixed precision.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from ddp_lab.buckets import MB, assign_buckets, check_cap
from ddp_lab.ddp import broadcast_state, check_wrappable, module_states, resolve_buffer_sync
from ddp_lab.i18n import _t


@dataclass
class StepTimeline:
    """What happened in one training step, in seconds since its forward began."""

    forward: tuple[float, float] = (0.0, 0.0)
    grads: list[tuple[float, str]] = field(default_factory=list)
    comm: list[tuple[float, float]] = field(default_factory=list)  # (launch, done) per bucket
    synced: float = 0.0  # when backward returned with every bucket averaged

    @property
    def backward_end(self) -> float:
        """When the last gradient was ready."""
        return max(t for t, _ in self.grads)

    def overlap(self) -> float:
        """Fraction of the communication time spent while backward was still running."""
        end = self.backward_end
        total = sum(done - start for start, done in self.comm)
        hidden = sum(max(0.0, min(done, end) - start) for start, done in self.comm)
        return hidden / total if total > 0 else 0.0


class _Bucket:
    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.flat = torch.empty(
            sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
        )
        # One view per parameter, shaped like it, into the flat buffer sent to all_reduce.
        self.views = [
            v.view_as(p)
            for v, p in zip(self.flat.split([p.numel() for p in params]), params, strict=True)
        ]
        self.view_of = {id(p): v for p, v in zip(params, self.views, strict=True)}
        self.pending = len(params)
        self.work: Any = None


class BucketedDDP(nn.Module):
    """DDP with gradient buckets all-reduced asynchronously while backward runs.

    Used exactly like ``DistributedDataParallel``: forward, ``loss.backward()``,
    ``optimizer.step()``; ``with model.no_sync():`` accumulates gradients locally.

    Args:
        bucket_cap_mb: bucket size in MiB; None gives torch's default (25, first bucket 1).
        record_timeline: keep a ``StepTimeline`` per step in ``self.timeline``.
        forward_sync_buffers, broadcast_buffers: as in torch 2.13 (see ``ddp_lab.ddp``).
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_cap_mb: float | None = None,
        broadcast_buffers: bool | None = None,
        process_group: Any = None,
        record_timeline: bool = False,
        forward_sync_buffers: bool | None = None,
    ) -> None:
        check_cap(bucket_cap_mb)
        check_wrappable(module, "BucketedDDP")
        params = [p for p in module.parameters() if p.requires_grad]
        kinds = {(str(p.dtype), str(p.device)) for p in params}
        if len(kinds) > 1:
            raise ValueError(
                _t(
                    "BucketedDDP needs every trainable parameter on one dtype and device; "
                    "got {kinds}.",
                    kinds=sorted(kinds),
                )
            )
        super().__init__()
        self.module = module
        self.forward_sync_buffers, init_buffers = resolve_buffer_sync(
            broadcast_buffers, forward_sync_buffers
        )
        self.process_group = process_group
        self.require_backward_grad_sync = True  # the flag torch's no_sync() turns off
        self.record_timeline = record_timeline
        self.timeline: list[StepTimeline] = []
        self._world_size = dist.get_world_size(process_group)
        self._names = {id(p): n for n, p in module.named_parameters()}
        states = module_states(module) if init_buffers else [p.data for p in module.parameters()]
        broadcast_state(states, src=0, group=process_group)
        self.bucket_indices = assign_buckets(params, bucket_cap_mb)
        self.buckets = [_Bucket([params[i] for i in idx]) for idx in self.bucket_indices]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._next = 0  # buckets are launched in index order: the same order on every rank
        self._queued = False
        self._sync_buffers_next = True
        self._expect_hooks = False  # set by a forward outside no_sync(), cleared at the end
        self._t0 = 0.0
        self._step: StepTimeline | None = None
        self._launched: dict[int, float] = {}
        self._done: dict[int, float] = {}
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    @property
    def broadcast_buffers(self) -> bool:
        """The deprecated name of ``forward_sync_buffers`` (as in torch 2.13)."""
        return self.forward_sync_buffers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module, after copying rank 0's buffers (torch's rule)."""
        self._t0 = time.perf_counter()
        if self.forward_sync_buffers and self._sync_buffers_next:
            broadcast_state(list(self.module.buffers()), src=0, group=self.process_group)
        self._sync_buffers_next = torch.is_grad_enabled() and self.require_backward_grad_sync
        out = self.module(*args, **kwargs)
        # torch decides here, in the forward, whether the next backward all-reduces
        # (DistributedDataParallel._post_forward -> reducer.prepare_for_backward, and the
        # reducer's hooks return early unless expect_autograd_hooks_): so the FORWARD's
        # side of no_sync() counts, not the backward's.
        self._expect_hooks = self._sync_buffers_next
        if self.record_timeline and self._sync_buffers_next:
            self._step = StepTimeline(forward=(0.0, self._now()))
        return out

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards inside skip the gradient sync of their backward (decided in the forward,
        as torch does: a backward inside after a forward outside still syncs)."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self._expect_hooks:
            return
        if not self._queued:
            # Runs once backward has finished: like the C++ reducer's finalize_backward.
            Variable._execution_engine.queue_callback(self._finalize)
            self._queued = True
        if self._step is not None:
            self._step.grads.append((self._now(), self._names.get(id(param), "?")))
        bucket = self._bucket_of[id(param)]
        with torch.no_grad():
            # Copy into the bucket slot now, scaled by 1/world_size, as torch's reducer does
            # (mark_variable_ready_dense: at::mul_out(bucket_view, grad, 1. / div_factor_)).
            torch.mul(param.grad, 1.0 / self._world_size, out=bucket.view_of[id(param)])
        bucket.pending -= 1
        # Launch only in bucket order, even if a later bucket filled first, so that every
        # rank issues the same collectives in the same order.
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._launch(self._next)
            self._next += 1

    @torch.no_grad()
    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        start = self._now()
        # every gradient is already in its slot, divided by the world size: sum them now
        bucket.work = dist.all_reduce(bucket.flat, group=self.process_group, async_op=True)
        if self._step is not None:
            done = self._done
            # Runs on the backend's thread when the all-reduce has finished.
            bucket.work.get_future().then(lambda _: done.__setitem__(index, self._now()))
            self._launched[index] = start

    @torch.no_grad()
    def _finalize(self) -> None:
        try:
            missing = [i for i, b in enumerate(self.buckets) if b.work is None]
            if missing:
                names = [
                    self._names.get(id(p), "?")
                    for i in missing
                    for p in self.buckets[i].params
                    if p.grad is None
                ]
                raise RuntimeError(
                    _t(
                        "Backward ended but bucket(s) {buckets} never got the gradients of "
                        "{names}: those parameters took no part in computing the loss. torch's "
                        "DDP raises a similar error unless find_unused_parameters=True.",
                        buckets=missing,
                        names=names,
                    )
                )
            for bucket in self.buckets:
                bucket.work.wait()
                torch._foreach_copy_([p.grad for p in bucket.params], bucket.views)
            if self._step is not None:
                self._step.synced = self._now()
                while len(self._done) < len(self.buckets):  # the last callbacks may lag
                    time.sleep(1e-4)
                self._step.comm = [
                    (self._launched[i], self._done[i]) for i in range(len(self._done))
                ]
                self.timeline.append(self._step)
        finally:
            for b in self.buckets:
                b.pending, b.work = len(b.params), None
            self._next, self._queued, self._step = 0, False, None
            self._expect_hooks = False
            self._launched, self._done = {}, {}


def plot_timeline(step: StepTimeline, ax: Any = None) -> Any:
    """Draw one step: forward, gradients becoming ready, each bucket's all-reduce."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * len(step.comm)))
    ms = 1000.0
    f0, f1 = step.forward
    ax.broken_barh([(f0 * ms, (f1 - f0) * ms)], (0.6, 0.8), color="tab:gray")
    ax.broken_barh([(f1 * ms, (step.backward_end - f1) * ms)], (0.6, 0.8), color="tab:blue")
    ax.plot([t * ms for t, _ in step.grads], [1.0] * len(step.grads), "k|", markersize=12)
    for i, (start, done) in enumerate(step.comm):
        ax.broken_barh([(start * ms, (done - start) * ms)], (1.6 + i, 0.8), color="tab:orange")
    ax.axvline(step.synced * ms, color="tab:red", linestyle="--")
    ax.set_yticks([1.0] + [2.0 + i for i in range(len(step.comm))])
    ax.set_yticklabels(
        [_t("forward | backward")]
        + [_t("all-reduce bucket {i}", i=i) for i in range(len(step.comm))]
    )
    ax.set_xlabel(_t("ms since the forward began (red: backward() returned)"))
    ax.set_title(
        _t("communication hidden behind backward: {step_overlap:.0%}", step_overlap=step.overlap())
    )
    return ax


def bucket_plan(module: nn.Module, bucket_cap_mb: float | None) -> list[list[str]]:
    """The names of the trainable parameters in each bucket, in all-reduce order."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    return [
        [named[i][0] for i in idx] for idx in assign_buckets([p for _, p in named], bucket_cap_mb)
    ]


def bucket_widget(
    module: nn.Module, caps_mb: Sequence[float] = (0.05, 0.1, 0.25, 0.5, 1, 25)
) -> Any:
    """A slider over ``bucket_cap_mb`` that draws which parameters share a bucket."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    sizes = [p.numel() * p.element_size() / MB for _, p in named]

    def draw(bucket_cap_mb: float) -> None:
        plan = assign_buckets([p for _, p in named], bucket_cap_mb)
        _, ax = plt.subplots(figsize=(8, 0.3 * len(named) + 1))
        colors = plt.get_cmap("tab10")
        for b, idx in enumerate(plan):
            for i in idx:
                ax.barh(i, sizes[i], color=colors(b % 10))
                ax.text(sizes[i], i, " " + _t("bucket") + " " + f"{b}", va="center")
        ax.set_yticks(range(len(named)), [n for n, _ in named])
        ax.invert_yaxis()
        ax.set_xlabel(_t("gradient size (MiB)"))
        ax.set_title(
            _t(
                "bucket_cap_mb={bucket_cap_mb}: {plan} bucket(s)",
                bucket_cap_mb=bucket_cap_mb,
                plan=len(plan),
            )
        )
        plt.show()

    slider = widgets.SelectionSlider(
        options=list(caps_mb),
        value=caps_mb[0],
        description="bucket_cap_mb",
        style={"description_width": "initial"},  # not cut to "bucket_ca..."
    )
    return widgets.interactive(draw, bucket_cap_mb=slider)
