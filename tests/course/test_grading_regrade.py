"""``ddp-lab grade`` as an instructor uses it a second time: regrading one student of a class,
grading another assignment, a Gradescope run, and which hidden cases are used.

Found walking docs/INSTRUCTORS.md through with a class: the natural regrade (``ddp-lab grade
--release R submissions/carol --out grades/``) booked carol under her notebook's file name
and replaced the whole class's gradebook with that one row, without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_grader import gradebook, synthetic_release, synthetic_solved, write

from ddp_lab.course import cli


def class_of_two(tmp_path: Path) -> tuple[Path, Path]:
    """A release, and a class folder: alice solved both exercises, bob got g wrong."""
    release = write(synthetic_release(), tmp_path / "release.ipynb")
    subs = tmp_path / "subs"
    write(synthetic_solved(), subs / "alice" / "release.ipynb")
    bob = synthetic_solved()
    bob.cells[4].source = "def g():\n    return 3"
    write(bob, subs / "bob" / "release.ipynb")
    return release, subs


def grade(release: Path, *args: str) -> int:
    return cli.main(["grade", "--release", str(release), *args])


def test_a_regrade_of_one_student_keeps_the_rest_of_the_class(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DDP_LAB_GRADE_SEED", raising=False)
    release, subs = class_of_two(tmp_path)
    out = tmp_path / "grades"
    assert grade(release, str(subs), "--out", str(out), "--jobs", "2") == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"Grading 2 submission(s) against {release}, 2 at a time")
    # The default seed's cases are the ones learners run at home: the instructor is told.
    assert "DDP_LAB_GRADE_SEED is not set" in said.err
    assert gradebook(out)[("bob", "selftest.g")] == (0, 2, "failed")
    similarity = (out / "similarity.md").read_text(encoding="utf-8")
    alice = (out / "feedback" / "alice.md").read_text(encoding="utf-8")

    # bob hands in again; the instructor regrades him alone, with a seed of their own.
    write(synthetic_solved(), subs / "bob" / "release.ipynb")
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", "spring")
    assert grade(release, str(subs), "--out", str(out), "--student", "bob") == 0
    said = capsys.readouterr()
    assert "Grading 1 submission(s)" in said.out and "DDP_LAB_GRADE_SEED" not in said.err
    assert gradebook(out) == {
        ("alice", "selftest.f"): (1, 1, "passed"),
        ("alice", "selftest.g"): (2, 2, "passed"),
        ("bob", "selftest.f"): (1, 1, "passed"),
        ("bob", "selftest.g"): (2, 2, "passed"),
    }
    totals = (out / "totals.csv").read_text(encoding="utf-8").splitlines()
    assert totals == [
        "student,total,max_points,statuses",
        "alice,3,3,passed",
        "bob,3,3,passed",
    ]
    assert "3/3" in (out / "feedback" / "bob.md").read_text(encoding="utf-8")
    assert (out / "feedback" / "alice.md").read_text(encoding="utf-8") == alice
    assert (out / "similarity.md").read_text(encoding="utf-8") == similarity  # the class's

    # A name that is not in the class's layout: nothing runs, the names there are listed.
    assert grade(release, str(subs), "--out", str(out), "--student", "carol") == 2
    err = capsys.readouterr().err
    assert "carol" in err and "alice, bob" in err


def test_a_run_that_would_replace_earlier_grades_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    release, subs = class_of_two(tmp_path)
    out = tmp_path / "grades"
    assert grade(release, str(subs), "--out", str(out), "--jobs", "2") == 0
    before = (out / "gradebook.csv").read_bytes()
    capsys.readouterr()
    # One student's folder, into the class's --out: booked under the file name ("release")
    # and written over alice's and bob's rows before; now refused before anything runs.
    assert grade(release, str(subs / "bob"), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "--student" in err and "alice, bob" in err
    # Another assignment into the same --out would have replaced this one's gradebook.
    other = synthetic_release()
    for cell in other.cells:
        if cell.metadata.get("grade_id"):
            cell.metadata["grade_id"] = cell.metadata["grade_id"].replace("selftest", "other")
            cell.source = cell.source.replace("selftest", "other")
    other_release = write(other, tmp_path / "other.ipynb")
    assert grade(other_release, str(subs), "--out", str(out)) == 2
    assert "selftest.f, selftest.g" in capsys.readouterr().err
    # ... and a regrade against it would mix the two in one gradebook.
    assert grade(other_release, str(subs), "--out", str(out), "--student", "bob") == 2
    assert "selftest.f, selftest.g" in capsys.readouterr().err
    assert (out / "gradebook.csv").read_bytes() == before
    assert not (out / "feedback" / "release.md").exists()
    # The whole class again into the same folder is fine.
    assert grade(release, str(subs), "--out", str(out), "--jobs", "2") == 0


def test_gradescope_output_wants_exactly_one_submission(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # It once graded the whole class and wrote no results.json, exiting 0.
    release, subs = class_of_two(tmp_path)
    results = tmp_path / "results.json"
    args = [str(subs), "--out", str(tmp_path / "out"), "--gradescope", str(results)]
    assert grade(release, *args) == 2
    assert "one submission; 2 were found" in capsys.readouterr().err
    assert not results.exists() and not (tmp_path / "out" / "gradebook.csv").exists()
