"""A graded rank whose modules or classes the learner's code changed answers that, not the
probe's result (``course.grading.freeze``; review 10).

The seal refuses new code for the grader's and torch's functions, but a module's global or a
class's attribute is set without an audit event: a ``__reduce__`` in the learner's blob
replaced ``ddp_lab.comm_debug.watch_c10d`` and a blocking ring got 05.ring 5/5. The rank notes
what its modules and classes hold before the blob loads and compares after each probe.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import cloudpickle
import torch
import torch.distributed as dist
from test_grading_attacks_probes import remote_verdict

SNAPSHOT = textwrap.dedent(
    """
    import builtins
    import torch, torch.distributed
    import ddp_lab
    from ddp_lab.course.grading import freeze
    from ddp_lab.course.grading.rankserve import probe_table
    from ddp_lab.course.grading.checks import ch05, ch11
    from ddp_lab.course.grading.learner import _refusing_init

    probe_table()  # the rank's modules, as before it says ready
    snap = freeze.take()
    # torch loading more of itself changes what it holds: none of that is the learner's
    import torch._dynamo  # wraps torch.manual_seed
    import torch.distributed.tensor, torch.distributed.checkpoint, torch.distributed.fsdp
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # wraps SGD.step
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=0.1)
    print("torch's own", freeze.changed(snap))
    import ddp_lab.comm_debug as cd
    real = cd.watch_c10d
    cd.watch_c10d = lambda *a, **k: None
    print("global", freeze.changed(snap))
    cd.watch_c10d = real
    print("put back", freeze.changed(snap))
    detach = torch.Tensor.__dict__["detach"]
    torch.Tensor.detach = lambda self: self
    print("class", freeze.changed(snap))
    torch.Tensor.detach = detach
    torch.nn.ReLU.__call__ = lambda self, x: x  # hides Module.__call__: an addition
    print("added", freeze.changed(snap))
    del torch.nn.ReLU.__call__
    ch05.len = lambda x: 0  # hides the builtin for ch05's functions
    print("shadow", freeze.changed(snap))
    del ch05.len
    ch11.probe_stop.__kwdefaults__.update({k: None for k in ch11.probe_stop.__kwdefaults__})
    print("kwdefaults", freeze.changed(snap)[:1])
    ch11.probe_stop.__kwdefaults__.update({k: v for _, o, k, v in snap[2] if o.endswith("probe_stop()")})
    real_len = len
    builtins.len = lambda x: 0
    print("builtin", freeze.changed(snap))
    builtins.len = real_len
    torch.nn.Linear.__init__ = _refusing_init  # the grader's own refusal in a sealed rank
    print("stub", freeze.changed(snap, (_refusing_init,)))
    """
)


def test_what_the_learner_s_code_changes_is_seen_and_torch_s_own_changes_are_not() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SNAPSHOT], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "torch's own []",
        "global ['ddp_lab.comm_debug.watch_c10d']",
        "put back []",
        "class ['torch.Tensor.detach']",
        "added ['torch.nn.modules.activation.ReLU.__call__']",
        "shadow ['ddp_lab.course.grading.checks.ch05.len']",
        "kwdefaults ['ddp_lab.course.grading.checks.ch11.probe_stop()._loop']",
        "builtin ['builtins.len']",
        "stub []",
    ], out.stdout + out.stderr[-2000:]


_SAVED: dict = {}


def _hide_detach() -> None:
    # The probe keeps "the caller's tensor" as ``given.detach()`` after the learner's call: a
    # ``detach`` that hands back a copy saved before the in-place all-reduce hides it (a class
    # attribute, set without an audit event, from a ``__reduce__`` as the rank loads the blob).
    real = torch.Tensor.detach

    def detach(self: torch.Tensor) -> torch.Tensor:
        saved = _SAVED.get(id(self))
        return saved if saved is not None else real(self)

    torch.Tensor.detach = detach


class _HideDetachOnLoad:
    def __reduce__(self) -> tuple:
        return (_hide_detach, ())


_HIDE = _HideDetachOnLoad()


def in_place_average_hidden(value: torch.Tensor) -> torch.Tensor:
    _HIDE  # noqa: B018  # pickled with the function: runs when a rank loads it
    _SAVED[id(value)] = value.clone()
    dist.all_reduce(value)  # wrong: the caller's tensor, in place
    value /= dist.get_world_size()
    return value.clone()


def test_a_class_attribute_set_as_the_rank_loads_the_blob_fails_the_case() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
    passed, line = remote_verdict("00.average", in_place_average_hidden)
    assert not passed and " 0/2" in line, line
    assert "replaced torch.Tensor.detach" in line, line
