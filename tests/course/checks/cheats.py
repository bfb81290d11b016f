"""Shared by the checker tests: run a checker on a learner's object, and results that claim
to equal everything (a learner's attempt to pass any comparison)."""

from __future__ import annotations

from typing import Any

from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import LocalLearner


def verdict(grade_id: str, obj: Any, lang: str = "en") -> tuple[bool, str]:
    """(passed, verdict line in ``lang``) of ``grade_id`` on the learner's ``obj``; the
    checker's own feedback is in ``lang`` too (``run_checker`` switches the language)."""
    return run_checker(load_checkers()[grade_id], LocalLearner((obj,)), lang)


class EqualsAnything:
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


class EqualsAnyList(list):
    def __eq__(self, other: object) -> bool:
        return True
