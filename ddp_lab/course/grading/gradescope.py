"""Gradescope: the autograder checks its container's memory and CPUs before it grades.

Gradescope's defaults (768 MB, half a vCPU, 10 minutes) are too small for exercises that
start 2-4 torch ranks: a run over memory shows as "Killed" and a zero. ``run_autograder``
(``export.write_gradescope_zip``) first runs ``python -m ddp_lab.course.grading.gradescope``:
when the container has less memory or fewer CPUs than the chapter needs (``NEEDS``, measured
with ``benchmarks/bench_grade_limits.py``; docs/INSTRUCTORS.md), it writes a results.json
that says so, with no score and no tests, and nothing is graded.

The limits are read as a container sees them: cgroup v2 ``memory.max``/``cpu.max``, else
cgroup v1 ``memory.limit_in_bytes``/``cpu.cfs_quota_us``, bounded by ``/proc/meminfo``'s
MemTotal and the CPUs this process may run on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ddp_lab.i18n import _t

# chapter -> peak memory (MiB, rss + shmem of every process) of grading its solution:
# benchmarks/bench_grade_limits.py, 2026-11-28, torch 2.13.0 CPU, 2 cores at load 13-18.
MEASURED_MIB: dict[str, int] = {
    "00": 1243, "01": 550, "02": 973, "03": 671, "04": 1565, "05": 1399, "06": 1536,
    "07": 1739, "08": 1170, "09": 1522, "10": 1807, "11": 1487, "12": 913,
}  # fmt: skip
CPUS = 2.0  # the exercises start 2-4 ranks at once; on half a CPU their hang limits misfire
DEFAULT_NEED = (3072, CPUS)


def _need(mib: int) -> int:
    """A quarter more than measured, rounded up to 256 MiB."""
    return -(-int(mib * 1.25) // 256) * 256


NEEDS: dict[str, tuple[int, float]] = {ch: (_need(m), CPUS) for ch, m in MEASURED_MIB.items()}


def need_for(release_name: str) -> tuple[int, float]:
    """(MiB, CPUs) the chapter of ``release_name`` ("05_ring_allreduce.ipynb") needs."""
    return NEEDS.get(release_name[:2], DEFAULT_NEED)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def container_limits(
    cgroup: Path = Path("/sys/fs/cgroup"), meminfo: Path = Path("/proc/meminfo")
) -> tuple[int | None, float]:
    """(bytes of memory, CPUs) this container may use; memory None if nothing says."""
    memory: int | None = None
    text = _read(cgroup / "memory.max") or _read(cgroup / "memory" / "memory.limit_in_bytes")
    if text and text != "max" and text.isdigit() and int(text) < 2**60:
        memory = int(text)
    for line in (_read(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
            memory = total if memory is None else min(memory, total)
    cpus = float(len(os.sched_getaffinity(0)))
    quota = _read(cgroup / "cpu.max")
    if quota:
        q, _, period = quota.partition(" ")
        if q != "max" and period:
            cpus = min(cpus, int(q) / int(period))
    else:
        q1 = _read(cgroup / "cpu" / "cpu.cfs_quota_us")
        p1 = _read(cgroup / "cpu" / "cpu.cfs_period_us")
        if q1 and p1 and int(q1) > 0:
            cpus = min(cpus, int(q1) / int(p1))
    return memory, cpus


def problems(memory: int | None, cpus: float, need_mib: int, need_cpus: float, lang: str) -> list:
    """What the container lacks, one sentence each in ``lang`` ([] if nothing)."""
    out = []
    if memory is not None and memory < need_mib * 2**20:
        out.append(
            _t(
                "The autograder container has {have} MiB of memory; this assignment needs "
                "{need} MiB (the exercises start several torch processes).",
                lang,
                have=memory // 2**20,
                need=need_mib,
            )
        )
    if cpus + 1e-9 < need_cpus:
        out.append(
            _t(
                "The autograder container has {have:g} CPUs; this assignment needs {need:g}.",
                lang,
                have=round(cpus, 2),
                need=need_cpus,
            )
        )
    return out


def results_doc(found: list[str], lang: str) -> dict:
    """Gradescope's results.json for a container too small: the reason, no score."""
    text = (
        " ".join(found)
        + " "
        + _t(
            "Nothing was graded (not a zero for your work). Instructors: raise the memory and "
            "CPUs in the assignment's autograder settings (docs/INSTRUCTORS.md, Gradescope), "
            "then regrade all submissions.",
            lang,
        )
    )
    return {
        "output": text,
        "output_format": "md",
        "stdout_visibility": "visible",
        "tests": [],
        "extra_data": {"not_graded": "container too small"},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--need-memory-mib", type=int, required=True)
    p.add_argument("--need-cpus", type=float, required=True)
    p.add_argument("--results", required=True, help="where results.json goes")
    p.add_argument("--lang", default="en")
    p.add_argument("--cgroup", default="/sys/fs/cgroup", help=argparse.SUPPRESS)
    p.add_argument("--meminfo", default="/proc/meminfo", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    memory, cpus = container_limits(Path(args.cgroup), Path(args.meminfo))
    found = problems(memory, cpus, args.need_memory_mib, args.need_cpus, args.lang)
    if not found:
        return 0
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results_doc(found, args.lang), ensure_ascii=False), "utf-8")
    print("\n".join(found), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
