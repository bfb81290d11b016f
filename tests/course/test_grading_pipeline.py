"""Grading is one pipeline (issue 42): a submission passes the stages in order, each once.

The stages' modules, in the order a submission passes them: ``intake`` (1 find and read),
``release`` (2 match), ``execute`` (3-4 isolate and run), ``judge`` (5), ``feedback``,
``export``, ``similarity`` (6 report; ``report``, the escaping of learner text every driver
uses, is not counted). The tests follow every call into a stage
module from outside it (a profile hook) while real drivers grade: the verdict process is
replaced by a stub (what it would answer), everything else is the real code. Before the
pipeline, a class went grade_class -> grader -> intake -> grader -> ... and ``similarity``
read every submission a second time.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from test_grader import synthetic_release, synthetic_solved, write
from test_import_cycles import imports

from ddp_lab.course.grading import execute, grade_class, grader, intake, release, report

PREFIX = "ddp_lab.course.grading."
STAGE = {
    PREFIX + "intake": 1,
    PREFIX + "release": 2,
    PREFIX + "execute": 4,
    PREFIX + "judge": 5,
    PREFIX + "feedback": 6,
    PREFIX + "export": 6,
    PREFIX + "similarity": 6,
}


class Entries:
    """Per thread, the stage of each call into a stage module from outside that module."""

    def __init__(self) -> None:
        self.by_thread: dict[str, list[int]] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__")
        caller = frame.f_back.f_globals.get("__name__") if frame.f_back else None
        if module in STAGE and caller != module:
            seen = self.by_thread.setdefault(threading.current_thread().name, [])
            if not seen or seen[-1] != STAGE[module]:  # the same stage, module to module
                seen.append(STAGE[module])

    def __enter__(self) -> Entries:
        threading.setprofile(self)
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _passing(calls: list[bool], first: str = "passed"):
    def run_verdict(rel, sub, found, lang, cell_timeout, timeout, job=0, limits=None,
                    needed_only=False, progress=False):  # fmt: skip
        calls.append(needed_only)
        status = first if len(calls) == 1 else "passed"
        detail = "NameError: name 'f' is not defined" if status == "failed" else ""
        return {g: {"status": status, "detail": detail} for g in found}

    return run_verdict


def test_no_stage_calls_back_into_the_drivers() -> None:
    drivers = {PREFIX + "grader", PREFIX + "grade_class"}
    for module in STAGE:
        assert not imports(module) & drivers, module


def test_one_submission_enters_each_stage_once_in_order(tmp_path: Path, monkeypatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(execute, "run_verdict", _passing(calls, first="failed"))
    path = write(synthetic_solved(), tmp_path / "alice.ipynb")
    rel = release.Release.of(synthetic_release())
    with Entries() as seen:
        graded = grader.grade_one(rel, path, 10, 60, needed_only=True)
    assert seen.by_thread[threading.current_thread().name] == [1, 2, 4, 5]
    # ddp-lab check's re-run of the whole notebook after a NameError is inside stage 4.
    assert calls == [True, False]
    assert [r.status for r in graded.results] == ["passed", "passed"]
    assert graded.notebook is not None and graded.lang == "en"


def test_an_unread_file_goes_from_stage_1_to_judge(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(execute, "run_verdict", _passing([]))
    (tmp_path / "broken.ipynb").write_text("{not json", encoding="utf-8")
    with Entries() as seen:
        graded = grader.grade_one(synthetic_release(), tmp_path / "broken.ipynb", 10, 60)
    assert seen.by_thread[threading.current_thread().name] == [2, 1, 5]  # Release.of, read
    assert {r.status for r in graded.results} == {"invalid"} and graded.notebook is None


def test_ddp_lab_check_passes_the_stages_once(tmp_path: Path, monkeypatch, capsys) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(execute, "run_verdict", _passing(calls))
    path = write(synthetic_solved(), tmp_path / "mine.ipynb")
    args = argparse.Namespace(notebook=str(path), cell_timeout=10, timeout=60, only=None)
    with Entries() as seen:
        assert grader.check_main(args) == 0
    # 1 read (the notebook names its release), 2 the release rebuilt and matched, 4, 5, 6.
    assert seen.by_thread[threading.current_thread().name] == [1, 2, 4, 5, 6]
    assert calls == [True]
    assert "selftest.g: passed, 2/2" in capsys.readouterr().out


def _class_args(tmp_path: Path, release: Path, jobs: int) -> argparse.Namespace:
    """``ddp-lab grade``'s arguments for the release at ``release`` and the class in
    ``tmp_path / "subs"``, written to ``tmp_path / "out"``."""
    return argparse.Namespace(
        release=str(release),
        submissions=[str(tmp_path / "subs")],
        out=str(tmp_path / "out"),
        cell_timeout=10,
        timeout=60,
        jobs=jobs,
        gradescope=None,
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_class_passes_each_submission_through_once(tmp_path: Path, monkeypatch, jobs) -> None:
    monkeypatch.setattr(execute, "run_verdict", _passing([]))
    reads: list[str] = []
    real_read = intake.read

    def read(source: intake.Submission, lang: str) -> intake.Read:
        reads.append(source.identity)
        return real_read(source, lang)

    monkeypatch.setattr(intake, "read", read)
    path = write(synthetic_release(), tmp_path / "release.ipynb")
    names = ["alice", "bob", "carol"]
    for name in names:
        write(synthetic_solved(), tmp_path / "subs" / name / "work.ipynb")
    args = _class_args(tmp_path, path, jobs)
    with Entries() as seen:
        assert grade_class.grade_main(args) == 0
    main = seen.by_thread.pop(threading.current_thread().name)
    # The class: found (1), its release checked (2); after the pool, the class's files (6),
    # the similarity report among them, from the notebooks stage 1 read: nothing read again.
    assert main == [1, 2, 6]
    assert sorted(reads) == names
    # Each worker thread: per submission 1, 2, 4, 5, 6, and nothing else.
    runs = [
        stages[i : i + 5]
        for stages in seen.by_thread.values()
        for i, stage in enumerate(stages)
        if stage == 1
    ]
    assert runs == [[1, 2, 4, 5, 6]] * len(names)
    assert sum(len(s) for s in seen.by_thread.values()) == 5 * len(names)
    assert (tmp_path / "out" / "similarity.md").is_file()


def test_every_submission_keeps_its_own_feedback_and_results_file(
    tmp_path: Path, monkeypatch
) -> None:
    """A folder named as another's hashed name ("a b" -> "a_b-<hash>"), and two names that
    differ only in case, do not share (and overwrite) a feedback or results file."""
    monkeypatch.setattr(execute, "run_verdict", _passing([]))
    path = write(synthetic_release(), tmp_path / "release.ipynb")
    names = ["a b", report.file_name("a b"), "Alice", "alice"]
    for name in names:
        write(synthetic_solved(), tmp_path / "subs" / name / "work.ipynb")
    args = _class_args(tmp_path, path, 1)
    assert grade_class.grade_main(args) == 0
    feedback = sorted((tmp_path / "out" / "feedback").glob("*.md"))
    results = sorted((tmp_path / "out" / "results").glob("*.json"))
    assert len(feedback) == len(results) == len(names)
    assert len({p.name.casefold() for p in feedback}) == len(names)
    # each file names its own student (the feedback shows the identity in code font)
    owners = sorted(n for p in feedback for n in names if report.code_span(n) in p.read_text())
    assert owners == sorted(names)
