"""Count the collectives this process hands to ``torch.distributed`` (no exercise's answer here).

``count_collectives`` wraps ``torch.distributed``'s collective functions in this process for
the duration of a ``with`` block and logs each call's name, dtype and payload bytes. Chapter 10
counts what DDP's comm hooks send with it (``ddp_lab.comm_hooks`` re-exports it), and the
graders of chapter 10 watch the learner's hook and ``reduce_grad`` with it inside each rank.

How this differs from PyTorch: torch's ``CommDebugMode``
(``torch/distributed/tensor/debug/_comm_mode.py``) counts the functional collectives that
DTensor dispatches, through ``TorchDispatchMode``; this counts calls of the eager
``torch.distributed`` functions (``all_reduce``, ``broadcast``...) by replacing them in the
module, which is what comm hooks and the course's exercises call. What is counted is the
payload handed to each collective (``numel * element_size``), not the bytes on the wire: a
ring all-reduce moves about ``2 (N-1)/N`` times its payload per rank (chapter 05).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode as _DispatchMode

COUNTED = ("all_reduce", "all_gather", "all_gather_single", "reduce_scatter_single", "broadcast")


@dataclass
class CollectiveLog:
    """What went through ``torch.distributed`` collectives: (name, dtype, bytes) per call."""

    calls: list[tuple[str, torch.dtype, int]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(b for _, _, b in self.calls)

    def dtypes(self) -> set[torch.dtype]:
        return {d for _, d, _ in self.calls}


@contextmanager
def count_collectives(names: tuple[str, ...] = COUNTED) -> Iterator[CollectiveLog]:
    """Wrap ``torch.distributed``'s collectives in this process and log every call."""
    log = CollectiveLog()
    originals = {n: getattr(dist, n) for n in names if hasattr(dist, n)}

    def wrap(name: str, real: Callable) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            t = args[0] if name in ("all_reduce", "broadcast") else args[1]
            tensors = t if isinstance(t, (list, tuple)) else [t]
            for x in tensors:
                log.calls.append((name, x.dtype, x.numel() * x.element_size()))
            return real(*args, **kwargs)

        return counted

    for n, real in originals.items():
        setattr(dist, n, wrap(n, real))
    try:
        yield log
    finally:
        for n, real in originals.items():
            setattr(dist, n, real)


# ----- every road: the c10d operators ----------------------------------------------------

# The c10d operator each torch.distributed function ends in (torch/csrc/distributed/c10d/
# Ops.cpp: ProcessGroup's methods call these through the dispatcher), named as a learner
# writes it. Several functions share an operator (all_gather_into_tensor and
# all_gather_single both end in _allgather_base_): the name is the older function's.
C10D_NAMES = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "monitored_barrier",
}
# The functional collectives (``torch.distributed._functional_collectives``: funcol.all_reduce,
# ..., and DTensor's) are operators of their own namespaces (torch/csrc/distributed/c10d/
# Functional.cpp); a dispatch mode sees them and not the c10d operators their kernels call.
# Every one takes what this rank hands over first. ``wait_tensor`` (waiting for one) moves no
# data: ``on_call`` hears it as "wait", the log leaves it out. ``batch_p2p_ops`` (a list of
# isend/irecv with their peers and tensors: torch's compiler emits it, torch/_inductor/
# comm_lowering.py, but eager code reaches it too, ``torch.ops._c10d_functional.batch_p2p_ops``,
# and it runs on gloo) is logged per entry, an isend as "send" and an irecv as "recv" with its
# tensor's bytes; ``on_call`` hears it once, as "batch_p2p_ops". The namespaces' other
# operators (``_wrap_tensor_autograd``) move no data and are not logged.
FUNCTIONAL_NAMES = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced_": "all_reduce_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_out": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
    "isend": "send",
    "irecv": "recv",
    "wait_tensor": "wait",
}
FUNCTIONAL_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
# Operators whose first argument is what this rank hands over (or, for recv, takes in); the
# others take (outputs, inputs).
_FIRST_IS_PAYLOAD = frozenset(
    {
        "allreduce_",
        "allreduce_coalesced_",
        "broadcast_",
        "reduce_",
        "send",
        "recv_",
        "recv_any_source_",
    }
)
# What ``watch_c10d`` decides with, bound as its default arguments when this module loads (see
# there): immutable copies, which a learner's code in a graded rank cannot edit in place.
_C10D_PAIRS = tuple(C10D_NAMES.items())
_FUNCTIONAL_PAIRS = tuple(FUNCTIONAL_NAMES.items())


def tensors_of(
    value: object,
    _tensor: type = torch.Tensor,
    _seqs: tuple = (list, tuple),
    _isinstance=isinstance,
) -> list[torch.Tensor]:
    """The tensors in ``value``: a tensor, or lists of them (as c10d operators take them).

    The trailing parameters are not for callers: what this reads, bound when the module loads
    (a graded rank's probes count with it; see ``watch_c10d``). No recursion by name, for the
    same reason."""
    found: list[torch.Tensor] = []
    todo = [value]
    while todo:
        v = todo.pop(0)
        if _isinstance(v, _tensor):
            found.append(v)
        elif _isinstance(v, _seqs):
            todo[0:0] = v
    return found


# A graded rank runs the learner's code and then the grader's probe in one process, and
# ``course.grading.guard.seal`` freezes the code and the defaults of every ddp_lab function
# there, not the module attributes. So what ``watch_c10d`` reads while it watches (names,
# constants, builtins) is bound here as default arguments: positional ones, whose tuple is
# immutable (a keyword-only default lives in a dict that can be edited in place), made of
# immutable values. A learner who rebinds ``comm_debug.C10D_NAMES`` or ``comm_debug.sum``
# reaches nothing that is already watching, or that a probe bound.
@contextmanager
def watch_c10d(
    on_call: Callable[[str, tuple], None] | None = None,
    _c10d_names: tuple = _C10D_PAIRS,
    _functional_names: tuple = _FUNCTIONAL_PAIRS,
    _functional_namespaces: tuple = FUNCTIONAL_NAMESPACES,
    _first_is_payload: frozenset = _FIRST_IS_PAYLOAD,
    _tensors_of: Callable = tensors_of,
    _log_type: type = CollectiveLog,
    _tensor: type = torch.Tensor,
    _uint8: torch.dtype = torch.uint8,
    _mode: type = _DispatchMode,
    _builtins: tuple = (len, sum, zip, isinstance),
) -> Iterator[CollectiveLog]:
    """Log every ``c10d::`` operator this process runs in the block, by the name a learner
    writes (``C10D_NAMES``), with its payload's dtype and bytes; ``on_call(name, args)``
    (the operator's arguments) is called before each one runs. (The other parameters are not
    for callers: what it reads, bound when the module loads; see the comment above.)

    ``count_collectives`` sees the ``torch.distributed`` functions it replaced; a function
    imported by name before (``from torch.distributed import all_reduce``), a process
    group's method or ``torch.ops.c10d`` bypasses it. All of them end in a ``c10d::``
    operator of the dispatcher, which a ``TorchDispatchMode`` sees, as torch's
    ``CommDebugMode`` (``torch/distributed/tensor/debug/_comm_mode.py``) counts them; this
    one also logs dtype and bytes, which the graders of chapter 10 check. A backend's own
    methods (``ProcessGroupGloo.allreduce``) do not pass the dispatcher: the hand-written-
    collective exercises lock those (``course/grading/checks/lockdown.py``). The mode
    follows autograd into its worker threads (autograd carries the thread-local state), so
    a comm hook run by DDP's reducer during backward is seen. The functional collectives
    (``FUNCTIONAL_NAMES``) are logged by the same names.
    """
    len_, sum_, zip_, isinstance_ = _builtins
    log = _log_type()

    def named(pairs: tuple, op: str) -> str | None:
        for key, name in pairs:
            if key == op:
                return name
        return None

    class Watch(_mode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            op, namespace, name, given = func._opname, func.namespace, None, ()
            if namespace == "c10d":
                name = named(_c10d_names, op) or op
                given = args[0] if op in _first_is_payload else args[1] if len_(args) > 1 else ()
                given = given if "barrier" not in op else ()
            elif namespace in _functional_namespaces and named(_functional_names, op):
                name = named(_functional_names, op)
                given = args[0] if args and name != "wait" else ()
            elif namespace in _functional_namespaces and op == "batch_p2p_ops":
                if on_call is not None:
                    on_call(op, args)
                kinds = args[0] if args else []
                tensors = args[3] if len_(args) > 3 else []
                for kind, t in zip_(kinds, tensors, strict=False):
                    if isinstance_(t, _tensor):
                        entry = "send" if kind == "isend" else "recv"
                        log.calls.append((entry, t.dtype, t.numel() * t.element_size()))
            if name is not None:
                if on_call is not None:
                    on_call(name, args)
                if name != "wait":
                    tensors = _tensors_of(given)
                    dtype = tensors[0].dtype if tensors else _uint8
                    size = sum_(t.numel() * t.element_size() for t in tensors)
                    log.calls.append((name, dtype, size))
            return func(*args, **(kwargs or {}))

    with Watch():
        yield log
