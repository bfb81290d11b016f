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
# The probes below run in the learner's process after their code; ``guard.seal`` freezes the
# code and defaults of ddp_lab's functions there, not module attributes (review 10 rebound
# ``probes._own_apply`` and ``probes._GRAD_FN`` from the learner's ``apply``). So each one
# reads only what was bound as its positional defaults (an immutable tuple) when this module
# loaded, builtins included (a module attribute ``type`` would shadow the builtin).
_TORCH_OWN = (_FUNCTION_META, _APPLY, torch.Tensor, _GRAD_FN)
_BUILTINS = (type, vars, getattr, str, isinstance)


def _own_apply(gather_cls: Any, _torch: tuple = _TORCH_OWN, _builtins: tuple = _BUILTINS) -> bool:
    """Whether ``gather_cls.apply`` is torch's: a Function whose metaclass is torch's and which
    does not define ``apply`` itself (an ``apply`` of the learner's could return a tensor made
    some other way, dressed up as made by the Function)."""
    (meta, apply, _, _), (type_, vars_, *_) = _torch, _builtins
    if type_(gather_cls) is not meta:
        return False
    for klass in gather_cls.__mro__:
        if "apply" in vars_(klass):
            return vars_(klass)["apply"] is apply
    return False


def _made_by(
    gather_cls: Any,
    out: torch.Tensor,
    _own: Any = _own_apply,
    _torch: tuple = _TORCH_OWN,
    _builtins: tuple = _BUILTINS,
) -> dict[str, str]:
    """The name of ``out``'s grad_fn as torch records it, and the Function's name: a right
    Function's output has grad_fn ``<name>Backward`` (a subclass of Tensor could show another
    grad_fn: only a plain tensor is read)."""
    (_, _, tensor, grad_fn), (type_, _, getattr_, str_, _) = _torch, _builtins
    name = getattr_(gather_cls, "__name__", "")
    plain = type_(out) is tensor and _own(gather_cls)
    return {
        "grad_fn": type_(grad_fn(out)).__name__ if plain else f"<{type_(out).__name__}>",
        "function": name if type_(name) is str_ else "",
    }


def _gather_leaves(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    leaves = [p.clone().requires_grad_() for p in parts]
    for i, leaf in enumerate(leaves):
        leaf._sim_device = i  # replica i's output lives on simulated device i
    return leaves


_GATHER = (_gather_leaves, _made_by, torch.Tensor, isinstance, type)


def probe_gather_forward(rank: int, objects: tuple, case: list, _bound: tuple = _GATHER) -> Any:
    """03.gather, ``[dim, parts]``: their Function's output on leaf tensors, and its grad_fn."""
    leaves_of, made_by, tensor, isinstance_, type_ = _bound
    (gather_cls,) = objects
    dim, parts = case
    out = gather_cls.apply(0, dim, *leaves_of(parts))
    if not isinstance_(out, tensor):
        return {"kind": type_(out).__name__}
    return {"out": out.detach().clone(), **made_by(gather_cls, out)}


def probe_gather_backward(rank: int, objects: tuple, case: list, _bound: tuple = _GATHER) -> Any:
    """03.gather, ``[dim, parts, weight]``: the inputs' gradients of ``(out * weight).sum()``,
    and the grad_fn of that very output (the forward probe's check holds for its own call
    only: a rank serves both probes, so an object could answer them differently)."""
    leaves_of, made_by, tensor, isinstance_, type_ = _bound
    (gather_cls,) = objects
    dim, parts, weight = case
    leaves = leaves_of(parts)
    out = gather_cls.apply(0, dim, *leaves)
    if not isinstance_(out, tensor):
        return {"kind": type_(out).__name__}
    shown = made_by(gather_cls, out)
    (out * weight).sum().backward()
    grads = [None if leaf.grad is None else leaf.grad.detach().clone() for leaf in leaves]
    return {"grads": grads, **shown}


def one(got: Any) -> Any:
    """The one rank's answer of ``learner.ranks(probe, [input])`` (anything else by its kind)."""
    if type(got) is list and len(got) == 1:
        return got[0]
    return {"kind": type(got).__name__}
