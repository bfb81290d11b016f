"""Concept checks: each chapter's key and explanations, and their checkers (``NN.concepts``).

The questions are at the end of each chapter source (markdown, both languages); the learner
answers in a dict (``dl.quiz``, ``course/quiz.py``). The key is data in ``concept_key/``, a few
chapters a module: for each question its key (a letter, or a number with a relative tolerance
``tol``) and the explanations that ``dl.quiz`` shows: the right answer's, and one per wrong
choice (``""``: for any wrong number); ``QUIZZES`` here gathers them. The checker registered
for each chapter gets the learner's answers as data from the learner's process
(``answers.probe_answers``) and compares them with the key, in the grader's process; it is
all or nothing (``POINTS``), and says which questions are not right yet, never their answers.
This module and the key are hidden from every process that runs learner code
(``course.grading.view.HIDDEN``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

from ddp_lab.course.grading.checkers import NotAttempted, checker, fail
from ddp_lab.course.grading.checks.answers import form_message, probe_answers
from ddp_lab.course.grading.checks.concept_key import Question, ch00_03, ch04_07, ch08_11, ch12
from ddp_lab.i18n import _t

__all__ = ["POINTS", "QUIZZES", "Question", "judge", "why"]

POINTS = 2


def judge(q: Question, answer: Any) -> str:
    """ "right", "wrong" or "unanswered" for one answer (as ``answers.clean`` gives it)."""
    if answer is None or answer == "":
        return "unanswered"
    if isinstance(q.key, str):
        return "right" if isinstance(answer, str) and answer.strip("() ") == q.key else "wrong"
    if not isinstance(answer, float) or not math.isfinite(answer):
        return "wrong"
    return "right" if abs(answer - q.key) <= q.tol * abs(q.key) + 1e-9 else "wrong"


def why(q: Question, answer: Any) -> str:
    """The explanation for ``answer``: the right answer's, or that wrong choice's."""
    if judge(q, answer) == "right":
        return _t(q.right)
    if isinstance(q.key, str) and isinstance(answer, float):
        letters = ", ".join("abcd"[: q.choices])
        return _t("Answer with one of the letters {letters}, in quotes.", letters=letters)
    if not isinstance(q.key, str) and isinstance(answer, str):
        return _t("Answer with a number, without quotes.")
    text = q.wrong.get(answer.strip("() ") if isinstance(answer, str) else "", q.wrong.get(""))
    if text is None and isinstance(answer, str) and q.choices:
        letters = "abcd"[: q.choices]
        return _t("Answer with one of the letters {letters}.", letters=", ".join(letters))
    return _t(text) if text else ""


def _make(chapter: str) -> None:
    @checker(f"{chapter}.concepts", POINTS)
    def check(rng: random.Random, learner: Any) -> Iterator[str]:
        yield 1  # type: ignore[misc]  # one case: the answers
        case = _t("your answers")
        got = learner.call(probe_answers)
        if not isinstance(got, dict):  # a code of answers.clean's or junk, said here
            raise fail(form_message(got), case)
        verdicts = [judge(q, got.get(str(i))) for i, q in enumerate(QUIZZES[chapter], 1)]
        wrong = [str(i) for i, v in enumerate(verdicts, 1) if v == "wrong"]
        blank = [str(i) for i, v in enumerate(verdicts, 1) if v == "unanswered"]
        if wrong or blank:
            parts = []
            if wrong:
                parts.append(_t("not right yet: {numbers}", numbers=", ".join(wrong)))
            if blank:
                parts.append(_t("not answered: {numbers}", numbers=", ".join(blank)))
            text = _t(
                "{parts} (of {total}); dl.quiz({chapter!r}, my_answers) explains each answer",
                parts=parts[0]
                if len(parts) == 1
                else _t("{one}; {other}", one=parts[0], other=parts[1]),
                total=len(verdicts),
                chapter=chapter,
            )
            if not wrong and len(blank) == len(verdicts):  # nothing answered: not attempted
                raise NotAttempted(text, case)
            raise fail(text, case)
        yield case


QUIZZES: dict[str, list[Question]] = {
    **ch00_03.QUIZZES,
    **ch04_07.QUIZZES,
    **ch08_11.QUIZZES,
    **ch12.QUIZZES,
}

for _chapter in QUIZZES:
    _make(_chapter)
