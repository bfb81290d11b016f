"""Calibration of 05.ring's observed way: the bytes each rank sends each other, per pattern.

Runs several all-reduce patterns as graded submissions of 05.ring (``probe_ring`` in the
grader's per-rank sandboxes, ``course.rankhost.RankPool``) and prints, per world size and
tensor size, the payload bytes the grader counted from each rank to each other rank
(``course.traffic``: one call, on the connections of the group the ranks were given), the
TCPStore's bytes and the bytes outside the group's connections or that no socket explains. The patterns:
the released solution (an honest ring), then ``tests/_ring_ways.py``: a gather to rank 0 and a
broadcast, an all_gather and a local sum, a ring that passes the whole buffer, and gloo's own
all_reduce (through the process group's own methods, so that the probe's guards do not stop
them). ``ch05.judge_traffic``'s bounds are derived from these numbers (see its comment and
docs/INSTRUCTORS.md).
Needs bubblewrap, ss and nsenter (root or user namespaces).

    .venv/bin/python benchmarks/bench_ring_traffic.py [--sizes 1,1000,100000] [--ranks 3,4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cloudpickle
import torch

from ddp_lab.course.grading import CaseFailed, sandbox, traffic
from ddp_lab.course.grading.checks.ch05 import judge_traffic, probe_ring
from ddp_lab.course.grading.learner import probe_name
from ddp_lab.course.grading.rankhost import RankPool

ROOT = Path(__file__).resolve().parent.parent


def patterns() -> list:
    """The released solution of 05.ring (an honest ring), then the wrong ways of
    ``tests/_ring_ways.py``; all sent to the ranks by value, as a notebook's code is."""
    sys.path.insert(0, str(ROOT / "tests"))
    import _ring_ways
    from _solutions import graded_solution

    cloudpickle.register_pickle_by_value(_ring_ways)
    return [graded_solution("05.ring")[0], *_ring_ways.WRONG_WAYS]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1,1000,100000")
    p.add_argument("--ranks", default="3,4")
    args = p.parse_args()
    if not sandbox.available() or traffic.tools() is None:
        sys.exit("needs bubblewrap, ss and nsenter")
    for fn in patterns():
        pool = RankPool(cloudpickle.dumps((fn,)), "en", 0)
        try:
            for n in map(int, args.ranks.split(",")):
                for numel in map(int, args.sizes.split(",")):
                    inputs = [[torch.full((numel,), float(r + 1))] for r in range(n)]
                    pool.run(probe_name(probe_ring), inputs, 60)
                    (seen,) = pool.traffic  # one call: one count, on the group's connections
                    pairs = " ".join(f"{a}>{b}:{seen.sent(a, b)}" for a, b in sorted(seen.pairs))
                    try:
                        judge_traffic(seen, inputs[0], n, "-", store_bytes=0)
                        verdict = "ring"
                    except CaseFailed:
                        verdict = "NOT a ring"
                    unseen = seen.hidden + seen.unattributed + seen.outside
                    print(
                        f"{fn.__name__:17} N={n} numel={numel:<7} {pairs} store={seen.store} "
                        f"unseen={unseen} -> {verdict}",
                        flush=True,
                    )
        finally:
            pool.close()


if __name__ == "__main__":
    main()
