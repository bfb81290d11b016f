"""Per-rank probes of the single-process exercises (01.diagnose, 02.place, 03.*), without
their oracles.

These exercises are graded in the per-rank form with one rank (``learner.ranks(probe,
[input])``, a sandbox of its own when graded, ``course.grading.rankhost``): the learner's code runs in
a process that holds one case's input and nothing else, never the expected answers or the
checker. The probes live here, apart from the checkers: ``ch01.py``, ``ch02.py`` and
``ch03.py`` compute the reference answers from the inputs (and ``ddp_lab.tools.ranks.assign`` is
02.place's), so they are hidden in a rank (``view.RANK_HIDDEN``), while this module is not.

Each probe returns plain data (``course.grading.wire``): what the learner's code returned, or
``{"kind": <type name>}`` where it is not data.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

KEYS = ("rank", "local_rank", "node_rank", "world_size", "device", "gpu")  # 02.place's rows


def _plain(value: object) -> Any:
    """A row's value as data: None, bool, int, float, str; anything else by its type name."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    return {"kind": type(value).__name__}


def _int_or_kind(x: Any) -> Any:
    if type(x) in (int, bool, float):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    try:
        return operator.index(x)
    except TypeError:
        return {"kind": type(x).__name__}


def probe_diagnose(rank: int, objects: tuple, case: list[str]) -> Any:
    """01.diagnose, one case ``[smi, nvcc, torch_build]``: their answer, as data."""
    (diagnose,) = objects
    smi, nvcc, torch_build = case
    out = diagnose(smi, nvcc, torch_build)
    if not isinstance(out, (tuple, list)):
        return {"kind": type(out).__name__}
    if all(type(x) is str for x in out):
        return tuple(out) if isinstance(out, tuple) else list(out)
    items = ", ".join(type(x).__name__ for x in out[:3])
    return {"kind": f"{type(out).__name__} ({items})"}


def probe_place(rank: int, objects: tuple, case: list) -> Any:
    """02.place, one launch ``[counts, cvds, gpus_per_node]``: their rows, as data."""
    (place,) = objects
    counts, cvds, gpus_per_node = case
    out = place(counts, cvds, gpus_per_node)
    if not isinstance(out, (list, tuple)):  # the text asks for one dict per process, in order
        return {"kind": type(out).__name__}
    rows: list[Any] = []
    for row in out:
        if isinstance(row, dict):
            rows.append({k: _plain(row[k]) for k in KEYS if k in row})
        else:
            rows.append({"kind": type(row).__name__})
    return rows


def probe_balanced(rank: int, objects: tuple, case: list[int]) -> Any:
    """03.balanced_chunks, one case ``[batch, n, gpu0]``: their sizes, as data."""
    (balanced_chunk_sizes,) = objects
    batch, n, gpu0 = case
    out = balanced_chunk_sizes(batch, n, gpu0)
    if not isinstance(out, (list, tuple)):
        return {"kind": type(out).__name__}
    return [_int_or_kind(x) for x in out]


# torch's own, taken at import (before a learner's objects load): the grad_fn an output
# really has, and the apply every autograd.Function inherits.
_GRAD_FN = torch._C.TensorBase.__dict__["grad_fn"].__get__
_APPLY = torch.autograd.Function.__dict__["apply"]
_FUNCTION_META = type(torch.autograd.Function)


def _own_apply(gather_cls: Any) -> bool:
    """Whether ``gather_cls.apply`` is torch's: a Function whose metaclass is torch's and which
    does not define ``apply`` itself (an ``apply`` of the learner's could return a tensor made
    some other way, dressed up as made by the Function)."""
    if type(gather_cls) is not _FUNCTION_META:
        return False
    for klass in gather_cls.__mro__:
        if "apply" in vars(klass):
            return vars(klass)["apply"] is _APPLY
    return False


def _made_by(gather_cls: Any, out: torch.Tensor) -> dict[str, str]:
    """The name of ``out``'s grad_fn as torch records it, and the Function's name: a right
    Function's output has grad_fn ``<name>Backward`` (a subclass of Tensor could show another
    grad_fn: only a plain tensor is read)."""
    name = getattr(gather_cls, "__name__", "")
    plain = type(out) is torch.Tensor and _own_apply(gather_cls)
    return {
        "grad_fn": type(_GRAD_FN(out)).__name__ if plain else f"<{type(out).__name__}>",
        "function": name if type(name) is str else "",
    }


def _gather_leaves(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    leaves = [p.clone().requires_grad_() for p in parts]
    for i, leaf in enumerate(leaves):
        leaf._sim_device = i  # replica i's output lives on simulated device i
    return leaves


def probe_gather_forward(rank: int, objects: tuple, case: list) -> Any:
    """03.gather, ``[dim, parts]``: their Function's output on leaf tensors, and its grad_fn."""
    (gather_cls,) = objects
    dim, parts = case
    out = gather_cls.apply(0, dim, *_gather_leaves(parts))
    if not isinstance(out, torch.Tensor):
        return {"kind": type(out).__name__}
    return {"out": out.detach().clone(), **_made_by(gather_cls, out)}


def probe_gather_backward(rank: int, objects: tuple, case: list) -> Any:
    """03.gather, ``[dim, parts, weight]``: the inputs' gradients of ``(out * weight).sum()``,
    and the grad_fn of that very output (the forward probe's check holds for its own call
    only: a rank serves both probes, so an object could answer them differently)."""
    (gather_cls,) = objects
    dim, parts, weight = case
    leaves = _gather_leaves(parts)
    out = gather_cls.apply(0, dim, *leaves)
    if not isinstance(out, torch.Tensor):
        return {"kind": type(out).__name__}
    made_by = _made_by(gather_cls, out)
    (out * weight).sum().backward()
    grads = [None if leaf.grad is None else leaf.grad.detach().clone() for leaf in leaves]
    return {"grads": grads, **made_by}


def one(got: Any) -> Any:
    """The one rank's answer of ``learner.ranks(probe, [input])`` (anything else by its kind)."""
    if type(got) is list and len(got) == 1:
        return got[0]
    return {"kind": type(got).__name__}
