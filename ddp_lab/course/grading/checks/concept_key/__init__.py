"""The concept checks' key, a few chapters a module: for each question its key (a letter, or a
number with a relative tolerance) and the explanations ``dl.quiz`` shows.

``course.grading.checks.concepts`` gathers the modules into ``QUIZZES`` and judges the
learner's answers with it. Every file of this package is hidden from the processes that run
learner code (``course.grading.view.HIDDEN``), this one included: a module of the key cannot
be imported there, nor read.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Question:
    """One question: ``key`` a letter ("b") or a number; ``choices`` for a letter."""

    key: str | float
    right: str
    wrong: dict[str, str] = field(default_factory=dict)
    tol: float = 0.0
    choices: int = 0
