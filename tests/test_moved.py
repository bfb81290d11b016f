"""Old import paths of modules that moved (runtime, course, cluster, i18n) still work."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import ddp_lab as dl
from ddp_lab import _moved


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_path_is_the_module_at_its_new_place(old):
    new = importlib.import_module(_moved.MOVED[old])
    assert importlib.import_module(old) is new
    assert new.__name__ == new.__spec__.name == _moved.MOVED[old]  # not renamed by the alias
    assert getattr(dl, old.rsplit(".", 1)[1]) is new


def test_the_imports_learners_wrote_before_the_move():
    from ddp_lab.checks import ch06
    from ddp_lab.grading import grade
    from ddp_lab.launcher import spawn
    from ddp_lab.persistent import start

    assert (spawn, start, grade) == (dl.spawn, dl.start, dl.grade)
    assert ch06 is importlib.import_module("ddp_lab.course.checks.ch06")


def test_a_fresh_interpreter_resolves_an_old_path_first():
    # Nothing imported yet but the old name: the finder must be in place from `import ddp_lab`.
    code = "import ddp_lab.magic as m; print(m.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ddp_lab.runtime.magic"


def test_names_that_never_existed_still_fail():
    with pytest.raises(AttributeError):
        dl.no_such_module  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ddp_lab.no_such_module")
    assert _moved.new_name("ddp_lab.launcherx") is None


def test_python_dash_m_runs_an_old_path():
    # The Slurm jobs stored in slurm_run.json ran ``python -m ddp_lab.slurm where``.
    code = "-m ddp_lab.slurm"
    out = subprocess.run([sys.executable, *code.split()], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
