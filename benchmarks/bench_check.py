"""How long ``ddp-lab check`` takes on a fresh learner copy of an exercise: every cell (as
``ddp-lab grade`` runs it, ``--all-cells``) vs only the cells the graded cells need (the
default, ``course.grading.needed``), alternately, ``--rounds`` times each, pinned to 2 cores.

The copy is what ``ddp-lab exercise NN`` gives a learner (the released exercise, stubs
unsolved) in a folder named after its language; ``--solved`` puts the solution's code in
it instead (graded cells untouched). Prints each mode's median wall time and their ratio.
Goal: the default under 10 s on 2 cores.

    .venv/bin/python benchmarks/bench_check.py [--chapter 05] [--lang en] [--rounds 5] [--solved]
"""

from __future__ import annotations

import argparse
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


def one(path: Path, all_cells: bool) -> tuple[float, int, str]:
    cmd = [sys.executable, "-m", "ddp_lab.course.cli", "check", str(path)]
    if all_cells:
        cmd.append("--all-cells")
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0,1", *cmd]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=path.parent, check=False)
    return time.perf_counter() - start, done.returncode, done.stdout.strip().splitlines()[-2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--chapter", default="05")
    p.add_argument("--lang", default="en")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--solved", action="store_true")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-check-"))
    try:
        path = learner_copy(args.chapter, args.lang, args.solved, folder)
        times: dict[str, list[float]] = {"all cells": [], "needed cells": []}
        for r in range(args.rounds):
            for mode in times:
                wall, rc, last = one(path, mode == "all cells")
                times[mode].append(wall)
                print(f"round {r + 1} {mode:12s} {wall:6.1f} s  rc={rc}  {last}", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}, cores {os.cpu_count()}")
        med = {m: statistics.median(t) for m, t in times.items()}
        for mode, m in med.items():
            print(f"median {mode:12s} {m:6.1f} s  (of {args.rounds})")
        print(f"ratio all/needed {med['all cells'] / med['needed cells']:.1f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
