"""Every graded cell of every unsolved exercise notebook must FAIL.

A grader that passes an unsolved exercise is a defect. (That the same cells pass in the
solution notebooks is checked by running solutions/ under nbval.)
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = sorted((ROOT / "exercises").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_unsolved_graded_cells_fail(path):
    nb = nbformat.read(path, as_version=4)
    graded = [i for i, c in enumerate(nb.cells) if "grade" in c.metadata.get("tags", [])]
    assert graded, "an exercise notebook without graded cells"
    expected = {i: "".join(o.get("text", "") for o in nb.cells[i].outputs) for i in graded}
    NotebookClient(
        nb, timeout=300, allow_errors=True, resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    for i in graded:
        outputs = nb.cells[i].outputs
        errors = [o for o in outputs if o.output_type == "error"]
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert errors, f"graded cell {i} ({nb.cells[i].metadata['grade_id']}) did not fail"
        assert expected[i].strip() not in text
