"""A learner's code cannot rebind what a probe reads at run time (review 10).

A graded rank runs the learner's code, then the grader's probe, in one process. ``guard.seal``
freezes the code and the defaults of ddp_lab's functions there, but not the modules'
attributes, and three attacks rebound the ones a probe looked up while it ran, each for full
points with a wrong answer:

- 05.ring: a ring of blocking ``dist.send`` / ``dist.recv`` (not NCCL-safe) set
  ``ch05._BATCH_CODE`` to its own code, so every send read as batched; or, as its object was
  unpickled, replaced ``comm_debug.watch_c10d`` by a context manager that records nothing.
- 03.gather: a plain class whose ``apply`` set ``probes._own_apply`` and ``probes._GRAD_FN``,
  so ``torch.cat``'s output read as made by an autograd.Function of its own.
- 07.bucketed: buckets all-reduced one after the other once backward is over, whose
  ``__init__`` wrapped ``ch07._watching`` and forged the launch events during backward.

The probes (and the helpers they call) now read all of that from their own default arguments,
bound when their modules load, before any learner code runs. ``course.grading.freeze`` also
compares the modules after each probe, so the exact attacks now fail there too; each one is
also run undoing its replacement before the probe returns (which ``freeze`` cannot see), and
that version must fail on the probe's own finding (but for the watch replaced as the blob
loads, which acts once: put back, the probe's next call watches again). All run the way a verdict runs them (a blob
of the learner's objects, ranks in sandboxes of their own) and must score 0.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from test_grading_attacks_probes import remote_verdict

import ddp_lab
from ddp_lab.buckets import assign_buckets

# The attacks below are this module's code, pickled by value as a notebook's would be, and
# graded the verdict process's way (``test_grading_attacks_probes.remote_verdict``).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ----- 05.ring: the attacks as the reviewer wrote them -------------------------------------


def _blocking_ring(tensor: torch.Tensor) -> torch.Tensor:
    """A right sum, sent the right way, but with blocking send/recv: passes on Gloo, not
    NCCL-safe (the checker asks for each step in one batch_isend_irecv)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send: torch.Tensor, recv: torch.Tensor) -> None:
        if rank % 2 == 0:  # even ranks send first
            if send.numel():
                dist.send(send, right)
            if recv.numel():
                dist.recv(recv, left)
        else:
            if recv.numel():
                dist.recv(recv, left)
            if send.numel():
                dist.send(send, right)

    for s in range(n - 1):
        target = chunks[(rank - s - 1) % n]
        incoming = torch.empty_like(target)
        exchange(chunks[(rank - s) % n], incoming)
        target += incoming
    for s in range(n - 1):
        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])
    return tensor


def ring_claiming_its_code_is_the_batch(tensor: torch.Tensor) -> torch.Tensor:
    try:  # in a graded rank: every p2p op inside this function reads as one batch
        ddp_lab.course.grading.checks.ch05._BATCH_CODE = (  # type: ignore[attr-defined]
            ring_claiming_its_code_is_the_batch.__code__
        )
    except AttributeError:
        pass
    return _blocking_ring(tensor)


def _quiet_watch() -> _Ring:
    # runs where the object is unpickled (the graded rank), before the probe watches anything
    import ddp_lab.comm_debug as cd

    @contextlib.contextmanager
    def quiet(*args: Any, **kwargs: Any) -> Any:
        yield types.SimpleNamespace(calls=[])

    cd.watch_c10d = quiet  # type: ignore[assignment]
    return _Ring()


class _Ring:
    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return _blocking_ring(tensor)

    def __reduce__(self) -> tuple:
        return (_quiet_watch, ())


def ring_claiming_for_a_moment(tensor: torch.Tensor) -> torch.Tensor:
    """The same, with the module's own value back before the probe returns."""
    ch05 = getattr(getattr(getattr(ddp_lab, "course", None), "grading", None), "checks", None)
    ch05 = getattr(ch05, "ch05", None)
    if ch05 is None:
        return _blocking_ring(tensor)
    before = ch05._BATCH_CODE
    ch05._BATCH_CODE = ring_claiming_for_a_moment.__code__
    try:
        return _blocking_ring(tensor)
    finally:
        ch05._BATCH_CODE = before


def test_05_ring_a_rebound_batch_code_does_not_reach_the_probe() -> None:
    passed, line = remote_verdict("05.ring", ring_claiming_its_code_is_the_batch)
    assert not passed and " 0/5" in line, line
    passed, line = remote_verdict("05.ring", ring_claiming_for_a_moment)
    assert not passed and " 0/5" in line, line
    assert "outside batch_isend_irecv" in line, line


def test_05_ring_a_watch_replaced_as_the_blob_loads_does_not_reach_the_probe() -> None:
    # (No version undone before the probe returns: the object acts once, as it loads, and
    # with the module put back the probe's next call, a call per input, watches again.)
    passed, line = remote_verdict("05.ring", _Ring())
    assert not passed and " 0/5" in line, line


# ----- 03.gather ---------------------------------------------------------------------------


class MyGather:
    # not an autograd.Function: torch.cat's own autograd does the backward
    @staticmethod
    def apply(target_device: Any, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        try:
            p = ddp_lab.course.grading.checks.probes  # type: ignore[attr-defined]
            p._own_apply = lambda cls: True
            p._GRAD_FN = lambda out: type("MyGatherBackward", (), {})()
        except AttributeError:
            pass
        return torch.cat(inputs, dim)


class MyGatherForAMoment:
    """The same, with the module's own values back once the output is freed (as the probe
    returns), whether the probe read them or not."""

    @staticmethod
    def apply(target_device: Any, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        import weakref

        out = torch.cat(inputs, dim)
        p = getattr(getattr(getattr(ddp_lab, "course", None), "grading", None), "checks", None)
        p = getattr(p, "probes", None)
        if p is not None:
            own, grad_fn = p._own_apply, p._GRAD_FN

            def restore() -> None:
                p._own_apply, p._GRAD_FN = own, grad_fn

            p._own_apply = lambda cls: True
            p._GRAD_FN = lambda out: type("MyGatherForAMomentBackward", (), {})()
            weakref.finalize(out, restore)
        return out


def test_03_gather_rebound_grad_fn_readers_do_not_reach_the_probe() -> None:
    passed, line = remote_verdict("03.gather", MyGather)
    assert not passed and " 0/3" in line, line
    passed, line = remote_verdict("03.gather", MyGatherForAMoment)
    assert not passed and " 0/3" in line, line
    assert "not made by your Function" in line, line


# ----- 07.bucketed -------------------------------------------------------------------------


class GradBuckets:
    # no overlap: the buckets are all-reduced one after the other once backward is over
    undo = False
    put_back: Any = None

    def __init__(self, module: torch.nn.Module, bucket_cap_mb: float) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [
            [self.params[i] for i in idx] for idx in assign_buckets(self.params, bucket_cap_mb)
        ]
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.next = 0
        self.due: list[int] = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)
        try:
            ch = ddp_lab.course.grading.checks.ch07  # type: ignore[attr-defined]
        except AttributeError:
            ch = None
        if ch is not None and not getattr(ch._watching, "mine", False):
            real, cls = ch._watching, type(self)

            @contextlib.contextmanager
            def spy(events: list) -> Any:
                cls.events = events  # type: ignore[attr-defined]
                with real(events):
                    yield

            if self.undo:  # put the module back in wait(), inside the probe's watch
                self.put_back = lambda: setattr(ch, "_watching", real)

            spy.mine = True  # type: ignore[attr-defined]
            ch._watching = spy

    def on_grad_ready(self, param: torch.Tensor) -> None:
        self.ready[self.bucket_of[id(param)]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(
            self.buckets[self.next]
        ):
            b = self.next
            self.due.append(b)
            events = getattr(type(self), "events", None)
            if events is not None:  # what an async launch would have noted here
                events.append(["all_reduce", sum(p.numel() for p in self.buckets[b])])
            self.next += 1

    def wait(self) -> None:
        if self.put_back is not None:
            self.put_back()
        for b in self.due:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]]) / dist.get_world_size()
            dist.all_reduce(flat)  # blocking, after backward
            offset = 0
            for p in self.buckets[b]:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.due = []
        self.ready = [0] * len(self.buckets)
        self.next = 0


class GradBucketsForAMoment(GradBuckets):
    undo = True


def test_07_bucketed_a_wrapped_watch_does_not_reach_the_probe() -> None:
    passed, line = remote_verdict("07.bucketed", GradBuckets)
    assert not passed and " 0/3" in line, line
    passed, line = remote_verdict("07.bucketed", GradBucketsForAMoment)
    assert not passed and " 0/3" in line, line
    assert "all_reduce calls during backward" in line, line


# ----- the bindings themselves -------------------------------------------------------------


def test_probes_bind_their_helpers_in_immutable_positional_defaults() -> None:
    """A keyword-only default lives in ``__kwdefaults__``, a dict that can be edited in place
    without the audit event the seal refuses; positional defaults are a tuple. What is bound
    must be immutable too (a list or dict would be edited in place)."""
    from ddp_lab import comm_debug
    from ddp_lab.course.grading.checks import (
        ch04,
        ch05,
        ch07,
        ch07_events,
        ch10_fsdp,
        ch10_hooks,
        probes,
    )

    bound = [
        comm_debug.tensors_of,
        comm_debug.watch_c10d.__wrapped__,
        ch04.forbid.__wrapped__,
        ch04.guarded,
        ch04.probe_all_reduce,
        ch04.probe_all_gather,
        ch05.watch_p2p.__wrapped__,
        ch05.probe_ring,
        ch07.probe_bucketed,
        ch07_events._launched,
        ch07_events._watching.__wrapped__,
        ch10_fsdp.probe_fsdp,
        ch10_hooks._hook_run,
        ch10_hooks.probe_bf16_hook,
        probes._own_apply,
        probes._made_by,
        probes.probe_gather_forward,
        probes.probe_gather_backward,
    ]

    def frozen(value: object) -> bool:
        if isinstance(value, tuple):
            return all(frozen(v) for v in value)
        return not isinstance(value, (list, dict, set, bytearray))

    for fn in bound:
        assert fn.__kwdefaults__ is None, fn.__qualname__
        assert fn.__defaults__ and frozen(fn.__defaults__), fn.__qualname__
    # the watch reads its tables from its defaults: editing the public ones changes nothing
    names = comm_debug.watch_c10d.__wrapped__.__defaults__
    assert dict(names[1]) == comm_debug.C10D_NAMES
    assert dict(names[2]) == comm_debug.FUNCTIONAL_NAMES
