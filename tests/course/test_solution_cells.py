"""The reduced solution notebooks test.sh runs (tests/solution_cells.py) leave no code cell
of a solution notebook unrun: each is kept, or is a cell of its chapter's lesson notebook,
which runs whole."""

from __future__ import annotations

import nbformat
import pytest
from solution_cells import ROOT, reduced, write_all  # tests/ is on sys.path, as for conftest

SOLUTIONS = sorted((ROOT / "solutions" / "en").glob("*.ipynb"))


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem[:2])
def test_every_cell_of_a_solution_runs_in_the_reduced_notebook_or_in_the_lesson(solution):
    lesson = ROOT / "notebooks" / "en" / solution.name
    code = [c for c in nbformat.read(solution, as_version=4).cells if c.cell_type == "code"]
    taught = {c.source for c in nbformat.read(lesson, as_version=4).cells if c.cell_type == "code"}
    nb, kept = reduced(solution, lesson)
    assert [c.source for c in nb.cells] == [code[i].source for i in kept]
    assert kept == sorted(kept)
    for i, cell in enumerate(code):
        assert i in kept or cell.source in taught, (solution.name, i, cell.source[:80])
    graded = [i for i, c in enumerate(code) if "grade_id" in c.metadata]
    assert graded and set(graded) <= set(kept)


def test_the_reduced_notebooks_are_smaller_and_keep_the_kernel(tmp_path):
    # Two levels below the repository (build/solutions-en in test.sh); here a temporary folder.
    written = write_all(tmp_path / "en")
    assert [p.name for p in written] == [p.name for p in SOLUTIONS]
    dropped = 0
    for path, solution in zip(written, SOLUTIONS, strict=True):
        nb = nbformat.read(path, as_version=4)
        whole = nbformat.read(solution, as_version=4)
        assert nb.metadata.kernelspec == whole.metadata.kernelspec
        dropped += sum(c.cell_type == "code" for c in whole.cells) - len(nb.cells)
    assert dropped > 100  # what the lessons already run
