"""Shared by the checker tests: run a checker on a learner's object, and results that claim
to equal everything (a learner's attempt to pass any comparison)."""

from __future__ import annotations

from typing import Any

from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import LocalLearner, _as_data


def verdict(grade_id: str, obj: Any, lang: str = "en") -> tuple[bool, str]:
    """(passed, verdict line in ``lang``) of ``grade_id`` on the learner's ``obj``; the
    checker's own feedback is in ``lang`` too (``run_checker`` switches the language)."""
    return run_checker(load_checkers()[grade_id], LocalLearner((obj,)), lang)


class InProcess(LocalLearner):
    """A learner handle whose per-rank probes run here, one rank after another: for a test of
    a checker's cases over many seeds, where what is asked is what the cases catch, not how
    the learner's ranks start (each case of ``LocalLearner`` starts its ranks: ~0.3 s)."""

    def ranks(self, probe: Any, inputs: list, timeout: float = 60, **_: Any) -> list:
        return _as_data([probe(rank, self.objects, inp) for rank, inp in enumerate(inputs)])


def verdict_here(grade_id: str, obj: Any, lang: str = "en") -> tuple[bool, str]:
    """``verdict`` with the probes in this process (``InProcess``)."""
    return run_checker(load_checkers()[grade_id], InProcess((obj,)), lang)


class EqualsAnything:
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


class EqualsAnyList(list):
    def __eq__(self, other: object) -> bool:
        return True
