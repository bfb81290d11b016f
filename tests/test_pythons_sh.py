"""tests/pythons.sh: a Python it cannot find is reported and skipped, nothing installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_python_not_found_is_skipped_and_said(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "PYENV_ROOT": str(tmp_path),
        "PYTHONS_DIR": str(tmp_path / "venvs"),
    }
    run = subprocess.run(
        ["bash", str(ROOT / "tests/pythons.sh"), "3.99"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "python 3.99: SKIPPED, not found" in run.stdout
    assert not (tmp_path / "venvs").exists()


def test_a_pyenv_python_is_found(tmp_path: Path) -> None:
    # The newest patch release of the version under $PYENV_ROOT/versions, by version order.
    for patch in ("3.98.2", "3.98.10"):
        bin_dir = tmp_path / "versions" / patch / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").write_text("#!/bin/sh\nexit 3\n")
        (bin_dir / "python").chmod(0o755)
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "PYENV_ROOT": str(tmp_path),
        "PYTHONS_DIR": str(tmp_path / "venvs"),
    }
    run = subprocess.run(
        ["bash", str(ROOT / "tests/pythons.sh"), "3.98"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    # That "python" fails to make a venv: the version is found, then fails to install.
    assert run.returncode == 1
    assert "3.98.10/bin/python" in run.stdout
    assert "python 3.98: FAILED to install" in run.stdout
    assert not (tmp_path / "venvs" / "3.98").exists()  # removed
