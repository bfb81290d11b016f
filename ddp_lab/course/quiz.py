"""Concept checks: the questions at the end of every chapter, answered as data in the notebook.

A chapter ends with its questions (markdown, both languages) and one code cell::

    answers = {1: "b", 2: 96, 3: None, ...}   # a letter, a number, or None (not answered)
    dl.quiz("05", answers)

``dl.quiz`` (self-study, in the learner's kernel) says for each question whether the answer is
right and explains it: for a wrong choice, why that choice is wrong. The exercise notebook's
graded cell ``dl.grade("05.concepts", answers)`` counts them as their own graded item. The key
and the explanations live in ``course/grading/checks/concept_key/``, gathered by
``course/grading/checks/concepts.py``: ``ddp-lab check`` and ``ddp-lab grade`` compare there, in
the grader's process, the answers the learner's process sends back as data
(``course/grading/checks/answers.py``); no process that runs learner code can import the key
(``course.grading.view.HIDDEN``).

How it differs from nbgrader's multiple-choice cells: the answers are a plain dict in a code
cell (diffable, no widget state to lose), and numbers are compared with a tolerance.
"""

from __future__ import annotations

from typing import Any

from ddp_lab.i18n import _t


def quiz(chapter: str, answers: Any) -> None:
    """Print, for each of ``chapter``'s questions, whether ``answers`` has it right, and why."""
    from ddp_lab.course.grading.checks import answers as probe
    from ddp_lab.course.grading.checks import concepts

    got = probe.clean(answers)
    if isinstance(got, str):  # the form is wrong: say so, as the graded cell would
        print(probe.form_message(got))
        return
    questions = concepts.QUIZZES[chapter]
    right = 0
    for number, q in enumerate(questions, 1):
        value = got.get(str(number))
        verdict = concepts.judge(q, value)
        if verdict == "unanswered":
            print(_t("{n}. not answered yet.", n=number))
            continue
        shown = value if isinstance(value, str) else f"{value:g}"
        if verdict == "right":
            right += 1
            print(_t("{n}. {answer}: right.", n=number, answer=shown), concepts.why(q, value))
        else:
            print(_t("{n}. {answer}: not right.", n=number, answer=shown), concepts.why(q, value))
    print(_t("{right} of {total} right.", right=right, total=len(questions)))
