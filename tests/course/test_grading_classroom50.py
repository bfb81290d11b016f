"""``ddp-lab classroom`` writes for Classroom 50 (issue 41, item 8): an ``autograder.py`` and
the release beside it; run in a learner's checkout, it writes ``result.json`` as Classroom
50's contract says (schema ``classroom50/result/v1``; the project's wiki,
Advanced-Autograding.md, "The result.json contract"). Honest work gets full points, the
untouched exercise zero, not attempted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from ddp_lab.course import cli
from ddp_lab.course.grading import grader

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "exercises" / "en" / "00_quickstart.ipynb"
SOLUTION = ROOT / "solutions" / "en" / "00_quickstart.ipynb"
NOTEBOOK = "work/00_quickstart.ipynb"
ENV = {
    "CLASSROOM": "dp-2026",
    "ASSIGNMENT": "quickstart",
    "SUBMISSION_TAG": "submit/2026-11-28T12-00-00Z-abc1234",
    "COMMIT_URL": "https://github.com/o/r/commit/abc1234",
    "RELEASE_URL": "https://github.com/o/r/releases/tag/submit%2Fx",
}


def write(tmp: Path) -> Path:
    folder = tmp / "autograder"
    args = ["classroom", "--release", str(RELEASE), "--notebook", NOTEBOOK, "--out", str(folder)]
    assert cli.main(args) == 0
    return folder


def checkout(tmp: Path, name: str, notebook: Path | None) -> Path:
    """A learner's repository with ``notebook`` at NOTEBOOK, committed."""
    repo = tmp / name
    (repo / "work").mkdir(parents=True)
    if notebook:
        shutil.copy(notebook, repo / NOTEBOOK)
    git = ["git", "-c", "user.name=l", "-c", "user.email=l@x", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x", "--date=@1700000000"],
                   check=True, env={**os.environ, "GIT_COMMITTER_DATE": "@1700000000"})  # fmt: skip
    return repo


def run(folder: Path, repo: Path) -> dict:
    env = {**os.environ, **ENV, "DDP_LAB_BIN": str(Path(sys.executable).parent / "ddp-lab")}
    subprocess.run([sys.executable, str(folder / "autograder.py")], cwd=repo, env=env, check=True)
    return json.loads((repo / "result.json").read_text(encoding="utf-8"))


def test_the_written_files(tmp_path: Path, capsys) -> None:
    folder = write(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["00_quickstart.ipynb", "autograder.py"]
    assert (folder / "00_quickstart.ipynb").read_bytes() == RELEASE.read_bytes()
    text = (folder / "autograder.py").read_text(encoding="utf-8")
    compile(text, "autograder.py", "exec")
    exercises = grader.exercises_of(nbformat.read(RELEASE, as_version=4))
    assert repr({e.grade_id: e.points for e in exercises}) in text
    assert '"classroom50/result/v1"' in text and repr(NOTEBOOK) in text
    out = capsys.readouterr()
    assert "CLASSROOM/autograders/ASSIGNMENT/" in out.out
    assert "--package" in out.err  # installing from the learner's checkout is said to be weak


def test_result_json_follows_the_contract_honest_unsolved_and_missing(tmp_path: Path) -> None:
    folder = write(tmp_path)
    honest = run(folder, checkout(tmp_path, "honest", SOLUTION))
    unsolved = run(folder, checkout(tmp_path, "unsolved", RELEASE))
    missing = run(folder, checkout(tmp_path, "missing", None))
    for doc in (honest, unsolved, missing):
        assert doc["schema"] == "classroom50/result/v1"
        assert doc["classroom"] == "dp-2026" and doc["assignment"] == "quickstart"
        assert doc["submission"] == ENV["SUBMISSION_TAG"] and doc["commit"] == ENV["COMMIT_URL"]
        assert doc["release"] == ENV["RELEASE_URL"] and doc["review"] == ENV["COMMIT_URL"]
        assert doc["datetime"] == "2023-11-14T22:13:20Z"  # the graded commit's date, UTC
        assert [t["test-name"] for t in doc["tests"]] == ["00.average", "00.concepts"]
        assert all(type(doc[k]) is int for k in ("score", "max-score")), doc
        assert doc["max-score"] == 4 == sum(t["max-score"] for t in doc["tests"])
        assert doc["score"] == sum(t["score"] for t in doc["tests"])
    assert honest["score"] == 4 and all(t["passed"] for t in honest["tests"])
    assert unsolved["score"] == 0 and not any(t["passed"] for t in unsolved["tests"])
    assert all(t["output"].startswith("not attempted") for t in unsolved["tests"]), unsolved
    assert missing["score"] == 0 and "not in the repository" in missing["tests"][0]["output"]
