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

from ddp_lab.course.i18n import MESSAGES as _I18N
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


def _t(key: str, lang: str | None, **fields: object) -> str:
    return _I18N(key, lang, **fields)


def run_checker(chk: Checker, learner: Any, lang: str | None = None) -> tuple[bool, str]:
    """Run ``chk``'s hidden cases against ``learner`` (a ``course.learner`` handle).

    Returns (passed, the verdict line in ``lang``). The checker draws the cases, computes
    the oracle and compares, here; the learner's code is reached only through the handle.
    ``RunnerGone`` (the learner's process died or timed out) propagates to the caller.
    """
    from ddp_lab.course.learner import LearnerError, RunnerGone

    cases = chk.fn(rng_for(chk.grade_id), learner)
    index, total = 0, None
    try:
        total = next(cases)  # a checker first yields how many cases it has
        for _label in cases:
            index += 1
    except RunnerGone:
        raise
    except NotImplementedError:
        detail = _t("grade_not_implemented", lang)
    except LearnerError as exc:
        if exc.not_implemented:
            detail = _t("grade_not_implemented", lang)
        else:
            why = _t("grade_raised", lang, error=f"{exc.type_name}: {exc.message}")
            detail = _t("grade_case_failed", lang, index=index + 1, total=total, case="-", why=why)
    except CaseFailed as exc:
        detail = _t(
            "grade_case_failed",
            lang,
            index=index + 1,
            total=total,
            case=exc.args[1] if len(exc.args) > 1 else "-",
            why=exc.args[0],
        )
    except Exception as exc:  # noqa: BLE001  # anything else the learner's code caused
        why = _t("grade_raised", lang, error=f"{type(exc).__name__}: {_first_line(exc)}")
        detail = _t("grade_case_failed", lang, index=index + 1, total=total, case="-", why=why)
    else:
        return True, _t("grade_pass", lang, grade_id=chk.grade_id, points=chk.points)
    return False, _t("grade_fail", lang, grade_id=chk.grade_id, points=chk.points, detail=detail)


def grade(grade_id: str, *objects: Any) -> None:
    """Run the hidden cases of ``grade_id`` on the learner's ``objects``; print the verdict.

    This is the in-notebook check, for self-study: it runs in the learner's kernel, so the
    learner's code could change it. ``ddp-lab grade`` and ``ddp-lab check`` do not use it:
    they compute the verdict in a process of their own (``course.verdict``).
    Returns nothing (a graded cell's only output is its verdict line); raises
    AssertionError when a case fails.
    """
    from ddp_lab.course.learner import LocalLearner

    registry = load_checkers()
    if grade_id not in registry:
        raise KeyError(t("grade_unknown", grade_id=grade_id))
    chk = registry[grade_id]
    passed, line = run_checker(chk, LocalLearner(objects))
    print(line)
    if not passed:
        raise AssertionError(f"{grade_id}: 0/{chk.points}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def fail(why: str, case: str) -> CaseFailed:
    """A CaseFailed for a case described by ``case`` (a few words, no hidden data)."""
    return CaseFailed(why, case)
