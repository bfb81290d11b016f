"""Grading: a submission's way from files to a report, one stage after another.

``ddp-lab grade`` / ``ddp-lab check`` find and read the submissions (``intake``), isolate each
one (``isolation``: a uid slot and a cgroup; ``sandbox``: bubblewrap), run it (``runner`` in
the sandbox, ``rankhost`` for per-rank exercises), judge it (``verdict`` runs the checkers of
``checks/`` through ``learner``/``wire``; ``scan`` reads the learner's own cells) and report
(``report``, ``export``, ``similarity``). ARCHITECTURE.md draws the pipeline.

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
    "wrong_form",
]
