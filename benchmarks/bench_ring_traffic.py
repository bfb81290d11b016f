"""Calibration of 05.ring's observed way: the bytes each rank sends each other, per pattern.

Runs several all-reduce patterns as graded submissions of 05.ring (``probe_ring`` in the
grader's per-rank sandboxes, ``course.rankhost.RankPool``) and prints, per world size and
tensor size, the payload bytes the grader counted from each rank to each other rank
(``course.traffic``), the TCPStore's bytes and the bytes no socket explains. The patterns:
an honest ring, a gather to rank 0 and a broadcast, an all_gather and a local sum, a ring
that passes the whole buffer, and gloo's own all_reduce (the last four through the process
group's own methods, so that the probe's guards do not stop them). ``ch05.judge_traffic``'s
bounds are derived from these numbers (see its comment and docs/INSTRUCTORS.md).
Needs bubblewrap, ss and nsenter (root or user namespaces).

    .venv/bin/python benchmarks/bench_ring_traffic.py [--sizes 1,1000,100000] [--ranks 3,4]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from ddp_lab.course import sandbox, traffic
from ddp_lab.course.checks.ch05 import judge_traffic, probe_ring
from ddp_lab.course.grading import CaseFailed
from ddp_lab.course.learner import probe_name
from ddp_lab.course.rankhost import RankPool


def _world() -> Any:
    return dist.distributed_c10d._get_default_group()


def honest_ring(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send: torch.Tensor, recv: torch.Tensor) -> None:
        ops = [dist.P2POp(dist.isend, send, right)] if send.numel() else []
        ops += [dist.P2POp(dist.irecv, recv, left)] if recv.numel() else []
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()

    for s in range(n - 1):
        target = chunks[(rank - s - 1) % n]
        incoming = torch.empty_like(target)
        exchange(chunks[(rank - s) % n], incoming)
        target += incoming
    for s in range(n - 1):
        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])
    return tensor


def gather_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(tensor)
        for peer in range(1, n):
            _world().recv([buf], peer, 0).wait()
            tensor += buf
        for peer in range(1, n):
            _world().send([tensor], peer, 0).wait()
    else:
        _world().send([tensor], 0, 0).wait()
        _world().recv([tensor], 0, 0).wait()
    return tensor


def all_gather_sum(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    works = [_world().send([tensor], peer, 0) for peer in range(n) if peer != rank]
    total, buf = tensor.clone(), torch.empty_like(tensor)
    for peer in range(n):
        if peer != rank:
            _world().recv([buf], peer, 0).wait()
            total += buf
    for work in works:
        work.wait()
    tensor.copy_(total)
    return tensor


def full_buffer_ring(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    total, current, buf = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(n - 1):
        work = _world().send([current], (rank + 1) % n, 0)
        _world().recv([buf], (rank - 1) % n, 0).wait()
        work.wait()
        total += buf
        current = buf.clone()
    tensor.copy_(total)
    return tensor


def gloo_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    _world().allreduce([tensor]).wait()
    return tensor


PATTERNS = [honest_ring, gather_broadcast, all_gather_sum, full_buffer_ring, gloo_all_reduce]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1,1000,100000")
    p.add_argument("--ranks", default="3,4")
    args = p.parse_args()
    if not sandbox.available() or traffic.tools() is None:
        sys.exit("needs bubblewrap, ss and nsenter")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
    for fn in PATTERNS:
        pool = RankPool(cloudpickle.dumps((fn,)), "en", 0, "05.ring")
        try:
            for n in map(int, args.ranks.split(",")):
                for numel in map(int, args.sizes.split(",")):
                    inputs = [[torch.full((numel,), float(r + 1))] for r in range(n)]
                    pool.run(probe_name(probe_ring), inputs, 60)
                    seen = pool.traffic
                    pairs = " ".join(f"{a}>{b}:{seen.sent(a, b)}" for a, b in sorted(seen.pairs))
                    try:
                        judge_traffic(seen, inputs[0], n, "-")
                        verdict = "ring"
                    except CaseFailed:
                        verdict = "NOT a ring"
                    print(
                        f"{fn.__name__:17} N={n} numel={numel:<7} {pairs} store={seen.store} "
                        f"unseen={seen.hidden + seen.unattributed} -> {verdict}",
                        flush=True,
                    )
        finally:
            pool.close()


if __name__ == "__main__":
    main()
