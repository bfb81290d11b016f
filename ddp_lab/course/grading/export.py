"""Grades into the tools instructors use: Gradescope's autograder and GitHub Classroom.

- ``gradescope_results``: one submission's results as Gradescope's ``results.json`` (the
  fields of https://gradescope-autograders.readthedocs.io/en/latest/specs/: ``score``,
  ``execution_time``, ``output``, ``tests`` with ``name``, ``score``, ``max_score``,
  ``status``, ``output``, ``visibility``);
- ``write_gradescope_zip``: the autograder zip (``setup.sh`` and ``run_autograder`` at its
  root, the release and this package's source beside them); the seed is written into
  ``run_autograder``, which only instructors see;
- ``classroom_workflow``: a GitHub Actions workflow for GitHub Classroom, one
  ``autograding-command-grader`` step per exercise (``ddp-lab check --only ID``) and the
  grading reporter. It runs in the learner's own repository, which the learner controls:
  it is feedback with points, not a verdict the learner cannot touch (use ``ddp-lab grade``
  or Gradescope for that).
"""

from __future__ import annotations

import json
import shlex
import stat
import zipfile
from pathlib import Path
from typing import Any

from ddp_lab.i18n import _t, lookup

STATUSES = ("passed", "failed")
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")


def gradescope_results(
    results: list[Any],
    lang: str,
    execution_time: float,
    notes: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Gradescope's results.json for one submission (``results``: ``judge.Result``s).

    Outputs are Markdown: the status is the grader's, each detail (which quotes the
    learner's code and output) is in a fenced block, never markup. ``notes``: the
    grader's own lines for the top output (e.g. that it ran without a sandbox).
    """
    from ddp_lab.course.grading import report
    from ddp_lab.course.grading.judge import MESSAGES as msg

    tests = []
    for number, r in enumerate(results, 1):
        detail = f"\n\n{report.code_block(r.detail)}" if r.detail else ""
        tests.append(
            {
                "name": f"{r.grade_id}",
                "number": str(number),
                "score": float(r.points),
                "max_score": float(r.max_points),
                "status": "passed" if r.status == "passed" else "failed",
                "output": (lookup(msg, r.status, lang) + f"{detail}"),
                "output_format": "md",
                "visibility": "visible",
            }
        )
    total = _t(
        "total {points}/{max_points} points",
        lang,
        points=sum(r.points for r in results),
        max_points=sum(r.max_points for r in results),
    )
    doc: dict[str, Any] = {
        "score": float(sum(r.points for r in results)),
        "execution_time": round(execution_time, 1),
        "output": "\n\n".join([*(notes or []), total]),
        "output_format": "md",
        "stdout_visibility": "hidden",
        "tests": tests,
    }
    if extra:
        doc["extra_data"] = dict(extra)
    return doc


def validate_gradescope(doc: dict[str, Any]) -> list[str]:
    """Problems of ``doc`` against Gradescope's documented results.json fields ([] if none)."""
    problems = []
    number = (int, float)
    if not isinstance(doc, dict):
        return ["not an object"]
    if "score" not in doc and not all("score" in t for t in doc.get("tests", [])):
        problems.append("score is required at the top or on every test")
    for key, kind in (
        ("score", number),
        ("execution_time", number),
        ("output", str),
        ("extra_data", dict),
        ("tests", list),
    ):
        if key in doc and not isinstance(doc[key], kind):
            problems.append(f"{key} has the wrong type")
    for key in ("visibility", "stdout_visibility"):
        if key in doc and doc[key] not in VISIBILITIES:
            problems.append(f"{key} must be one of {VISIBILITIES}")
    for i, t in enumerate(doc.get("tests", [])):
        if not isinstance(t, dict):
            problems.append(f"tests[{i}] is not an object")
            continue
        for key, kind in (
            ("score", number),
            ("max_score", number),
            ("name", str),
            ("number", str),
            ("output", str),
        ):
            if key in t and not isinstance(t[key], kind):
                problems.append(f"tests[{i}].{key} has the wrong type")
        if "status" in t and t["status"] not in STATUSES:
            problems.append(f"tests[{i}].status must be passed or failed")
        if "visibility" in t and t["visibility"] not in VISIBILITIES:
            problems.append(f"tests[{i}].visibility is not a documented value")
        allowed = {
            "score",
            "max_score",
            "status",
            "name",
            "name_format",
            "number",
            "output",
            "output_format",
            "tags",
            "visibility",
            "extra_data",
        }
        problems += [f"tests[{i}].{k} is not a documented field" for k in t if k not in allowed]
    allowed_top = {
        "score",
        "execution_time",
        "output",
        "output_format",
        "test_output_format",
        "test_name_format",
        "visibility",
        "stdout_visibility",
        "extra_data",
        "tests",
        "leaderboard",
    }
    problems += [f"{k} is not a documented field" for k in doc if k not in allowed_top]
    return problems


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
apt-get update -q
# bubblewrap: the sandboxes; iproute2: ss, with which the grader counts the bytes that 05.ring's
# ranks send each other (course/grading/traffic.py)
apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip bubblewrap iproute2
python3 -m venv /autograder/venv
# torch first, the CPU build (the autograder has no GPU; the CUDA build is gigabytes more).
/autograder/venv/bin/pip install -q {torch_index}{torch}
/autograder/venv/bin/pip install -q /autograder/source/ddp-lab
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission; results go to /autograder/results/results.json.
set -uo pipefail
sub=$(find /autograder/submission -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | head -n 1)
mkdir -p /autograder/results
if [ -z "$sub" ]; then
  echo '{{"score": 0, "output": "No .ipynb notebook was submitted."}}' >/autograder/results/results.json
  exit 0
fi
# The container's memory and CPUs first: too small, results.json says so and nothing is graded
# (course/grading/gradescope.py; the settings: docs/INSTRUCTORS.md).
if ! /autograder/venv/bin/python -m ddp_lab.course.grading.gradescope --need-memory-mib {memory} \
    --need-cpus {cpus} --lang {lang} --results /autograder/results/results.json; then
  exit 0
fi
export DDP_LAB_GRADE_SEED={seed}
/autograder/venv/bin/ddp-lab grade --release /autograder/source/{release} "$sub" \\
  --out /tmp/ddp-lab-grades --gradescope /autograder/results/results.json
"""


def write_gradescope_zip(
    release: Path,
    out: Path,
    seed: str,
    package_root: Path,
    torch_spec: str = "torch==2.13.0",
    torch_index: str = TORCH_CPU_INDEX,
) -> Path:
    """Write the Gradescope autograder zip for ``release``; return its path.

    ``torch_index``: the index torch is installed from (PyTorch's CPU wheels by default;
    ``""``: PyPI's default build).
    """
    out.parent.mkdir(parents=True, exist_ok=True)

    def add(z: zipfile.ZipFile, name: str, text: str, executable: bool = False) -> None:
        info = zipfile.ZipInfo(name)
        info.external_attr = (0o755 if executable else 0o644) << 16 | stat.S_IFREG << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, text)

    with zipfile.ZipFile(out, "w") as z:
        index = f"--index-url {shlex.quote(torch_index)} " if torch_index else ""
        setup = SETUP_SH.format(torch=shlex.quote(torch_spec), torch_index=index)
        add(z, "setup.sh", setup, executable=True)
        from ddp_lab.course.grading.gradescope import need_for

        memory, cpus = need_for(release.name)
        lang = release.parent.name if release.parent.name in ("en", "zh") else "en"
        run = RUN_AUTOGRADER.format(
            seed=shlex.quote(seed),
            release=shlex.quote(release.name),
            memory=memory,
            cpus=cpus,
            lang=lang,
        )
        add(z, "run_autograder", run, executable=True)
        z.write(release, release.name)
        for name in ("pyproject.toml", "README.md"):
            z.write(package_root / name, f"ddp-lab/{name}")
        for path in package_files(package_root):
            z.write(path, f"ddp-lab/{path.relative_to(package_root)}")
    return out


def package_files(package_root: Path) -> list[Path]:
    """The package as ``pip install`` needs it: its modules and its data (the compiled zh
    catalog above all: without it every Chinese message raises in the autograder image),
    not the bytecode caches."""
    package = package_root / "ddp_lab"
    return sorted(
        p for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.relative_to(package).parts
    )  # fmt: skip


def classroom_workflow(
    release: Path, notebook_in_repo: str, exercises: list[Any], torch_index: str = TORCH_CPU_INDEX
) -> str:
    """A GitHub Classroom autograding workflow: one step per exercise, then the reporter.

    torch comes from ``torch_index`` (PyTorch's CPU wheels by default: the runners have no
    GPU), installed before ``setup.sh``, which keeps it; ``""``: setup.sh's own choice.
    """
    steps = []
    ids = []
    for ex in exercises:
        step_id = "ex-" + ex.grade_id.replace(".", "-").replace("_", "-")
        ids.append(step_id)
        command = f".venv/bin/ddp-lab check {shlex.quote(notebook_in_repo)} --only {ex.grade_id}"
        steps.append(
            f"""      - name: {ex.grade_id}
        id: {step_id}
        uses: classroom-resources/autograding-command-grader@v1
        with:
          test-name: {json.dumps(ex.grade_id)}
          setup-command: ""
          command: {json.dumps(command)}
          timeout: 30
          max-score: {ex.points}"""
        )
    env = "\n".join(
        f'          {i.upper()}_RESULTS: "${{{{steps.{i}.outputs.result}}}}"' for i in ids
    )
    # torch first, into the venv setup.sh uses: setup.sh keeps a torch that imports.
    torch_step = (
        "          python -m venv .venv\n"
        f"          .venv/bin/pip install -q --index-url {shlex.quote(torch_index)} torch==2.13.0\n"
        if torch_index
        else ""
    )
    return f"""# GitHub Classroom autograding for {release.name}, written by `ddp-lab classroom`.
# Put it in the assignment's template repository as .github/workflows/classroom.yml.
name: Autograding Tests
on: [push, workflow_dispatch, repository_dispatch]
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install the course (this repository is a copy of it)
        run: |
          sudo apt-get update -q
          sudo apt-get install -y -q bubblewrap iproute2
{torch_step}          bash setup.sh --no-lab
{chr(10).join(steps)}
      - name: Autograding Reporter
        uses: classroom-resources/autograding-grading-reporter@v1
        env:
{env}
        with:
          runners: {",".join(ids)}
"""
