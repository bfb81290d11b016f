"""`ddp-lab classroom` warns while the template repository still holds the solutions."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_lab.course import cli

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "exercises" / "en" / "00_quickstart.ipynb"


@pytest.mark.parametrize("folders", [[], ["chapters"], ["solutions", "chapters"]])
def test_classroom_warns_about_solutions_in_the_template(tmp_path, capsys, folders):
    for name in folders:
        (tmp_path / name).mkdir()
    out = tmp_path / ".github" / "workflows" / "classroom.yml"
    args = ["classroom", "--target", "github-classroom", "--release", str(RELEASE)]
    assert cli.main([*args, "--out", str(out)]) == 0
    assert out.is_file()
    err = capsys.readouterr().err
    assert "being retired" in err and "classroom50" in err  # the old product says so
    if folders:
        assert "warning" in err and all(name in err for name in folders)
    else:
        assert "warning" not in err
