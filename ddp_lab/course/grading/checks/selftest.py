"""Checkers of the grader's self-test: two tiny exercises ("selftest.f", "selftest.g").

They let the grading tests (and an instructor trying ``ddp-lab grade`` on a new machine) run
the whole path (sandbox, runner, probes, verdict) in seconds: the learner writes ``f()``
returning 1 and ``g()`` returning 2. Not part of any chapter.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from ddp_lab.course.grading import checker, fail
from ddp_lab.i18n import _t


def probe_call(objects: tuple) -> Any:
    """In the learner's process: call their function, return what it returned."""
    return objects[0]()


def _check(name: str, expected: int, learner: Any) -> Iterator[object]:
    yield 1
    got = learner.call(probe_call, timeout=60)
    if type(got) is not int or got != expected:
        raise fail(
            _t(
                "{name}() returned {got}, expected {expected}",
                name=name,
                got=repr(got)[:60],
                expected=expected,
            ),
            "-",
        )
    yield "-"


@checker("selftest.f", points=1)
def check_f(rng: random.Random, learner: Any) -> Iterator[object]:
    yield from _check("f", 1, learner)


@checker("selftest.g", points=2)
def check_g(rng: random.Random, learner: Any) -> Iterator[object]:
    yield from _check("g", 2, learner)
