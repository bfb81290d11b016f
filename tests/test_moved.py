"""Old import paths of modules that moved (runtime, course, cluster, i18n, labs, tools, grading)
still work."""

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
    parent, _, last = old.rpartition(".")
    assert getattr(importlib.import_module(parent), last) is new  # dl.train, course.grader


def test_the_imports_learners_wrote_before_the_move():
    from ddp_lab.checks import ch06
    from ddp_lab.grading import grade
    from ddp_lab.launcher import spawn
    from ddp_lab.persistent import start

    assert (spawn, start, grade) == (dl.spawn, dl.start, dl.grade)
    assert ch06 is importlib.import_module("ddp_lab.course.grading.checks.ch06")


def test_the_imports_written_before_the_third_pass():
    from ddp_lab.course.checks import ch06

    from ddp_lab import doctor, evaluation, ranks, train, two_hosts
    from ddp_lab.course import grader, intake
    from ddp_lab.course.grading import checker, fail, grade, load_checkers

    assert two_hosts is importlib.import_module("ddp_lab.labs.two_hosts")
    assert evaluation is importlib.import_module("ddp_lab.labs.evaluation")
    assert (doctor, ranks, train) == tuple(
        importlib.import_module(f"ddp_lab.tools.{n}") for n in ("doctor", "ranks", "train")
    )
    assert grader is importlib.import_module("ddp_lab.course.grading.grader")
    assert intake is importlib.import_module("ddp_lab.course.grading.intake")
    assert ch06 is importlib.import_module("ddp_lab.course.grading.checks.ch06")
    checkers = importlib.import_module("ddp_lab.course.grading.checkers")
    assert (checker, fail, grade, load_checkers) == (
        checkers.checker,
        checkers.fail,
        dl.grade,
        checkers.load_checkers,
    )
    assert importlib.import_module("ddp_lab.grading") is checkers


def test_the_stored_runs_moved_with_their_labs():
    from ddp_lab.labs import elastic, preemption, shaped_links, slurm_jobs, two_hosts

    for lab in (elastic, preemption, shaped_links, slurm_jobs, two_hosts):
        assert lab.RECORD.is_file(), lab.RECORD
        assert lab.RECORD.parent.name == "labs"


def test_the_scan_flags_an_answer_module_under_both_names():
    from ddp_lab.course.grading import scan

    for module in ("ddp_lab.labs.evaluation", "ddp_lab.evaluation"):
        assert scan.findings(f"from {module} import gather_by_index")
        assert scan.findings(f"import {module}")
    for module in ("ddp_lab.tools.ranks", "ddp_lab.ranks"):
        assert scan.findings(f"from {module} import assign")


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


@pytest.mark.parametrize("old", ["ddp_lab.train", "ddp_lab.bench_allreduce"])
def test_python_dash_m_runs_a_moved_program_under_its_old_name(old):
    # Learners' notes and stored commands say ``python -m ddp_lab.train``.
    out = subprocess.run([sys.executable, "-m", old, "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
