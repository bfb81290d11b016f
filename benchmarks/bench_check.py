"""How long ``ddp-lab check`` takes on a fresh learner copy of an exercise: every cell (as
``ddp-lab grade`` runs it, ``--all-cells``) vs only the cells the graded cells need (the
default, ``course.grading.needed``), alternately, ``--rounds`` times each, pinned to 2 cores.

The copy is what ``ddp-lab exercise NN`` gives a learner (the released exercise, stubs
unsolved) in a folder named after its language; ``--solved`` puts the solution's code in
it instead (graded cells untouched). Prints each mode's median wall time and their ratio.
Goal: the default under 10 s on 2 cores.

Each run also reports the CPU seconds that all its processes used (sandboxes and ranks
included: the run lives in a cgroup of its own where cgroups work, ``course.isolation``) and
the load average when it ended. On a shared machine the wall time grows with the load; the CPU
time does not, and on 2 idle cores a run cannot take less than CPU/2 seconds of wall time.
``--modes needed`` runs the default mode alone; ``--before PYTHON`` also runs each mode with
another checkout's interpreter (e.g. ``../main/.venv/bin/python``), alternating, side by side.
``--weight W`` gives each run's cgroup that CPU weight (cgroup v2 ``cpu.weight``, v1
``cpu.shares`` = 10.24 W; default 100, a plain process's): on a machine others keep busy, a
large weight (10000) lets the run take the 2 cores nearly as if they were idle, so that its
wall time shows its own critical path instead of the others' load (it slows them meanwhile).

    .venv/bin/python benchmarks/bench_check.py [--chapter 05] [--lang en] [--rounds 5] [--solved]
        [--modes all,needed] [--before PYTHON] [--weight 100]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def learner_copy(chapter: str, lang: str, solved: bool, folder: Path) -> Path:
    """A learner's copy of the exercise notebook of ``chapter`` in ``folder/lang``."""
    (src,) = (ROOT / "exercises" / lang).glob(f"{chapter}_*.ipynb")
    nb = nbformat.read(src, as_version=4)
    if solved:
        sol = nbformat.read(ROOT / "solutions" / lang / src.name, as_version=4)
        for mine, theirs in zip(nb.cells, sol.cells, strict=True):
            if mine.cell_type == "code" and "grade" not in mine.metadata.get("tags", []):
                mine.source = theirs.source
    (folder / lang).mkdir(parents=True, exist_ok=True)
    path = folder / lang / src.name
    nbformat.write(nb, path)
    return path


def one(
    path: Path, all_cells: bool, python: str = sys.executable, weight: int = 100
) -> tuple[float, float | None, int, str]:
    """(wall s, CPU s of every process of the run or None without cgroups, exit code, the
    verdict's last line)."""
    from ddp_lab.course.grading import isolation

    cmd = [python, "-m", "ddp_lab.course.cli", "check", str(path)]
    if all_cells:
        cmd.append("--all-cells")
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0,1", *cmd]
    group = None
    if isolation.unavailable_reason() is None:
        group = isolation.Cgroup(
            f"bench-check-{os.getpid()}-{time.monotonic_ns()}",
            isolation.CgroupLimits(cpu_weight=weight),
        )
    with group or contextlib.nullcontext():
        if group is not None:
            cmd = group.enter_argv(cmd)
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=path.parent, check=False)
        wall = time.perf_counter() - start
        cpu = group.cpu_seconds() if group is not None else None
    return wall, cpu, done.returncode, done.stdout.strip().splitlines()[-2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--chapter", default="05")
    p.add_argument("--lang", default="en")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--solved", action="store_true")
    p.add_argument("--modes", default="all,needed", help="all,needed (default) or needed")
    p.add_argument("--before", help="another checkout's python, run alternately as 'before'")
    p.add_argument("--weight", type=int, default=100, help="the runs' cgroup CPU weight")
    args = p.parse_args()
    runs = {f"{m} cells": (sys.executable, m == "all") for m in args.modes.split(",")}
    if args.before:
        runs = {
            f"{when} {mode}": (py, all_cells)
            for mode, (_, all_cells) in runs.items()
            for when, py in (("before", args.before), ("after", sys.executable))
        }
    modes = list(runs)
    folder = Path(tempfile.mkdtemp(prefix="bench-check-"))
    try:
        path = learner_copy(args.chapter, args.lang, args.solved, folder)
        times: dict[str, list[float]] = {m: [] for m in modes}
        cpus: dict[str, list[float]] = {m: [] for m in modes}
        loads = []
        for r in range(args.rounds):
            for mode in times:
                wall, cpu, rc, last = one(path, runs[mode][1], runs[mode][0], args.weight)
                times[mode].append(wall)
                if cpu is not None:
                    cpus[mode].append(cpu)
                loads.append(os.getloadavg()[0])
                used = f"cpu {cpu:5.1f} s" if cpu is not None else "cpu ?"
                print(
                    f"round {r + 1} {mode:19s} {wall:6.1f} s  {used}  load {loads[-1]:4.1f}"
                    f"  rc={rc}  {last}",
                    flush=True,
                )
        print(
            f"load average {min(loads):.1f}-{max(loads):.1f} (median "
            f"{statistics.median(loads):.1f}), cores {os.cpu_count()}, CPU weight {args.weight}"
        )
        med = {m: statistics.median(t) for m, t in times.items()}
        for mode, m in med.items():
            cpu_med = f", cpu {statistics.median(cpus[mode]):.1f} s" if cpus[mode] else ""
            print(f"median {mode:19s} {m:6.1f} s{cpu_med}  (of {args.rounds})")
        if set(med) == {"all cells", "needed cells"}:
            print(f"ratio all/needed {med['all cells'] / med['needed cells']:.1f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
