"""Right sums sent the wrong way: 05.ring submissions that only the grader's count of the bytes
can fail.

Each gets every rank the right sum and shows the checker's guards nothing: it calls the process
group's own methods (``ProcessGroup.send``/``recv``/``allreduce``) with the dispatch modes of
its process switched off (``_unwatched``: the guards' ``watch_c10d`` is one, and it lives in
the learner's process, within reach), so the rank's report says "nothing sent, no batch". Only the bytes the grader counts in
the ranks' network namespace (``course.traffic``) tell them from a ring. Used by
``tests/course/test_grading_attacks_ranks.py`` (each gets 0 points) and
``benchmarks/bench_ring_traffic.py`` (the bytes that set ``ch05.judge_traffic``'s bounds).
Imported as ``from _ring_ways import ...`` (``tests/`` is on sys.path); a grader's rank cannot
import it, so a caller registers it with ``cloudpickle.register_pickle_by_value``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def _world() -> Any:
    return dist.distributed_c10d._get_default_group()


def _unwatched(way: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``way`` with every dispatch mode of this process off while it runs (they come back)."""

    @functools.wraps(way)
    def run(tensor: torch.Tensor) -> torch.Tensor:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return way(tensor)

    return run


@_unwatched
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


@_unwatched
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


@_unwatched
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
    _world().allreduce([tensor]).wait()  # gloo's own ring, which sends to the left
    return tensor


WRONG_WAYS = [gather_broadcast, all_gather_sum, full_buffer_ring, gloo_all_reduce]
