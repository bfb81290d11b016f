"""tests/pythons.sh: a Python it cannot find is reported and skipped, nothing installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pythons_sh(version: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "tests/pythons.sh"), version],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_a_python_not_found_is_skipped_and_said(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "PYENV_ROOT": str(tmp_path),
        "PYTHONS_DIR": str(tmp_path / "venvs"),
    }
    run = _pythons_sh("3.99", env)
    assert run.returncode == 0, run.stderr
    assert "python 3.99: SKIPPED, not found" in run.stdout
    assert not (tmp_path / "venvs").exists()


def test_a_pyenv_python_is_found(tmp_path: Path) -> None:
    # A shim on PATH that fails (pyenv's, for a version it does not select) is passed over;
    # under $PYENV_ROOT/versions the newest patch release wins, in version order (10 > 9).
    def python(path: Path, answers: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Says it is the version asked for (or not), then fails to make a venv.
        path.write_text(
            "#!/bin/sh\n"
            + ('case "$2" in *version_info*) exit 0;; esac\n' if answers else "")
            + "exit 3\n"
        )
        path.chmod(0o755)

    python(tmp_path / "shims" / "python3.98", answers=False)
    python(tmp_path / "versions" / "3.98.9" / "bin" / "python", answers=True)
    python(tmp_path / "versions" / "3.98.10" / "bin" / "python", answers=True)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'shims'}:/usr/bin:/bin",
        "PYENV_ROOT": str(tmp_path),
        "PYTHONS_DIR": str(tmp_path / "venvs"),
    }
    run = _pythons_sh("3.98", env)
    assert run.returncode == 1
    assert f"python 3.98: {tmp_path}/versions/3.98.10/bin/python ->" in run.stdout
    assert "python 3.98: FAILED to install" in run.stdout
    assert not (tmp_path / "venvs" / "3.98").exists()  # removed
