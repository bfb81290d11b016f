"""No built-in collective in the ranks of a hand-written-collective exercise, whatever the road.

``ch04.forbid`` switches the ``torch.distributed`` functions off around the learner's call; a
learner can still reach the same collectives by other roads: the process group's own methods
(``dist.group.WORLD.allreduce``), a new group (``dist.new_group``), the functional collectives,
the ``torch.ops.c10d`` operators, or the backend object itself (``pg._get_backend(...)``,
``ProcessGroupGloo.allreduce``). Every one of the first four ends in one of the ``c10d::``
operators of PyTorch's dispatcher (``torch/csrc/distributed/c10d/Ops.cpp``: the
``ProcessGroup`` methods call them, and their kernels call the backend); the backend's own
Python methods do not.

``lock`` (run by ``course.grading.rankhost`` in a graded rank *before* the learner's objects are
unpickled, so no learner code runs before it) therefore
- registers a kernel that raises ``Forbidden`` over every ``c10d::`` operator the exercise does
  not allow, for every dispatch key that has a kernel of it (``torch.library``; PyTorch warns
  that a kernel is overridden): the devices, and ``SparseCPU`` / ``SparseCUDA`` of
  ``allreduce_`` (a sparse tensor's all-reduce, which reached gloo's own while only the devices
  were locked: 04.all_reduce's full points),
- replaces every collective method of every backend class (``Backend`` and its subclasses:
  ``ProcessGroupGloo``, ...) the exercise does not allow with one that raises ``Forbidden``,
- pushes a refusal of the guard's audit hook (``course.grading.guard``) for the rank's life:
  ``ctypes``, a write to ``/proc`` (``/proc/self/mem``), ``gc.get_objects`` / ``get_referrers``
  / ``get_referents``, and another program (a Python without the lock). With ``ctypes`` the
  learner's code found the registration in the process's memory and reset it (or could call
  the C++ collectives directly): the real kernels were back (04.all_reduce full points, its
  code run as the blob was unpickled, before any exercise's own refusal).

It lasts for the rank's life: a graded rank serves one exercise, then is killed, and its ranks
are reused only by probes that declare the same protection (``rankhost.RankPool``). The
original kernels live in C++ only: no Python object holds them for the learner to find, and no
Python object holds the registration either (``_keep_for_life``), so the learner's code cannot
drop it to bring them back.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from typing import Any

# The point-to-point operators every hand-written collective is built from, and the barrier
# (it moves no data).
POINT_TO_POINT = frozenset(
    {"send", "recv_", "recv_any_source_", "barrier", "monitored_barrier_", "check_for_nan"}
)
# Backend methods that move data between ranks; a lock leaves those it allows.
BACKEND_METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "allgather",
    "allgather_coalesced",
    "_allgather_base",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "broadcast",
    "reduce",
)
DEVICES = ("CPU", "CUDA", "PrivateUse1", "Meta")
# Allowed operators that move no data: left out of what a refusal tells the learner to use.
NOT_DATA = frozenset({"barrier", "monitored_barrier_", "check_for_nan"})

_locked: list[str] = []  # the operators locked in this process (``lock``), once


class Forbidden(RuntimeError):
    """A built-in collective the exercise asks the learner to build."""


def _refusing(name: str) -> Any:
    def refused(*args: object, **kwargs: object) -> None:
        raise Forbidden(name)

    return refused


def _keep_for_life(library: Any) -> None:
    """Make ``library``'s registrations last for the process's life, out of reach.

    A ``torch.library.Library`` undoes its kernels when it is destroyed (``_destroy``, or the
    ``weakref.finalize`` that runs ``_del_library`` and ``m.reset()``): held in a list here,
    the learner's code could clear the list (or call the finalizer) and get the real
    ``c10d::`` kernels back. So the finalizer is detached, and the C++ handle ``library.m``
    gets one reference that no Python object holds (it is not tracked by ``gc`` either);
    ``library`` itself is then dropped."""
    import ctypes
    import weakref

    for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        found = finalizer.peek()
        if found is not None and found[0] is library:
            finalizer.detach()
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library.m))


def c10d_operators() -> list[str]:
    """The names of the ``c10d::`` operators registered in this process."""
    import torch
    import torch.distributed  # noqa: F401  # registers the operators

    names = torch._C._dispatch_get_all_op_names()
    return sorted({n.split("::", 1)[1].split(".")[0] for n in names if n.startswith("c10d::")})


def kernel_keys(op: str) -> list[str]:
    """The dispatch keys of ``c10d::op`` to lock: ``DEVICES``, and every other key that has
    a kernel of it in this build (``SparseCPU`` for ``allreduce_``, ...)."""
    import torch

    keys = list(DEVICES)
    for key in torch._C.DispatchKey.__members__:
        try:
            has = torch._C._dispatch_has_kernel_for_dispatch_key(f"c10d::{op}", key)
        except (RuntimeError, TypeError, ValueError):
            continue  # not a key a kernel is registered for
        if has and key not in keys:
            keys.append(key)
    return keys


def lock(allowed: frozenset[str] | set[str]) -> list[str]:
    """Make every ``c10d::`` operator not in ``allowed`` (operator names, e.g. ``reduce_``)
    and every backend method not in ``allowed`` (method names, e.g. ``reduce``) raise
    ``Forbidden``, and refuse what could undo that (the guard, locked); the operators
    locked."""
    import torch
    from torch._C import _distributed_c10d as c10d

    from ddp_lab.comm_debug import C10D_NAMES

    allowed = frozenset(allowed) | POINT_TO_POINT
    if _locked:  # locked already (a rank serves one exercise's cases one after the other)
        return []
    locked = [op for op in c10d_operators() if op not in allowed]
    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        for op in locked:
            for key in kernel_keys(op):
                try:
                    # refused by the name a learner writes (allreduce_ -> all_reduce), so
                    # the verdict names the collective whatever road reached it
                    library.impl(op, _refusing(C10D_NAMES.get(op, op.strip("_"))), key)
                except (RuntimeError, ValueError):
                    continue  # no such device in this build
    _keep_for_life(library)  # uses ctypes: before the guard's refusal below
    _locked[:] = locked or ["-"]
    backends = [
        cls
        for cls in vars(c10d).values()
        if isinstance(cls, type) and issubclass(cls, c10d.Backend)
    ]
    names = {op.strip("_") for op in allowed}
    for cls in backends:
        for method in BACKEND_METHODS:
            if method.strip("_") not in names and method in vars(cls):
                name = C10D_NAMES.get(f"{method}_", method.strip("_"))
                setattr(cls, method, _refusing(name))
    _refuse_undoing(locked, allowed)
    return locked


def _refuse_undoing(locked: list[str], allowed: frozenset[str]) -> None:
    """The guard's refusal for the rank's life (``locked=True``: no code can pop it): no
    ``ctypes``, no write to ``/proc``, no ``gc`` object lists, no other program."""
    from ddp_lab.comm_debug import C10D_NAMES
    from ddp_lab.course.grading import guard

    def names(ops: Iterable[str]) -> list[str]:
        # by family (all_gather_into_tensor is all_gather's): the verdict keeps 500 characters
        found = {C10D_NAMES.get(op, op.strip("_")) for op in ops}
        return sorted(
            {re.sub(r"(_coalesced|_into_tensor|_single|_tensor)+$", "", n) for n in found}
        )

    use = names(op for op in allowed if op not in NOT_DATA)
    guard.push(names(locked) or ["-"], " / ".join(f"dist.{n}" for n in use), [], locked=True)
