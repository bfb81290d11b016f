"""The classes that several grading test files assert on, each graded once per session.

Each submission that ``ddp-lab grade`` runs costs a sandbox, a runner that imports torch and
ranks that start in sandboxes of their own: seconds of CPU each, however small the notebook.
``test_grading_attacks_answers.py`` and ``test_grading_attacks_verdict.py`` used to grade a
chapter-05 class each, with the same honest and unsolved work in both. Here every chapter-05
submission they need sits in one class (``grade_chapter05``), graded in one ``ddp-lab grade``
run with ``--jobs 2``; each test asserts on its own students in the shared result (the session
fixture ``chapter05_class`` of tests/conftest.py). Each submission still gets a sandbox, a
verdict process and ranks of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from test_grader import grade, gradebook, leftover_processes, write


@dataclass
class Run:
    """A class as graded: its gradebook, and the processes it left right after the run."""

    out: Path
    book: dict[tuple[str, str], tuple[int, int, str]]
    leftovers: list[int]  # leftover_processes() right after the run

    def rows(self, *names: str, exercise: str = "00.average") -> dict[str, tuple[int, int, str]]:
        """name -> (points, max_points, status) of ``exercise`` for these students."""
        return {n: self.book[(n, exercise)] for n in names}

    def feedback(self, name: str) -> str:
        return (self.out / "feedback" / f"{name}.md").read_text(encoding="utf-8")


def grade_chapter05(tmp: Path) -> Run:
    """Chapter 05's class (``05.ring``), graded once: an honest ring, the released exercise,
    and the roads to the reference ring or to gloo's own all-reduce of
    ``test_grading_attacks_answers.py`` and ``test_grading_attacks_verdict.py``."""
    from test_grading_attacks_answers import (
        BACKWARDS_GROUP,
        EXEC_REFERENCE,
        GROUP_METHOD,
        MAGIC_IMPORT,
        _exercise,
        _solution_cell,
        _with,
    )
    from test_grading_attacks_verdict import IMPORT_REFERENCE

    path, release, solution = _exercise("05")
    marker = "def ring_all_reduce"
    subs = tmp / "subs"
    write(_with(release, marker, _solution_cell(solution, marker)), subs / "honest.ipynb")
    write(release, subs / "unsolved.ipynb")
    attacks = {
        "exec_reference": EXEC_REFERENCE,
        "magic_import": MAGIC_IMPORT,
        "group_method": GROUP_METHOD,
        "backwards_group": BACKWARDS_GROUP,
        "import_reference": IMPORT_REFERENCE,
    }
    for name, source in attacks.items():
        write(_with(release, marker, source), subs / f"{name}.ipynb")
    out = tmp / "out"
    assert grade(path, subs, out, "--cell-timeout", "120", "--jobs", "2") == 0
    return Run(out=out, book=gradebook(out), leftovers=leftover_processes())
