"""Right sums sent the wrong way: 05.ring submissions that only the grader's count of the bytes
can fail.

Each gets every rank the right sum and shows the checker's guards a clean record: every send
and receive in a batch_isend_irecv whose partners pair up, as a ring's do (and
``gloo_all_reduce``, the process group's own all-reduce, which the ranks' lockdown refuses).
Only the bytes the grader counts in the ranks' network namespace (``course.traffic``) tell
them from a ring. Used by
``tests/course/test_grading_attacks_ranks.py`` (each gets 0 points) and
``benchmarks/bench_ring_traffic.py`` (the bytes that set ``ch05.judge_traffic``'s bounds).
Imported as ``from _ring_ways import ...`` (``tests/`` is on sys.path); a grader's rank cannot
import it, so a caller registers it with ``cloudpickle.register_pickle_by_value``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _world() -> Any:
    return dist.distributed_c10d._get_default_group()


def _batch(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]) -> None:
    """One batch_isend_irecv of these sends and receives, waited for: the rank's record shows
    batches that pair up, as a ring's do."""
    ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def gather_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        bufs = [torch.empty_like(tensor) for _ in range(1, n)]
        _batch([], [(buf, peer) for peer, buf in enumerate(bufs, start=1)])
        for buf in bufs:
            tensor += buf
        _batch([(tensor, peer) for peer in range(1, n)], [])
    else:
        _batch([(tensor, 0)], [])
        _batch([], [(tensor, 0)])
    return tensor


def all_gather_sum(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    peers = [peer for peer in range(n) if peer != rank]
    bufs = [torch.empty_like(tensor) for _ in peers]
    _batch([(tensor, peer) for peer in peers], list(zip(bufs, peers, strict=True)))
    tensor += sum(bufs)
    return tensor


def full_buffer_ring(tensor: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    total, current, buf = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(n - 1):
        _batch([(current, (rank + 1) % n)], [(buf, (rank - 1) % n)])
        total += buf
        current = buf.clone()
    tensor.copy_(total)
    return tensor


def gloo_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    _world().allreduce([tensor]).wait()  # gloo's own ring, which sends to the left
    return tensor


WRONG_WAYS = [gather_broadcast, all_gather_sum, full_buffer_ring, gloo_all_reduce]
