"""How soon a deadlock is reported (``ddp_lab.runtime._hang.DeadlockWatch``), against the
timeout it saves the learner from waiting for.

The program is the classic mistake of a hand-written ring: every rank receives from its
left neighbour before anyone sends, so all ranks wait forever. It runs two ways, each next to
the same launch without the mistake (every rank sends first with ``isend``, then receives),
so the difference is what noticing the deadlock costs:

- ``dl.spawn``: a fresh launch, as ``%%ddp`` makes (the zygote is warm after the first,
  untimed, launch);
- ``persistent``: a cell of a persistent group (``dl.start``; what ``%%ranks`` runs on), where
  reporting the deadlock includes restarting the group's ranks.

Every launch uses the default timeout (120 s), so the deadlock watch is on. Goal: a deadlock
is reported within 30 s, a quarter of that timeout. The watch needs every rank quiet for
``DDP_LAB_DEADLOCK_S`` (2 s) and then two stack samples that far apart, so about 4 s is its
own share; the rest is the launch (or the restart).

``--busy N`` runs N busy loops alongside, as a loaded machine (CI's two cores under a test
suite) would. "worst" is the slowest report of the repeats: the goal is for every one.

    .venv/bin/python benchmarks/bench_hang.py [--repeats 5] [--nprocs 3] [--busy 4]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.runtime import persistent

GOAL_S = 30.0
TIMEOUT_S = 120.0

RING = {
    # every rank waits for its left neighbour: nobody ever sends
    "deadlock": (
        "t = torch.zeros(1)\n"
        "dist.recv(t, src=(rank - 1) % world_size)\n"
        "dist.send(t, dst=(rank + 1) % world_size)\n"
    ),
    # the same ring done right: send without waiting, then receive
    "working": (
        "t = torch.zeros(1)\n"
        "work = dist.isend(t, dst=(rank + 1) % world_size)\n"
        "dist.recv(t, src=(rank - 1) % world_size)\n"
        "done = work.wait()\n"
    ),
}


def _ring(rank: int, world_size: int, kind: str) -> None:
    dist.init_process_group("gloo")
    exec(RING[kind], {"torch": torch, "dist": dist, "rank": rank, "world_size": world_size})
    dist.destroy_process_group()


def _quiet_seconds(error: Exception) -> float:
    """The "for N s every running rank ... has been waiting" of the deadlock message."""
    found = re.search(r"for (\d+) s", str(error))
    return float(found.group(1)) if found else float("nan")


def _timed(call) -> tuple[float, Exception | None]:
    start = time.monotonic()
    try:
        call()
    except dl.DistributedDeadlockError as error:
        return time.monotonic() - start, error
    return time.monotonic() - start, None


def _spawn(kind: str, nprocs: int) -> tuple[float, Exception | None]:
    return _timed(lambda: dl.spawn(_ring, args=(nprocs, kind), nprocs=nprocs, quiet=True))


def _cell(kind: str) -> tuple[float, Exception | None]:
    return _timed(lambda: persistent.run_cell(RING[kind]))


def _report(name: str, working: list[float], deadlocked: list[float], quiet: list[float]) -> None:
    w, d, worst = statistics.median(working), statistics.median(deadlocked), max(deadlocked)
    print(
        f"{name:>10}: working {w:4.1f} s, deadlock reported after {d:5.1f} s (worst {worst:5.1f} s; "
        f"watch saw {statistics.median(quiet):.0f} s of quiet), {d / TIMEOUT_S:.2f}x the timeout, "
        f"goal {GOAL_S:.0f} s: {'met' if worst <= GOAL_S else 'MISSED'}"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--nprocs", type=int, default=3)
    p.add_argument("--busy", type=int, default=0, help="busy loops to run alongside (load)")
    args = p.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        _measure(args)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def _measure(args: argparse.Namespace) -> None:
    _spawn("working", args.nprocs)  # starts the zygote: not timed
    runs: dict[str, list] = {"working": [], "deadlock": []}
    for _ in range(args.repeats):  # interleaved, so load drifts hit both alike
        for kind in runs:
            took, error = _spawn(kind, args.nprocs)
            assert (error is not None) == (kind == "deadlock"), (kind, error)
            runs[kind].append((took, error))
    _report(
        "dl.spawn",
        [t for t, _ in runs["working"]],
        [t for t, _ in runs["deadlock"]],
        [_quiet_seconds(e) for _, e in runs["deadlock"]],
    )

    dl.start(args.nprocs, backend="gloo")  # the default timeout: the watch is on
    try:
        _cell("working")  # warm: not timed
        runs = {"working": [], "deadlock": []}
        for _ in range(args.repeats):
            for kind in runs:
                took, error = _cell(kind)
                assert (error is not None) == (kind == "deadlock"), (kind, error)
                runs[kind].append((took, error))
    finally:
        dl.stop()
    _report(
        "persistent",
        [t for t, _ in runs["working"]],
        [t for t, _ in runs["deadlock"]],
        [_quiet_seconds(e) for _, e in runs["deadlock"]],
    )


if __name__ == "__main__":
    main()
