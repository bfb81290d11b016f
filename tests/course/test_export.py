"""course.export: Gradescope's results.json and autograder zip, GitHub Classroom's workflow."""

from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path

import nbformat
import pytest
import yaml

from ddp_lab.course import cli
from ddp_lab.course.grading import export
from ddp_lab.course.grading.judge import Result
from ddp_lab.course.grading.release import exercises_of

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "exercises" / "en" / "07_ddp_from_scratch.ipynb"

RESULTS = [
    Result("07.naive_ddp", 3, 3, "passed", "PASS 07.naive_ddp"),
    Result("07.bucketed", 0, 3, "failed", "FAIL 07.bucketed: 0/3 points. Hidden case 2 of 3 ..."),
]


def test_results_json_has_gradescopes_documented_fields() -> None:
    doc = export.gradescope_results(RESULTS, "zh", 12.34)
    assert export.validate_gradescope(doc) == []
    assert doc["score"] == 3.0 and doc["execution_time"] == 12.3
    assert [(t["name"], t["score"], t["max_score"], t["status"]) for t in doc["tests"]] == [
        ("07.naive_ddp", 3.0, 3.0, "passed"),
        ("07.bucketed", 0.0, 3.0, "failed"),
    ]
    assert "未通过" in doc["tests"][1]["output"]  # the learner's language
    json.dumps(doc)  # plain JSON


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        ({"tests": [{"name": "x", "max_score": 1}]}, "score is required"),
        ({"score": "3"}, "score has the wrong type"),
        ({"score": 1, "tests": [{"score": 1, "status": "ok"}]}, "status must be"),
        ({"score": 1, "visibility": "sometimes"}, "visibility must be"),
        ({"score": 1, "grade": 2}, "grade is not a documented field"),
    ],
)
def test_validator_catches_what_gradescope_would_reject(broken: dict, problem: str) -> None:
    assert any(problem in p for p in export.validate_gradescope(broken))


def test_autograder_zip(tmp_path: Path) -> None:
    out = tmp_path / "autograder.zip"
    assert (
        cli.main(
            ["gradescope", "--release", str(RELEASE), "--seed", "spring-26", "--out", str(out)]
        )
        == 0
    )
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert {"setup.sh", "run_autograder", RELEASE.name, "ddp-lab/pyproject.toml"} <= names
        assert "ddp-lab/ddp_lab/course/grading/verdict.py" in names
        assert not any(n.startswith(("ddp-lab/solutions", "ddp-lab/chapters")) for n in names)
        for script in ("setup.sh", "run_autograder"):
            mode = z.getinfo(script).external_attr >> 16
            assert mode & stat.S_IXUSR, script
        run = z.read("run_autograder").decode()
        assert "DDP_LAB_GRADE_SEED=spring-26" in run
        assert "--gradescope /autograder/results/results.json" in run
        assert "bubblewrap" in z.read("setup.sh").decode()


def test_classroom_workflow(tmp_path: Path) -> None:
    out = tmp_path / "classroom.yml"
    args = ["classroom", "--target", "github-classroom", "--release", str(RELEASE)]
    args += ["--notebook", "07.ipynb", "--out", str(out)]
    assert cli.main(args) == 0
    wf = yaml.safe_load(out.read_text(encoding="utf-8"))
    steps = wf["jobs"]["run-autograding-tests"]["steps"]
    graders = [s for s in steps if "autograding-command-grader" in s.get("uses", "")]
    exercises = exercises_of(nbformat.read(RELEASE, as_version=4))
    assert [s["with"]["test-name"] for s in graders] == [e.grade_id for e in exercises]
    assert [s["with"]["max-score"] for s in graders] == [e.points for e in exercises]
    assert all("--only" in s["with"]["command"] for s in graders)
    reporter = steps[-1]
    assert reporter["with"]["runners"] == ",".join(s["id"] for s in graders)
    assert set(reporter["env"]) == {s["id"].upper() + "_RESULTS" for s in graders}


def test_grade_writes_results_json_for_gradescope(tmp_path: Path) -> None:
    from test_grader import synthetic_release, synthetic_solved, write

    release = write(synthetic_release(), tmp_path / "release.ipynb")
    nb = synthetic_solved()
    nb.cells[4].source = "def g():\n    return 3"  # exercise g is wrong
    write(nb, tmp_path / "submission" / "mine.ipynb")
    results = tmp_path / "autograder" / "results" / "results.json"
    args = ["grade", "--release", str(release), str(tmp_path / "submission")]
    assert cli.main([*args, "--out", str(tmp_path / "out"), "--gradescope", str(results)]) == 0
    doc = json.loads(results.read_text(encoding="utf-8"))
    assert export.validate_gradescope(doc) == []
    assert doc["score"] == 1.0
    assert [t["status"] for t in doc["tests"]] == ["passed", "failed"]
    assert "g() returned 3" in doc["tests"][1]["output"]
    assert json.loads((tmp_path / "out" / "results" / "mine.json").read_text()) == doc
