"""environment.yml (the conda route) lists the same dependencies as pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# tomllib is new in Python 3.11; the package also runs on 3.10 (tests/pythons.sh).
tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r): r for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        wanted.update({_name(r): r for r in extra})
    text = (ROOT / "environment.yml").read_text()
    pip_section = text.split("- pip:", 1)[1]
    pip_lines = re.findall(r"^\s+- ([A-Za-z0-9_.\-]+[^\n]*)$", pip_section, flags=re.M)
    listed = {_name(r): r.strip() for r in pip_lines if _name(r) not in ("python", "pip")}
    assert set(listed) == set(wanted)
    for name, req in wanted.items():
        if name == "torch":
            assert listed[name] == "torch==2.13.0"  # what setup.sh installs
        else:
            assert listed[name] == req.replace(" ", ""), name


def test_setup_installs_the_same_torch_as_environment_yml():
    assert "torch==2.13.0" in (ROOT / "setup.sh").read_text()
