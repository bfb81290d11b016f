"""Graded exercises: hidden randomised cases checked against real PyTorch.

A chapter registers a checker with ``@checker("00.average", points=2)``. The checker is a
generator: it receives a seeded ``random.Random`` and the learner's objects, and yields
``Case``s; each case runs the learner's code against the oracle (the real torch function)
and raises ``CaseFailed`` with a short explanation when they differ.

``grade(grade_id, *objects)`` runs a checker in a graded cell: it prints exactly one line,
the passing line that the build stored as the cell's expected output, or a failing line
that says which hidden case failed and why; on failure it also raises ``AssertionError``
so nbval, ``ddp-lab check`` and ``ddp-lab grade`` all see the cell fail.

The cases are drawn from ``DDP_LAB_GRADE_SEED`` (an instructor sets it to change them);
the seed and the case parameters are never printed in full.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ddp_lab.course.i18n import t

DEFAULT_SEED = 20261122
# Extra modules that register checkers (ddp_lab.course.checks.* are always loaded).
CHECKER_MODULES: list[str] = []


class CaseFailed(Exception):
    """A hidden case failed; the message is shown to the learner."""


@dataclass
class Checker:
    grade_id: str
    points: int
    fn: Callable[..., Iterator[str]]


REGISTRY: dict[str, Checker] = {}


def checker(grade_id: str, points: int) -> Callable:
    """Register a checker generator for ``grade_id`` worth ``points``."""

    def wrap(fn: Callable[..., Iterator[str]]) -> Callable[..., Iterator[str]]:
        REGISTRY[grade_id] = Checker(grade_id, points, fn)
        return fn

    return wrap


def load_checkers() -> dict[str, Checker]:
    """Import every checker module (ddp_lab.course.checks.*) and return the registry."""
    from ddp_lab.course import checks

    checks.load_all()
    for name in CHECKER_MODULES:
        importlib.import_module(name)
    return REGISTRY


def rng_for(grade_id: str) -> random.Random:
    """The hidden cases' generator: depends on the instructor's seed and the exercise."""
    seed = os.environ.get("DDP_LAB_GRADE_SEED", str(DEFAULT_SEED))
    digest = hashlib.sha256(f"{seed}:{grade_id}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def mismatch(expected: Any, actual: Any) -> CaseFailed:
    """A CaseFailed saying what was expected, kept short."""

    def short(x: Any) -> str:
        s = repr(x)
        return s if len(s) <= 160 else s[:157] + "..."

    return CaseFailed(t("grade_mismatch", expected=short(expected), actual=short(actual)))


def grade(grade_id: str, *objects: Any) -> None:
    """Run the hidden cases of ``grade_id`` on the learner's ``objects``; print the verdict.

    Returns nothing (a graded cell's only output is its verdict line); raises
    AssertionError when a case fails.
    """
    registry = load_checkers()
    if grade_id not in registry:
        raise KeyError(t("grade_unknown", grade_id=grade_id))
    chk = registry[grade_id]
    cases = chk.fn(rng_for(grade_id), *objects)
    index, total = 0, None
    try:
        total = next(cases)  # a checker first yields how many cases it has
        for _label in cases:
            index += 1
    except NotImplementedError:
        detail = t("grade_not_implemented")
    except CaseFailed as exc:
        detail = t(
            "grade_case_failed",
            index=index + 1,
            total=total,
            case=exc.args[1] if len(exc.args) > 1 else "-",
            why=exc.args[0],
        )
    except Exception as exc:  # noqa: BLE001  # the learner's code crashed
        from ddp_lab.runtime.launcher import DistributedError

        if isinstance(exc, DistributedError) and any(
            f.exception is not None and isinstance(f.exception, NotImplementedError)
            for f in exc.failures
        ):
            detail = t("grade_not_implemented")
        else:
            why = t("grade_raised", error=f"{type(exc).__name__}: {_first_line(exc)}")
            detail = t("grade_case_failed", index=index + 1, total=total, case="-", why=why)
    else:
        print(t("grade_pass", grade_id=grade_id, points=chk.points))
        return
    print(t("grade_fail", grade_id=grade_id, points=chk.points, detail=detail))
    raise AssertionError(f"{grade_id}: 0/{chk.points}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def fail(why: str, case: str) -> CaseFailed:
    """A CaseFailed for a case described by ``case`` (a few words, no hidden data)."""
    return CaseFailed(why, case)
