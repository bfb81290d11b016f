"""Grading: a submission's way from files to a report, one stage after another.

``ddp-lab grade`` (``grade_class``) and ``ddp-lab check`` (``grader``) pass each submission
through the stages in this order, each handing the next a value, none calling back
(``grader.grade_one`` runs stages 1-5 for one submission; each stage is entered once):

1. find and read: ``intake`` (``find`` -> a list of ``Submission``, ``read`` -> ``Read``);
2. match: ``release`` (``match`` -> ``Match``: the graded cells found, the tampered ones);
3. isolate: ``isolation`` (a user-id slot, a cgroup, the starvation canary);
4. run: ``execute`` (``run`` -> verdicts: the ``verdict`` process, which runs the submission
   in the sandbox with ``sandbox``, ``view``, ``runner``, ``needed``, ``rankhost`` and
   ``rankserve``, ``learner``, ``wire``, ``traffic``, reads its cells with ``scan`` and judges
   each exercise with ``checkers`` and ``checks/``);
5. judge: ``judge`` (``judge`` -> a list of ``Result``);
6. report: ``feedback`` (a submission's lines), ``report`` (escaping, the gradebook),
   ``export`` (Gradescope, Classroom), ``similarity``.

ARCHITECTURE.md draws the pipeline ("Grading: one pipeline").

The checker API (``checker``, ``fail``, ``run_checker``, ``dl.grade``...) lives in
``checkers`` and is re-exported here: a checker module writes
``from ddp_lab.course.grading import checker, fail``.
"""

from __future__ import annotations

from ddp_lab.course.grading.checkers import (
    CHECKER_MODULES,
    DEFAULT_SEED,
    REGISTRY,
    CaseFailed,
    Checker,
    checker,
    fail,
    grade,
    load_checkers,
    mismatch,
    note,
    rng_for,
    run_checker,
    running,
    unobserved,
    wrong_form,
)

__all__ = [
    "CHECKER_MODULES",
    "DEFAULT_SEED",
    "REGISTRY",
    "CaseFailed",
    "Checker",
    "checker",
    "fail",
    "grade",
    "load_checkers",
    "mismatch",
    "note",
    "rng_for",
    "run_checker",
    "running",
    "unobserved",
    "wrong_form",
]
