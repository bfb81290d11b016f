"""Peak memory, CPU and wall time of grading each chapter's reference solution: the
settings a Gradescope container needs (docs/INSTRUCTORS.md, "Gradescope's settings").

    python benchmarks/bench_grade_limits.py [--chapters 00 05 ...] [--lang en]

Each chapter's solution notebook is graded by ``ddp-lab grade`` (one submission, ``--jobs
1``, ``DDP_LAB_CGROUPS=0`` so every process stays in the measuring cgroup) inside a cgroup
v1 memory+cpuacct group of its own: ``memory.max_usage_in_bytes`` (the whole tree's peak,
page cache included, as a container's limit counts it), the peak of ``total_rss +
total_shmem`` from ``memory.stat`` sampled every 0.1 s (what cannot be reclaimed: a
container below it is killed) and ``cpuacct.usage`` (CPU seconds of the tree). Needs root and cgroup v1 (the course's machines); prints one row per chapter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CG = Path("/sys/fs/cgroup")


def measure(chapter: str, lang: str, tmp: Path) -> dict:
    solution = next((ROOT / "solutions" / lang).glob(f"{chapter}_*.ipynb"))
    release = ROOT / "exercises" / lang / solution.name
    subs = tmp / f"subs{chapter}"
    subs.mkdir()
    shutil.copy(solution, subs / "ref.ipynb")
    name = f"ddp-lab-limits-{uuid.uuid4().hex[:8]}"
    groups = [CG / "memory" / name, CG / "cpuacct" / name]
    for g in groups:
        g.mkdir()
    cmd = [sys.executable, "-m", "ddp_lab.course.cli", "grade", "--release", str(release)]
    cmd += [str(subs), "--out", str(tmp / f"out{chapter}"), "--jobs", "1"]

    def enter() -> None:
        for g in groups:
            (g / "cgroup.procs").write_text(str(os.getpid()))

    env = {**os.environ, "DDP_LAB_CGROUPS": "0"}
    held = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            stat = dict(
                line.split() for line in (groups[0] / "memory.stat").read_text().splitlines()
            )
            held[0] = max(held[0], int(stat["total_rss"]) + int(stat["total_shmem"]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, preexec_fn=enter, stdout=subprocess.DEVNULL, check=True)
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        peak = int((groups[0] / "memory.max_usage_in_bytes").read_text())
        cpu = int((groups[1] / "cpuacct.usage").read_text()) / 1e9
    finally:
        done.set()
        for g in groups:
            for _ in range(50):
                try:
                    g.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
    book = (tmp / f"out{chapter}" / "totals.csv").read_text(encoding="utf-8").splitlines()
    return {
        "chapter": chapter,
        "peak_mib": round(peak / 2**20),
        "rss_shmem_mib": round(held[0] / 2**20),
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
        "totals": book[1] if len(book) > 1 else "",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chapters", nargs="+", default=[f"{i:02d}" for i in range(13)])
    p.add_argument("--lang", default="en")
    args = p.parse_args()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for chapter in args.chapters:
            row = measure(chapter, args.lang, Path(tmp))
            row["load"] = round(os.getloadavg()[0], 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
