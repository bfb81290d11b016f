"""A rank's probe cannot be swapped by the learner's objects as the rank loads them (review 9).

The rank resolves the probe, then unpickles the learner's blob in the same process: a
``__reduce__`` in it ran the learner's code there and replaced the probe's ``__code__``
(00.average 2/2 for an in-place average, 12.tp_pair 3/3, 06.indices 4/4 in a locked rank) or
the module attribute a reused rank resolved the next probe by (03.gather 3/3 for a zero
backward). ``guard.seal`` refuses the first (the audit event of a function's ``__code__`` /
``__defaults__`` / ``__kwdefaults__``), ``rankserve.probe_table`` the second (the probes are
resolved from a table built before any blob is loaded).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import RemoteLearner
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.runtime import _pickle


def _checks_module(name: str) -> Any:
    """``ddp_lab.course.grading.checks.<name>`` if this process has it (a rank), else None;
    by attributes, as the attack did (no import of a hidden module)."""
    mod: Any = ddp_lab
    for part in ("course", "grading", "checks", name):
        mod = getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def _fake_mean(rank, objects, mine):  # noqa: ANN001, ANN202, ARG001
    (fn,) = objects
    out = fn(mine.clone())
    return {"out": out.detach(), "after": mine.detach()}  # "the caller's tensor": untouched


def _swap_code() -> None:
    mod = _checks_module("ch00")
    if mod is not None:
        mod.probe_mean.__code__ = _fake_mean.__code__  # the very object the rank resolved


class _SwapCodeOnLoad:
    def __reduce__(self) -> tuple:
        return (_swap_code, ())


_SWAP_CODE = _SwapCodeOnLoad()


def in_place_average(value: torch.Tensor) -> torch.Tensor:
    _SWAP_CODE  # noqa: B018  # pickled with the function: runs when a rank loads it
    dist.all_reduce(value, op=dist.ReduceOp.SUM)  # wrong: the caller's tensor, in place
    value /= dist.get_world_size()
    return value


def _fake_forward(rank, objects, case):  # noqa: ANN001, ANN202, ARG001
    (cls,) = objects
    dim, parts = case
    return {
        "out": torch.cat(parts, dim),
        "grad_fn": cls.__name__ + "Backward",
        "function": cls.__name__,
    }


def _fake_backward(rank, objects, case):  # noqa: ANN001, ANN202, ARG001
    (cls,) = objects
    dim, parts, weight = case
    leaves = [p.clone().requires_grad_() for p in parts]
    (torch.cat(leaves, dim) * weight).sum().backward()
    return {
        "grads": [x.grad for x in leaves],
        "grad_fn": cls.__name__ + "Backward",
        "function": cls.__name__,
    }


def _swap_attributes() -> None:
    mod = _checks_module("probes")
    if mod is not None:  # the names a reused rank resolved its next probe by
        mod.probe_gather_forward = _fake_forward
        mod.probe_gather_backward = _fake_backward


class _SwapAttributesOnLoad:
    def __reduce__(self) -> tuple:
        return (_swap_attributes, ())


class ZeroBackwardGather(torch.autograd.Function):
    _on_load = _SwapAttributesOnLoad()

    @staticmethod
    def forward(ctx, target_device, dim, *inputs):  # noqa: ANN001, ANN205, ARG004
        ctx.shapes = [t.shape for t in inputs]
        return torch.cat(inputs, dim)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        return (None, None, *[grad_output.new_zeros(s) for s in ctx.shapes])  # wrong


def remote_verdict(grade_id: str, *objects: Any) -> tuple[bool, str]:
    """The verdict process's way: the objects as a blob, ranks in sandboxes of their own."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
    blob = _pickle.dumps(objects)
    learner = RemoteLearner(grade_id, None, None, lambda: None, blob, "en", 0, RankPool)  # type: ignore[arg-type]
    try:
        return run_checker(load_checkers()[grade_id], learner, "en")
    finally:
        learner.close()


def test_a_probe_s_code_swapped_as_the_rank_loads_the_blob_is_refused() -> None:
    passed, line = remote_verdict("00.average", in_place_average)
    assert not passed and " 0/2" in line, line
    assert "changing __code__ of a function of ddp_lab or torch" in line, line


def test_a_probe_replaced_by_name_is_not_what_a_reused_rank_calls() -> None:
    # 03.gather runs its forward probe, then its backward probe in the same ranks: the
    # backward probe was resolved by its module attribute, after the forward probe's blob ran.
    passed, line = remote_verdict("03.gather", ZeroBackwardGather)
    assert not passed and " 0/3" in line, line


SEALED = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from ddp_lab.course.grading import guard
    from ddp_lab.course.grading.checks import ch00, ch11
    from ddp_lab.course.grading.guard import Refused
    from ddp_lab.course.grading.learner import _stub_code, refuse, stub_codes

    def mine(x=1, *, y=2):
        return x

    def other():
        return 0

    def road(name, fn):
        try:
            fn()
        except Refused as exc:
            print("refused", name)
        else:
            print("open", name)

    guard.seal(stubs=stub_codes())
    road("probe code", lambda: setattr(ch00.probe_mean, "__code__", other.__code__))
    road("torch defaults", lambda: setattr(F.dropout, "__defaults__", (0.0, False, False)))
    road("torch kwdefaults", lambda: setattr(torch.Tensor.backward, "__kwdefaults__", {"x": 1}))
    # 11.resume's probes bind their helpers as keyword defaults at import
    road("probe kwdefaults", lambda: setattr(ch11.probe_stop, "__kwdefaults__", {}))
    road("helper code", lambda: setattr(ch11.resumable_loop, "__code__", other.__code__))
    ch00.probe_mean.__module__ = "__main__"  # a __module__ is the learner's to set
    road("renamed probe code", lambda: setattr(ch00.probe_mean, "__code__", other.__code__))
    road("own code", lambda: setattr(mine, "__code__", other.__code__))
    road("own defaults", lambda: setattr(mine, "__defaults__", (3,)))
    state, me, kit, seal = guard._audit.__defaults__
    road("unseal", lambda: setattr(guard._audit, "__defaults__", (state, me, kit, ())))
    road("unseal by push", lambda: guard.push(["x"], "-", []))
    road("still sealed", lambda: setattr(ch00.probe_mean, "__defaults__", (1,)))
    # what only makes a function refuse: the grader's own ``refuse`` in a probe (06, 04)
    with refuse({"F.dropout": F.dropout}):
        road("refused in refuse", lambda: F.dropout(torch.ones(2)))
    road("refused for good", lambda: F.dropout(torch.ones(2)))  # nothing restored
    road("made code", lambda: setattr(F.dropout, "__code__", _stub_code(0).replace()))
    # the process's memory (a graded rank's token: rankserve), read or written; /proc's rest
    import os
    road("memory", lambda: open("/proc/self/mem", "rb"))
    road("memory by bytes", lambda: os.open(b"/proc/self/mem", os.O_RDONLY))
    road("maps", lambda: open("/proc/self/maps").close())
    """
)


def test_a_sealed_process_refuses_new_code_for_the_grader_s_and_torch_s_functions() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SEALED], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.stdout.splitlines() == [
        "refused probe code",
        "refused torch defaults",
        "refused torch kwdefaults",
        "refused probe kwdefaults",
        "refused helper code",
        "refused renamed probe code",
        "open own code",
        "open own defaults",
        "refused unseal",
        "open unseal by push",  # a refusal may still be pushed: the seal stays in it
        "refused still sealed",
        "refused refused in refuse",
        "refused refused for good",
        "refused made code",
        "refused memory",
        "refused memory by bytes",
        "open maps",
    ], out.stdout + out.stderr[-3000:]
