"""06's static look: which of the names an exercise must not call the learner's function
refers to, following the helpers they wrote beside it (``ch06.probe_forbidden`` runs it in the
learner's rank, before their code runs; the checker in ``ch06`` judges what it returns).
"""

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType


def _own_helper(fn: Callable, value: object) -> bool:
    """Whether ``value`` is a function the learner wrote beside ``fn`` (same module, not the
    package's or torch's): the lesson's names (``padded_indices``) are natural names for it."""
    module = getattr(value, "__module__", None) or ""
    return (
        isinstance(value, FunctionType)
        and (value.__globals__ is getattr(fn, "__globals__", None) or module == fn.__module__)
        and not module.startswith(("ddp_lab", "torch"))
    )


def uses_forbidden(fn: Callable, names: set[str]) -> str:
    """The first of ``names`` that ``fn``'s code refers to (the exercise must not call them).

    A name bound to a helper the learner wrote beside ``fn`` is not a call of the package's
    function: the helper's own code is read instead."""
    todo = [fn] if getattr(fn, "__code__", None) is not None else []
    done: set[int] = set()
    hits: set[str] = set()
    while todo:
        f = todo.pop()
        if id(f) in done:
            continue
        done.add(id(f))
        codes, seen = [f.__code__], set()
        while codes:
            c = codes.pop()
            seen |= set(c.co_names)
            codes += [k for k in c.co_consts if hasattr(k, "co_names")]
        scope = getattr(f, "__globals__", {})
        for name in seen:
            value = scope.get(name)
            if _own_helper(fn, value):
                todo.append(value)
            elif name in names:
                hits.add(name)
    return sorted(hits)[0] if hits else ""
