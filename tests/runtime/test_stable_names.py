"""Rank output names notebook code as IPython does, so a notebook's output survives a restart.

``notebooks/stable_names.ipynb`` warns and fails in ranks (``dl.spawn``, ``%%ddp``, ``%%ranks``)
from functions defined in its cells. Its stored outputs (from a run in a kernel with history,
like JupyterLab's) say ``Cell, line L``; a cell's file, ``/tmp/ipykernel_<pid>/<hash>.py``,
would differ in every kernel, and IPython's ``In[N]`` differs between JupyterLab and nbval. test.sh runs the
notebooks under ``--nbval-lax`` (only tagged cells compared), so this test runs this one under
strict ``--nbval`` (every output compared) itself, in two fresh kernels.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).parent / "notebooks" / "stable_names.ipynb"


def _strict_nbval(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=path.parent,
    )


def _stored_text(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "".join(
        "".join(out.get("text", "")) for cell in cells for out in cell.get("outputs", [])
    )


def test_stored_outputs_name_cells_not_files():
    text = _stored_text(NOTEBOOK)
    assert "[rank 1] Cell, line 2: UserWarning: rank 1 was here" in text
    assert "Traceback (most recent call last):\n  Cell, line 8, in fail_on_rank_1\n" in text
    assert "[rank 0] Cell, line 1: UserWarning: %%ddp cell on rank 0" in text
    assert "[rank 1] Cell, line 2: UserWarning: %%ranks cell on rank 1" in text
    assert "ipykernel_" not in text and "launcher.py" not in text


def test_notebook_passes_strict_nbval_in_two_fresh_kernels():
    for run in (1, 2):
        result = _strict_nbval(NOTEBOOK)
        assert result.returncode == 0, f"run {run}:\n{result.stdout[-4000:]}\n{result.stderr}"
        assert "8 passed" in result.stdout  # every code cell, result.stdout[-2000:]


def test_strict_nbval_compares_the_rank_output(tmp_path):
    """The check above can fail: a stored rank traceback with another line number is caught."""
    changed = tmp_path / NOTEBOOK.name
    changed.write_text(NOTEBOOK.read_text().replace("Cell, line 8", "Cell, line 9"))
    result = _strict_nbval(changed)
    assert result.returncode != 0, result.stdout[-2000:]
