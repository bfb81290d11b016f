"""The grader's count of the bytes between ranks (course/grading/traffic.py) and 05.ring's bounds.

No sandbox here: ``ss`` lines and counters as the kernel gives them, and per-pair byte counts
measured on gloo ranks in the grader's sandboxes (the calibration in docs/INSTRUCTORS.md). The
sandboxed path end to end: tests/course/test_grading_attacks_ranks.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from ddp_lab.course.grading import CaseFailed, traffic
from ddp_lab.course.grading.checks.ch05 import judge_traffic, ring_bytes

SS = """\
ESTAB 0 0 127.0.0.1:50129 127.0.0.1:37632 users:(("python",pid={a},fd=5)) ino:11 sk:1 <-> ts bytes_received:4100 segs_out:2 segs_in:5
ESTAB 0 0 127.0.0.1:37632 127.0.0.1:50129 users:(("python",pid={b},fd=4)) ino:12 sk:2 <-> ts bytes_sent:4100 bytes_acked:4101 segs_out:5 segs_in:3
LISTEN 0 4096 127.0.0.1:29500 0.0.0.0:* users:(("python",pid={a},fd=3)) ino:13 sk:3 <->
"""


def test_parse_and_difference_count_each_pair_from_the_receiver() -> None:
    # rank 0 is this process, rank 1 a child of it (not this process's parent: under a
    # detached launch that is pid 1, where the pid walk stops)
    child = subprocess.Popen(["sleep", "60"])
    try:
        me, other = os.getpid(), child.pid
        before = traffic.Snapshot({}, 0, 0)
        ends = traffic.parse_ss(SS.format(a=me, b=other))
        assert ends[("127.0.0.1:37632", "127.0.0.1:50129", 12)].sent == 4100
        after = traffic.Snapshot(ends, 4100 + 7 * traffic.HEADER_BYTES + 500, 7)
        # the pid walk finds each rank's process
        moved = traffic.difference(before, after, {me: 0, other: 1}, store=29500)
        assert moved.pairs == {(1, 0): 4100} and moved.sent(0, 1) == 0
        assert moved.unattributed == 0 and moved.hidden == 500  # 500 bytes no socket explains
        # a socket held by no rank's process (this one, when only the child is a rank's) is
        # not a pair's
        moved = traffic.difference(before, after, {other: 1}, store=29500)
        assert moved.pairs == {} and moved.unattributed == 4100
    finally:
        child.kill()
        child.wait()


def _traffic(pairs: dict[tuple[int, int], int], hidden: int = 0) -> traffic.Traffic:
    return traffic.Traffic(pairs=pairs, hidden=hidden)


TENSORS = [torch.zeros(100000)]  # 400000 bytes of float32, as in the calibration


def _ring(n: int, right: int, left: int) -> dict[tuple[int, int], int]:
    return {(r, (r + 1) % n): right for r in range(n)} | {(r, (r - 1) % n): left for r in range(n)}


# Measured (gloo in the grader's sandboxes, 100000 float32 elements, one tensor per case):
# N=3: honest ring 533716..533728 right, 192..200 left; gather+broadcast 0->1, 0->2, 1->0,
# 2->0 ~400150 each; all_gather+sum ~400150 each pair; full buffer ring 800192 right; gloo's
# all_reduce 534096..534112 to the LEFT. N=4: honest 600576..600584 right, 288..296 left,
# 0..8 to the others.
HONEST = {3: _ring(3, 533728, 200), 4: _ring(4, 600584, 296) | {(0, 2): 8, (1, 3): 8}}
WRONG = {
    "gather-broadcast": (3, {(0, 1): 400152, (0, 2): 400144, (1, 0): 400144, (2, 0): 400152}),
    "all_gather + sum": (3, {(a, b): 400150 for a in range(3) for b in range(3) if a != b}),
    "full buffer ring": (3, _ring(3, 800200, 104)),
    "gloo all_reduce": (3, _ring(3, 392, 534112)),
    "full buffer ring N=4": (4, _ring(4, 1200296, 152)),
}


@pytest.mark.parametrize("n", [3, 4])
def test_measured_honest_ring_is_within_the_bounds(n: int) -> None:
    judge_traffic(_traffic(HONEST[n]), TENSORS, n, "case")
    low, high, _ = ring_bytes(TENSORS, n)
    assert low <= HONEST[n][(0, 1)] <= high + 1024


@pytest.mark.parametrize("name", sorted(WRONG))
def test_measured_wrong_ways_fail(name: str) -> None:
    n, pairs = WRONG[name]
    with pytest.raises(CaseFailed, match="the grader saw"):
        judge_traffic(_traffic(pairs), TENSORS, n, "case")


def test_a_ring_to_the_left_is_told_it_runs_the_wrong_way() -> None:
    """A hand-written ring to the left sends what gloo's own all_reduce sends (measured above):
    the direction is what tells them apart, and the message says so."""
    for pairs in (_ring(3, 200, 533728), WRONG["gloo all_reduce"][1]):
        with pytest.raises(CaseFailed, match="its left neighbour: this ring runs to the left"):
            judge_traffic(_traffic(pairs), TENSORS, 3, "case")
    with pytest.raises(CaseFailed, match="not its right neighbour"):  # not a ring at all
        judge_traffic(_traffic(WRONG["gather-broadcast"][1]), TENSORS, 3, "case")


def test_bytes_outside_the_group_and_too_few_to_the_right_fail() -> None:
    with pytest.raises(CaseFailed, match="outside their process group"):
        judge_traffic(_traffic(HONEST[3], hidden=240000), TENSORS, 3, "case")
    with pytest.raises(CaseFailed, match="rendezvous store"):  # data through store.set/get
        judge_traffic(traffic.Traffic(pairs=HONEST[3], store=400000), TENSORS, 3, "case")
    judge_traffic(traffic.Traffic(pairs=HONEST[3], store=9414), TENSORS, 3, "case")  # measured
    with pytest.raises(CaseFailed, match="to its right neighbour"):  # the data went elsewhere
        judge_traffic(_traffic(_ring(3, 288, 96)), TENSORS, 3, "case")


@pytest.mark.skipif(
    traffic.tools() is None or os.geteuid() != 0, reason="needs ss, nsenter and root"
)
def test_snapshot_reads_a_namespace_and_refuses_a_flood(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as server:  # at least one socket in this process's namespace
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        shot = traffic.snapshot(os.getpid())
        assert any(
            e.local.endswith(f":{port}") and os.getpid() in e.pids for e in shot.ends.values()
        )
        monkeypatch.setattr(traffic, "MAX_SS_BYTES", 10)
        with pytest.raises(traffic.Unreadable):
            traffic.snapshot(os.getpid())


def _end(local: str, peer: str, pid: int, sent: int = 0, received: int = 0) -> traffic.End:
    return traffic.End(local, peer, hash((local, peer)) & 0xFFFF, (pid,), sent, received, 0)


def _shot(*ends: traffic.End) -> traffic.Snapshot:
    return traffic.Snapshot({(e.local, e.peer, e.inode): e for e in ends}, 0, 0)


def test_group_of_and_bytes_outside_the_groups_connections() -> None:
    """The group's connections are those that appeared while the ranks joined it (one per
    pair); bytes between the same ranks on any other connection are ``outside``, not sent."""
    roots = {100: 0, 101: 1}
    store = _end("127.0.0.1:5000", "127.0.0.1:40000", 100)  # the TCPStore: not the group's
    old = [
        _end("127.0.0.1:41000", "127.0.0.1:41001", 100),
        _end("127.0.0.1:41001", "127.0.0.1:41000", 101),
    ]
    before = _shot(*old)
    pair = [
        _end("127.0.0.1:42000", "127.0.0.1:42001", 100),
        _end("127.0.0.1:42001", "127.0.0.1:42000", 101),
    ]
    joined = _shot(*old, store, *pair)
    group = traffic.group_of(before, joined, roots, 5000, 2)
    assert group == {
        ("127.0.0.1:42000", "127.0.0.1:42001"): (0, 1),
        ("127.0.0.1:42001", "127.0.0.1:42000"): (1, 0),
    }
    # A call: 700 bytes 0 -> 1 on the group's connection, 500 on an earlier group's, 300 on a
    # new socket of the learner's own; only the first is "sent".
    mine = [
        _end("127.0.0.1:43000", "127.0.0.1:43001", 100, 300),
        _end("127.0.0.1:43001", "127.0.0.1:43000", 101, 0, 300),
    ]
    after = _shot(
        _end("127.0.0.1:41000", "127.0.0.1:41001", 100, 500), _end("127.0.0.1:41001", "127.0.0.1:41000", 101, 0, 500),
        _end("127.0.0.1:42000", "127.0.0.1:42001", 100, 700), _end("127.0.0.1:42001", "127.0.0.1:42000", 101, 0, 700),
        *mine,
    )  # fmt: skip
    seen = traffic.difference(joined, after, roots, 5000, group)
    assert seen.pairs == {(0, 1): 700} and seen.outside == 800, seen
    assert traffic.difference(joined, after, roots, 5000).pairs == {(0, 1): 1500}  # no group
    with pytest.raises(CaseFailed, match="outside their process group"):
        judge_traffic(traffic.Traffic(pairs=HONEST[3], outside=30000), TENSORS, 3, "case")
    # No connection for a pair, or two: the grader cannot tell the group's bytes from others'.
    with pytest.raises(traffic.GroupUnclear):
        traffic.group_of(before, _shot(*old, store), roots, 5000, 2)
    with pytest.raises(traffic.GroupUnclear):
        traffic.group_of(before, _shot(*old, store, *pair, *mine), roots, 5000, 2)


def test_what_moves_after_the_last_call_counts_as_the_last_calls() -> None:
    """Review 7: the lockstep read the counters after each call, and not after the ranks'
    last answer; a ring that sent ring-sized junk in every call and all-reduced afterwards
    went uncounted (5/5). ``rankhost._run_steps`` folds that stretch into the last call's
    count with ``traffic.combined``."""
    junk = traffic.Traffic(pairs={(0, 1): 100, (1, 0): 100}, messages={(0, 1): 2}, hidden=3)
    after = traffic.Traffic(pairs={(0, 1): 50, (1, 2): 7}, store=5, outside=11, unattributed=1)
    both = traffic.combined(junk, after)
    assert both.pairs == {(0, 1): 150, (1, 0): 100, (1, 2): 7}
    assert both.messages == {(0, 1): 2}
    assert (both.store, both.outside, both.unattributed, both.hidden) == (5, 11, 1, 3)
    assert junk.pairs == {(0, 1): 100, (1, 0): 100}  # the parts are left as they were
