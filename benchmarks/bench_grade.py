"""Time ``ddp-lab grade`` on a class of chapter 00 and 05 submissions: this tree vs another.

    python benchmarks/bench_grade.py [--n 30] [--jobs 2] [--repeat 1] [--chapters 00 05]
                                     [--old CHECKOUT | --old-rev REV]

Writes N submissions per chapter (half the solution, half the unsolved exercise), grades
them with this checkout (``after``: sandbox, a cgroup and a user-id slot per submission,
tmpfs folders, intake in a separate process) and, with ``--old``, with another checkout's
``ddp-lab grade`` (``before``, e.g. main), alternating the two ``--repeat`` times on the same
submissions; without ``--old`` the second mode is this tree with ``DDP_LAB_CGROUPS=0``. Prints
per chapter and mode the total wall time and the median time per submission (Gradescope's
``execution_time`` of each results/NAME.json), and the ratios after / before of the medians
(per submission and of the totals), with the load average before and after: the issue's goal
"no slower than 1.1x" is the ratio of the totals. ``--old-rev REV`` grades ``before`` with
this repository at REV (a temporary git worktree, removed at the end; it runs with this
tree's Python environment and ``PYTHONPATH`` at the worktree).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = {"00": "00_quickstart", "05": "05_ring_allreduce"}


def submissions(folder: Path, chapter: str, n: int) -> Path:
    """N submissions of one chapter: even ones solved, odd ones the unsolved exercise."""
    name = next(p.name for p in (ROOT / "exercises" / "en").glob(f"{chapter}_*.ipynb"))
    for k in range(n):
        src = ROOT / ("solutions" if k % 2 == 0 else "exercises") / "en" / name
        (folder / f"student{k:02d}").mkdir(parents=True)
        shutil.copy(src, folder / f"student{k:02d}" / name)
    return ROOT / "exercises" / "en" / name


def grade(release: Path, subs: Path, out: Path, jobs: int, env: dict, root: Path) -> float:
    python = root / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), "-m", "ddp_lab.course.cli"]
    cmd += ["grade", "--release", str(release), str(subs), "--out", str(out), "--jobs", str(jobs)]
    env = {**os.environ, "PYTHONPATH": str(root), **env}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=root)
    return time.perf_counter() - t0


def per_submission(out: Path) -> list[float]:
    return [json.loads(p.read_text())["execution_time"] for p in (out / "results").glob("*.json")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=30, help="submissions per chapter")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--chapters", nargs="+", default=["00", "05"])
    p.add_argument("--old", type=Path, default=None, help="another checkout (before)")
    p.add_argument("--old-rev", default=None, help="this repository at REV (before)")
    args = p.parse_args()
    if args.old_rev:
        with tempfile.TemporaryDirectory() as t:
            old = Path(t) / "before"
            git = ["git", "-C", str(ROOT), "worktree"]
            subprocess.run([*git, "add", "-q", "--detach", str(old), args.old_rev], check=True)
            try:
                args.old = old
                run(args)
            finally:
                subprocess.run([*git, "remove", "--force", str(old)], check=False)
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    modes = {"after": ({}, ROOT)}
    if args.old:
        modes["before"] = ({}, args.old.resolve())
    else:
        modes["no-cgroups"] = ({"DDP_LAB_CGROUPS": "0"}, ROOT)
    base = "before" if args.old else "no-cgroups"
    print(f"--jobs {args.jobs}, {os.cpu_count()} cores, {args.n} submissions per chapter")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for chapter in args.chapters:
            subs = Path(tmp) / f"subs{chapter}"
            release = submissions(subs, chapter, args.n)
            totals: dict[str, list[float]] = {m: [] for m in modes}
            each: dict[str, list[float]] = {m: [] for m in modes}
            for r in range(args.repeat):
                for mode, (env, root) in modes.items() if r % 2 == 0 else reversed(modes.items()):
                    out = Path(tmp) / f"{mode}{chapter}-{r}"
                    totals[mode].append(grade(release, subs, out, args.jobs, env, root))
                    each[mode] += per_submission(out)
            for mode in modes:
                print(
                    f"chapter {chapter} {mode:10s} total {statistics.median(totals[mode]):7.1f} s"
                    f"   median per submission {statistics.median(each[mode]):5.2f} s"
                )
            ratio = statistics.median(each["after"]) / statistics.median(each[base])
            print(f"chapter {chapter} after / {base} (median per submission): {ratio:.2f}x")
            ratio = statistics.median(totals["after"]) / statistics.median(totals[base])
            print(f"chapter {chapter} after / {base} (median total): {ratio:.2f}x")
            print(f"load average now: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
