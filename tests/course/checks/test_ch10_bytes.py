"""10.fsdp_reduce's bytes, counted by the grader from outside the ranks (``ch10_fsdp_bytes``).

The judging function on byte counts measured in the grading sandboxes (the calibration in
``ch10_fsdp_bytes`` and docs/INSTRUCTORS.md), then the verdict's own path end to end: the
reference passes; an all-reduce and an all-gather by point-to-point messages, each run on a
thread of its own (which the rank's in-thread watch does not see), get nothing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from _solutions import graded_solution

from ddp_lab.course.grading import CaseFailed, load_checkers, run_checker, sandbox, traffic
from ddp_lab.course.grading.checks.ch10_fsdp_bytes import judge_bytes, received_most
from ddp_lab.course.grading.learner import RemoteLearner
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.runtime import _pickle

GRAD = [torch.zeros(60000, dtype=torch.float64)]  # as in the calibration: 480000 bytes


def _each(n: int, value: int, shape: str = "ring") -> traffic.Traffic:
    """What every rank received in one call: ``value`` bytes, from its left neighbour (a
    ring) or split evenly over every other rank (``shape="all"``)."""
    if shape == "ring":
        pairs = {((r - 1) % n, r): value for r in range(n)}
    else:
        pairs = {(a, b): value // (n - 1) for a in range(n) for b in range(n) if a != b}
    return traffic.Traffic(pairs=pairs)


# Measured, N = 3, 60000 float64 (a shard: 160000 bytes; a reduce-scatter receives 320000):
# per rank received
MEASURED_RIGHT = {
    "reduce_scatter_single (gloo: an all-reduce)": _each(3, 641152),
    "reduce_scatter list form": _each(3, 643488),
    "isend/irecv, a shard to each rank": _each(3, 320288, "all"),
    "a ring reduce-scatter": _each(3, 320288),
}
MEASURED_WRONG = {
    "all-gather by batch_p2p_ops": _each(3, 960288, "all"),
    "gather to each root in turn": _each(3, 960288, "all"),
    "all_to_all_single of whole gradients": _each(3, 960288, "all"),
}


@pytest.mark.parametrize("name", sorted(MEASURED_RIGHT))
def test_measured_reduce_scatters_are_within_the_bound(name: str) -> None:
    judge_bytes([MEASURED_RIGHT[name]], GRAD, 3, "case")


@pytest.mark.parametrize("name", sorted(MEASURED_WRONG))
def test_measured_whole_gradients_fail(name: str) -> None:
    with pytest.raises(CaseFailed, match="the grader saw rank 0 receive 960288 bytes"):
        judge_bytes([MEASURED_WRONG[name]], GRAD, 3, "case")


def test_the_bound_sits_between_gloos_reduce_scatter_and_an_all_gather() -> None:
    most = received_most(60000, 8, 3)
    assert 641152 * 1.2 < most < 960288 / 1.15
    # one rank that received too much is enough, in any call
    calls = [_each(3, 320288, "all"), _each(3, 320288, "all")]
    calls[1].pairs[(0, 2)] = most + 1
    with pytest.raises(CaseFailed, match="rank 2 receive"):
        judge_bytes(calls, GRAD * 2, 3, "case")


def test_bytes_around_the_group_count_against_every_rank() -> None:
    """Whole gradients sent on sockets of the learner's own (``outside``), over UDP or through
    the store count as received by every rank."""
    for field in ("outside", "hidden", "unattributed", "store"):
        seen = _each(3, 320288)
        setattr(seen, field, 640000)
        with pytest.raises(CaseFailed, match="the grader saw rank 0 receive"):
            judge_bytes([seen], GRAD, 3, "case")
    seen = _each(3, 320288)
    seen.hidden = 96  # a few stray bytes: not a way around the count
    judge_bytes([seen], GRAD, 3, "case")


# --- end to end, the grader's way -------------------------------------------------------------


def thread_all_reduce(flat_grad: torch.Tensor) -> torch.Tensor:
    """An all-reduce of the whole gradient on a thread of its own: the rank's watch (a
    dispatch mode, thread-local) does not see it; on the wire it is what gloo's
    reduce-scatter sends, so the rank's lock refuses it (in every thread)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    whole = flat_grad / world
    t = threading.Thread(target=dist.all_reduce, args=(whole,))
    t.start()
    t.join()
    n = flat_grad.numel() // world
    return whole[rank * n : (rank + 1) * n].clone()


def thread_all_gather(flat_grad: torch.Tensor) -> torch.Tensor:
    """Every rank's whole gradient to every rank by point-to-point messages (which the lock
    allows) on a thread of its own (which the rank's watch does not see), then a local sum."""
    world, rank = dist.get_world_size(), dist.get_rank()
    peers = [p for p in range(world) if p != rank]
    bufs = [torch.empty_like(flat_grad) for _ in peers]
    ops = []
    for p, b in zip(peers, bufs, strict=True):
        ops += [dist.P2POp(dist.isend, flat_grad, p), dist.P2POp(dist.irecv, b, p)]

    def exchange() -> None:
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    t = threading.Thread(target=exchange)
    t.start()
    t.join()
    total = flat_grad + sum(bufs)
    n = flat_grad.numel() // world
    return (total[rank * n : (rank + 1) * n] / world).clone()


def unlocks_then_thread_all_reduce(flat_grad: torch.Tensor) -> torch.Tensor:
    """In the training cases (no lock there) it disarms the lock for whatever probe comes
    next in the same process, then all-reduces on a thread: the byte probe's ranks must be
    new processes, locked before any of the learner's code runs in them. (In place: a
    replaced ``lockdown.lock`` would end the case, ``course.grading.freeze``.)"""
    import ddp_lab.course.grading.checks.lockdown as lockdown

    lockdown._locked[:] = ["-"]
    return thread_all_reduce(flat_grad)


class Remote(RemoteLearner):
    """The verdict's handle without a runner: 10.fsdp_reduce reaches the learner's code
    through ``ranks`` only."""

    def __init__(self, grade_id: str, *objects: Any) -> None:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
        blob = _pickle.dumps(objects)
        super().__init__(grade_id, None, None, lambda: None, blob, "en", 0, RankPool)  # type: ignore[arg-type]


def remote_verdict(*objects: Any) -> tuple[bool, str]:
    learner = Remote("10.fsdp_reduce", *objects)
    try:
        return run_checker(load_checkers()["10.fsdp_reduce"], learner, "en")
    finally:
        learner.close()


observed = pytest.mark.skipif(
    not sandbox.available() or traffic.tools() is None,
    reason="the grader counts the ranks' bytes with a sandbox, ss and nsenter",
)


@observed
def test_graded_the_reference_passes_and_whole_gradients_get_nothing() -> None:
    passed, line = remote_verdict(*graded_solution("10.fsdp_reduce"))
    assert passed and "2/2" in line and "could not observe" not in line, line
    # both got 2/2 before: the rank's own account saw neither
    passed, line = remote_verdict(thread_all_reduce)
    assert not passed and " 0/2" in line and "Hidden case 2 of" in line, line
    assert "reduce_grad called dist.all_reduce, which this exercise does not allow" in line, line
    passed, line = remote_verdict(thread_all_gather)
    assert not passed and " 0/2" in line and "Hidden case 2 of" in line, line
    assert "the grader saw rank" in line, line
    # the lock disarmed in the training cases' ranks: the byte probe's ranks are fresh
    passed, line = remote_verdict(unlocks_then_thread_all_reduce)
    assert not passed and " 0/2" in line and "Hidden case 2 of" in line, line
    assert "reduce_grad called dist.all_reduce, which this exercise does not allow" in line, line
