"""Classroom 50 (foundation50/classroom50): ``ddp-lab classroom``'s ``autograder.py``.

Classroom 50 runs ``CLASSROOM/autograders/ASSIGNMENT/autograder.py`` once per submission, in
the learner's checkout, with the files beside it, and reads ``./result.json``: schema
``classroom50/result/v1``, identity from the runner's environment (``CLASSROOM``,
``ASSIGNMENT``, ``SUBMISSION_TAG``, ``COMMIT_URL``, ``RELEASE_URL``, ``REVIEW_URL``),
``datetime`` the graded commit's committer date, ``score``/``max-score`` ints and ``tests`` of
``{"test-name", "passed", "score", "max-score"}`` (extra fields kept). Exit 0 when it ran;
non-zero is an infrastructure error. Source: the project's wiki, Advanced-Autograding.md
("Writing an autograder.py", "The result.json contract"). GitHub Classroom's workflow
(``export.classroom_workflow``) stays as ``--target github-classroom``; it is being retired.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_lab.course.grading.export import TORCH_CPU_INDEX

CLASSROOM50_AUTOGRADER = '''"""Classroom 50 autograder for {release}, written by `ddp-lab classroom`.

Put this file and {release} in CLASSROOM/autograders/ASSIGNMENT/ of your classroom50
repository. Runtime block for the assignment: {{"runs-on": "ubuntu-latest", "python": "3.11",
"apt": ["bubblewrap", "iproute2"]}}. It grades {notebook} of the learner's checkout with
`ddp-lab grade` against the release beside this file (not the learner's copy) and writes
./result.json. It runs in the learner's own repository with the default seed's cases: use it for
feedback with points, and `ddp-lab grade` or Gradescope (the instructor's seed) for marks.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RELEASE = HERE / {release!r}
NOTEBOOK = {notebook!r}
PACKAGE = {package!r}  # pip spec of ddp-lab
TORCH = ["--index-url", {torch_index!r}, "torch==2.13.0"] if {torch_index!r} else ["torch==2.13.0"]
EXERCISES = {exercises!r}  # grade_id -> points, from the release


def ddp_lab() -> str:
    """The ddp-lab command: $DDP_LAB_BIN if set (a runner with the course installed), else
    installed into a fresh venv."""
    if os.environ.get("DDP_LAB_BIN"):
        return os.environ["DDP_LAB_BIN"]
    venv = Path(tempfile.gettempdir()) / "ddp-lab-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    subprocess.run([*pip, *TORCH], check=True)
    subprocess.run([*pip, PACKAGE], check=True)
    return str(venv / "bin" / "ddp-lab")


def submitted_at() -> str:
    """The graded commit's committer date in UTC (the contract's "datetime")."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ct"], capture_output=True, text=True, check=True
        ).stdout.strip()
        when = datetime.datetime.fromtimestamp(int(out), datetime.timezone.utc)
    except (OSError, ValueError, subprocess.CalledProcessError):
        when = datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def tests_of(doc: dict) -> list:
    """result.json's tests from ddp-lab's Gradescope results (one per exercise)."""
    tests = []
    for t in doc.get("tests", []):
        score, most = int(t.get("score", 0)), int(t.get("max_score", 0))
        tests.append({{
            "test-name": str(t.get("name", "")),
            "passed": t.get("status") == "passed" and score == most,
            "score": score,
            "max-score": most,
            "output": str(t.get("output", "")),
        }})
    return tests


def missing(why: str) -> list:
    return [
        {{"test-name": g, "passed": False, "score": 0, "max-score": p, "output": why}}
        for g, p in EXERCISES.items()
    ]


def main() -> int:
    notebook = Path(NOTEBOOK)
    if notebook.is_file():
        command = ddp_lab()
        with tempfile.TemporaryDirectory() as tmp:
            doc_path = Path(tmp) / "results.json"
            subprocess.run(
                [command, "grade", "--release", str(RELEASE), str(notebook),
                 "--out", str(Path(tmp) / "out"), "--gradescope", str(doc_path)],
                check=False,
            )
            if not doc_path.is_file():
                print("ddp-lab grade wrote no results", file=sys.stderr)
                return 1  # the runner reports an infrastructure error, not a zero
            tests = tests_of(json.loads(doc_path.read_text(encoding="utf-8")))
    else:
        tests = missing(f"{{NOTEBOOK}} is not in the repository")
    env = os.environ.get
    result = {{
        "schema": "classroom50/result/v1",
        "classroom": env("CLASSROOM", ""),
        "assignment": env("ASSIGNMENT", ""),
        "submission": env("SUBMISSION_TAG", ""),
        "commit": env("COMMIT_URL", ""),
        "release": env("RELEASE_URL", ""),
        "review": env("REVIEW_URL") or env("COMMIT_URL", ""),
        "datetime": submitted_at(),
        "graded_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "score": sum(t["score"] for t in tests),
        "max-score": sum(t["max-score"] for t in tests),
        "tests": tests,
    }}
    Path("result.json").write_text(json.dumps(result, indent=2, ensure_ascii=False), "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def classroom50_autograder(
    release: Path,
    notebook_in_repo: str,
    exercises: list[Any],
    package: str,
    torch_index: str = TORCH_CPU_INDEX,
) -> str:
    """Classroom 50's ``autograder.py`` for ``release`` (see ``CLASSROOM50_AUTOGRADER``)."""
    return CLASSROOM50_AUTOGRADER.format(
        release=release.name,
        notebook=notebook_in_repo,
        package=package,
        torch_index=torch_index,
        exercises={ex.grade_id: int(ex.points) for ex in exercises},
    )
