"""benchmarks/gpu_check.sh keeps to its budget: a GPU machine is lent for minutes, so a check
that runs out of time must still end on its own, say what it cut, return what it wrote in the
few files the device tool brings back, and leave nothing behind. (What the check itself checks
runs on a GPU machine, docs/gpu-verified.md; a rehearsal on CPU is recorded there too.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_check_out_of_budget_stops_says_what_it_cut_and_leaves_nothing(tmp_path: Path) -> None:
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "OUT": str(out), "TMPDIR": str(tmp), "BUDGET_S": "12",
           "BACKEND": "gloo", "PYTHON": sys.executable, "JOBS": "2"}  # fmt: skip
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode != 0, run.stdout[-3000:]  # a cut check does not pass
    summary = (out / "summary.txt").read_text()
    assert "FAIL (cut at the budget) training pair (gloo)" in summary
    assert (
        "FAIL notebooks cut at the budget or not started: notebooks/en/00_quickstart.ipynb"
        in summary
    )
    assert "notebooks: 0 passed, 0 failed" in summary
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir()), files
    assert {"summary.txt", "setup.log", "details.tar.gz"} <= set(files)
    assert list(tmp.iterdir()) == []  # its work folder is gone
    # Cut, not run: a step that ignored the budget would have run its tests (minutes).
    assert "FAIL (cut at the budget) unit tests" in summary
    assert "FAIL (cut at the budget) pytest -m gpu" in summary
