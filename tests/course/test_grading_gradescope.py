"""Gradescope's container is checked at start-up (issue 41, item 9): a container below the
chapter's measured memory/CPU needs gets a results.json that says so and nothing graded,
instead of a run killed over memory ("Killed", a zero)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ddp_lab.course.build import ROOT
from ddp_lab.course.grading import export, gradescope

RELEASE = ROOT / "exercises" / "en" / "05_ring_allreduce.ipynb"
GiB = 2**30


def fake(tmp: Path, v2: bool, memory: str, cpu: str, total_gib: int = 64) -> tuple[Path, Path]:
    """A cgroup folder and a /proc/meminfo as a container sees them."""
    cg = tmp / "cgroup"
    if v2:
        cg.mkdir(parents=True)
        (cg / "memory.max").write_text(memory + "\n")
        (cg / "cpu.max").write_text(cpu + "\n")
    else:
        (cg / "memory").mkdir(parents=True)
        (cg / "cpu").mkdir()
        (cg / "memory" / "memory.limit_in_bytes").write_text(memory + "\n")
        quota, period = cpu.split()
        (cg / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
        (cg / "cpu" / "cpu.cfs_period_us").write_text(period + "\n")
    info = tmp / "meminfo"
    info.write_text(f"MemTotal:       {total_gib * 2**20} kB\nMemFree: 1 kB\n")
    return cg, info


@pytest.mark.parametrize("v2", [True, False], ids=["cgroup-v2", "cgroup-v1"])
def test_limits_are_read_as_the_container_sees_them(tmp_path: Path, v2: bool) -> None:
    # Gradescope's default: 768 MB and half a vCPU.
    cg, info = fake(tmp_path, v2, str(768 * 10**6), "50000 100000")
    memory, cpus = gradescope.container_limits(cg, info)
    assert memory == 768 * 10**6 and cpus == 0.5
    # No limit written: the machine's memory, the CPUs this process may use.
    cg, info = fake(tmp_path / "b", v2, "max" if v2 else str(2**63 - 4096), "max 100000"
                    if v2 else "-1 100000", total_gib=3)  # fmt: skip
    memory, cpus = gradescope.container_limits(cg, info)
    assert memory == 3 * GiB and cpus >= 1


def test_a_small_container_writes_a_clear_results_json_and_grades_nothing(tmp_path: Path) -> None:
    need_mib, need_cpus = gradescope.need_for(RELEASE.name)
    small = fake(tmp_path / "small", True, str(768 * 10**6), "50000 100000")
    results = tmp_path / "results" / "results.json"
    args = ["--need-memory-mib", str(need_mib), "--need-cpus", str(need_cpus)]
    args += ["--results", str(results), "--cgroup", str(small[0]), "--meminfo", str(small[1])]
    assert gradescope.main(args) == 1
    doc = json.loads(results.read_text(encoding="utf-8"))
    assert export.validate_gradescope(doc) == []
    assert "score" not in doc and doc["tests"] == []  # not a zero
    assert "732 MiB of memory" in doc["output"] and f"needs {need_mib} MiB" in doc["output"]
    assert "0.5 CPUs" in doc["output"] and "regrade" in doc["output"]
    # zh, and a container big enough: nothing written, exit 0.
    assert gradescope.main([*args[:-4], "--lang", "zh", "--results", str(results),
                            "--cgroup", str(small[0]), "--meminfo", str(small[1])]) == 1  # fmt: skip
    assert "评分容器只有 732 MiB 内存" in json.loads(results.read_text(encoding="utf-8"))["output"]
    results.unlink()
    cpus = min(need_cpus, len(os.sched_getaffinity(0)))  # what this machine can give
    big = fake(tmp_path / "big", True, str(need_mib * 2**20), f"{int(cpus * 1e5)} 100000")
    args = ["--need-memory-mib", str(need_mib), "--need-cpus", str(cpus), "--results"]
    args += [str(results), "--cgroup", str(big[0]), "--meminfo", str(big[1])]
    assert gradescope.main(args) == 0 and not results.exists()


def test_run_autograder_checks_the_container_before_grading(tmp_path: Path) -> None:
    z = zipfile.ZipFile(export.write_gradescope_zip(RELEASE, tmp_path / "ag.zip", "s", ROOT))
    run = z.read("run_autograder").decode()
    need_mib, need_cpus = gradescope.need_for(RELEASE.name)
    check = run.index("-m ddp_lab.course.grading.gradescope")
    assert check < run.index("ddp-lab grade")
    assert f"--need-memory-mib {need_mib}" in run and f"--need-cpus {need_cpus}" in run
    assert "ddp-lab/ddp_lab/course/grading/gradescope.py" in z.namelist()
    subprocess.run(["bash", "-n"], input=run.encode(), check=True)  # it parses


def test_the_zips_package_speaks_chinese(tmp_path: Path) -> None:
    # The zip once held the package's .py files only: without the compiled zh catalog,
    # every Chinese message raised FileNotFoundError in the autograder image (a zh release's
    # container check, a zh learner's feedback), and Gradescope showed a failed autograder.
    z = zipfile.ZipFile(export.write_gradescope_zip(RELEASE, tmp_path / "ag.zip", "s", ROOT))
    z.extractall(tmp_path / "source")
    package = tmp_path / "source" / "ddp-lab"
    assert "ddp-lab/ddp_lab/locale/zh/LC_MESSAGES/ddp_lab.mo" in z.namelist()
    assert not any("__pycache__" in n for n in z.namelist())
    need_mib, need_cpus = gradescope.need_for(RELEASE.name)
    small = fake(tmp_path / "small", True, str(768 * 10**6), "50000 100000")
    results = tmp_path / "results.json"
    args = ["--need-memory-mib", str(need_mib), "--need-cpus", str(need_cpus), "--lang", "zh"]
    args += ["--results", str(results), "--cgroup", str(small[0]), "--meminfo", str(small[1])]
    # The extracted package, not this checkout's (the cwd comes first on the import path).
    run = "import sys, ddp_lab; print(ddp_lab.__file__); from ddp_lab.course.grading import "
    run += "gradescope; sys.exit(gradescope.main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", run, *args], cwd=package, capture_output=True, text=True
    )
    assert done.stdout.startswith(str(package)), done.stdout + done.stderr
    assert done.returncode == 1, done.stderr
    assert "评分容器只有 732 MiB 内存" in json.loads(results.read_text(encoding="utf-8"))["output"]
