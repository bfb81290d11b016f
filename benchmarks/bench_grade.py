"""Time ``ddp-lab grade`` on a class of chapter 00 submissions: sandboxed vs not, one run.

    python benchmarks/bench_grade.py [--n 30] [--jobs 2] [--repeat 1] [--old CHECKOUT]

Writes N submissions (half correct, half the usual mistake), grades them with the sandbox
and with ``DDP_LAB_SANDBOX=0``, alternating the two ``--repeat`` times, and prints the total
wall time of each grading and the median time per submission (Gradescope's
``execution_time`` of each results/NAME.json), with the ratio sandboxed / unsandboxed.
``--old`` also times another checkout's ``ddp-lab grade`` (e.g. the nbval grader before
verdicts left the kernel) on the same submissions.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "exercises" / "en" / "00_quickstart.ipynb"
SOLUTION = (
    "def average_across_ranks(value):\n"
    "    out = value.clone()\n    dist.all_reduce(out)\n    return out / dist.get_world_size()\n"
)
WRONG = "def average_across_ranks(value):\n    dist.all_reduce(value)\n    return value\n"


def submissions(folder: Path, n: int) -> None:
    release = nbformat.read(RELEASE, as_version=4)
    stub = next(i for i, c in enumerate(release.cells) if "def average_across_ranks" in c.source)
    for k in range(n):
        nb = copy.deepcopy(release)
        nb.cells[stub].source = SOLUTION if k % 2 == 0 else WRONG
        nbformat.write(nb, folder / f"student{k:02d}.ipynb")


def grade(subs: Path, out: Path, jobs: int, env: dict, root: Path = ROOT) -> float:
    cmd = [sys.executable, "-m", "ddp_lab.course.cli", "grade", "--release", str(RELEASE)]
    if not (root / "ddp_lab" / "course").is_dir():  # an old checkout: the flat layout
        cmd[2] = "ddp_lab.cli"
    cmd += [str(subs), "--out", str(out), "--jobs", str(jobs)]
    env = {**os.environ, "PYTHONPATH": str(root), **env}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=root)
    return time.perf_counter() - t0


def per_submission(out: Path) -> list[float]:
    return [json.loads(p.read_text())["execution_time"] for p in (out / "results").glob("*.json")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--old", type=Path, default=None, help="another checkout to time as well")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "subs"
        subs.mkdir()
        submissions(subs, args.n)
        totals: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": []}
        each: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": []}
        if args.old:
            totals["old"] = []
        for r in range(args.repeat):
            for mode, env in (("unsandboxed", {"DDP_LAB_SANDBOX": "0"}), ("sandboxed", {})):
                out = Path(tmp) / f"{mode}{r}"
                totals[mode].append(grade(subs, out, args.jobs, env))
                each[mode] += per_submission(out)
            if args.old:
                totals["old"].append(grade(subs, Path(tmp) / f"old{r}", args.jobs, {}, args.old))
        print(f"{args.n} submissions of chapter 00, --jobs {args.jobs}, {os.cpu_count()} cores")
        for mode, ts in totals.items():
            line = f"{mode:12s} total {statistics.median(ts):7.1f} s"
            if each.get(mode):
                line += f"   median per submission {statistics.median(each[mode]):5.1f} s"
            print(line)
        ratio = statistics.median(totals["sandboxed"]) / statistics.median(totals["unsandboxed"])
        print(f"sandboxed / unsandboxed (total): {ratio:.2f}x")
        if args.old:
            old = statistics.median(totals["old"])
            print(
                f"sandboxed / old grader (total): {statistics.median(totals['sandboxed']) / old:.2f}x"
            )


if __name__ == "__main__":
    main()
