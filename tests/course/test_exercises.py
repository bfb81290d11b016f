"""Every graded cell of every unsolved exercise notebook must FAIL, and show no verdict.

A grader that passes an unsolved exercise is a defect. (That the same cells pass in the
solution notebooks is checked by running solutions/ under nbval.) An unsolved notebook
shows no pass line as if it had passed: its graded cells store the pass line behind a
label ("when solved, this cell prints: "), and the sanitizer the course ships lets nbval
compare a solved copy against it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from _solutions import graded_solution
from nbclient import NotebookClient

from ddp_lab.course import build
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import LocalLearner
from ddp_lab.i18n import _t

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = sorted((ROOT / "exercises").glob("*/*.ipynb"))


def _pass_line(nb: nbformat.NotebookNode, cell: nbformat.NotebookNode) -> str:
    lang = nb.metadata["ddp_lab"]["lang"]
    return build.grade_pass_line(cell.metadata["grade_id"], int(cell.metadata["points"]), lang)


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_unsolved_notebook_shows_no_verdict(path):
    nb = nbformat.read(path, as_version=4)
    lang = nb.metadata["ddp_lab"]["lang"]
    label = _t("when solved, this cell prints: ", lang)
    verdicts = [build.grade_pass_line("", 0, lang).split()[0], "points", "得分"]
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                # every stored line that names a verdict is the labelled target of a graded cell
                if any(word in line for word in verdicts):
                    assert "grade" in cell.metadata.get("tags", []), (i, line)
                    assert line == label + _pass_line(nb, cell), (i, line)


def _nbval(path: Path) -> subprocess.CompletedProcess:
    sanitize = ROOT / build.SANITIZE_FILE
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
         "--nbval-sanitize-with", str(sanitize), "--nbval-cell-timeout=300", path.name],
        cwd=path.parent, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.mark.parametrize("lang", ["en"])
def test_nbval_with_the_shipped_sanitizer_passes_solved_and_fails_unsolved(tmp_path, lang):
    """What a learner who checks themselves runs: strict ``pytest --nbval`` with
    ``--nbval-sanitize-with exercises/nbval_sanitize.cfg`` on their copy (chapter 00, the
    quickest; the label and sanitizer are the same for every chapter)."""
    exercise = ROOT / "exercises" / lang / "00_quickstart.ipynb"
    solution = nbformat.read(ROOT / "solutions" / lang / "00_quickstart.ipynb", as_version=4)
    folder = tmp_path / lang  # the notebook takes its language from its folder, as in work/
    folder.mkdir()
    unsolved = folder / "unsolved.ipynb"
    unsolved.write_bytes(exercise.read_bytes())
    solved_nb = nbformat.read(exercise, as_version=4)
    for mine, theirs in zip(solved_nb.cells, solution.cells, strict=True):
        if mine.cell_type == "code" and "grade" not in mine.metadata.get("tags", []):
            mine.source = theirs.source  # the learner's answers; graded cells untouched
    solved = folder / "solved.ipynb"
    nbformat.write(solved_nb, solved)
    ok = _nbval(solved)
    assert ok.returncode == 0, ok.stdout[-3000:]
    bad = _nbval(unsolved)
    assert bad.returncode != 0, bad.stdout[-3000:]
    assert "NotImplementedError" in bad.stdout


# Every graded cell of every unsolved notebook, both languages: the stubs the graded cell
# passes to ``dl.grade`` (the same cells a kernel runs for them: the notebook's imports, then
# the last cell above the graded one that defines each name; tests/_solutions.py) through
# what ``dl.grade`` runs, the chapter's checker with a ``LocalLearner``. The lesson's other
# cells (its demonstrations, seconds to minutes each) change nothing the checker sees.
GRADED = [
    (path.parent.name, cell.metadata["grade_id"])
    for path in EXERCISES
    for cell in nbformat.read(path, as_version=4).cells
    if "grade" in cell.metadata.get("tags", [])
]


@pytest.mark.parametrize(("lang", "grade_id"), GRADED, ids=[f"{lang}/{g}" for lang, g in GRADED])
def test_unsolved_stubs_fail_their_checker(lang: str, grade_id: str) -> None:
    objects = graded_solution(grade_id, lang, kind="exercises")
    passed, line = run_checker(load_checkers([grade_id])[grade_id], LocalLearner(objects), lang)
    assert not passed, line
    assert grade_id in line and build.grade_pass_line(grade_id, 0, lang)[:8] not in line, line
    # the stub's own error, said as such (a concept check: no answer given)
    assert grade_id.endswith(".concepts") or "NotImplementedError" in line, line


# The whole unsolved notebook in a kernel, as a learner runs it, for two: chapter 05 (a rank
# exercise whose ranks' traffic is judged too) in en, chapter 00 in zh (the verdict's
# language from the notebook's folder). en 00 runs in the sanitizer's test above.
RUN = [p for p in EXERCISES if f"{p.parent.name}/{p.stem[:2]}" in ("en/05", "zh/00")]


@pytest.mark.parametrize("path", RUN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_unsolved_graded_cells_fail(path):
    nb = nbformat.read(path, as_version=4)
    graded = [i for i, c in enumerate(nb.cells) if "grade" in c.metadata.get("tags", [])]
    assert graded, "an exercise notebook without graded cells"
    expected = {i: _pass_line(nb, nb.cells[i]) for i in graded}
    NotebookClient(
        nb, timeout=300, allow_errors=True, resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    for i in graded:
        outputs = nb.cells[i].outputs
        errors = [o for o in outputs if o.output_type == "error"]
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert errors, f"graded cell {i} ({nb.cells[i].metadata['grade_id']}) did not fail"
        assert expected[i] not in text
