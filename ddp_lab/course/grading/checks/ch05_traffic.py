"""Chapter 05's ring, graded: the way it sent its bytes, observed from outside the ranks.

``judge_traffic`` is called by ``ch05.check_ring`` when grading (per-rank sandboxes in a
network of their own, ``course.grading.rankhost``): the bytes each rank sent each other rank,
read by the grader from the kernel's counters (``course.grading.traffic``), must be a ring's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ddp_lab.course.grading import fail
from ddp_lab.i18n import _t

# --- the way, observed from outside the ranks (grading only) ----------------------------------
#
# ``course.traffic`` gives the payload bytes each rank sent each other rank during one world
# size's case (all its tensors), read by the grader from the kernel's counters of the ranks'
# private network. A ring sends each rank's data only to its right neighbour (r -> r+1):
# 2(N-1) chunks per tensor. The bounds below come from calibration (``ddp-lab`` sandboxes,
# gloo over loopback, N = 3 and 4, 1 to 100000 float32 elements; numbers in
# docs/INSTRUCTORS.md): an honest ring sent its payload plus about 96 bytes of gloo headers per
# message to the right and about 48 bytes per message (gloo's "ready to receive") to the left;
# a new group costs 8 bytes per pair; nothing else moved.
#
# - Upper bound to the right: a ring's payload (``ring_bytes``: 2(N-1) chunks of at most
#   ceil(numel/N)) times RIGHT_SLACK, plus OVERHEAD_PER_MESSAGE per message the ring needs and
#   OVERHEAD_PER_CASE. A ring that passes the whole buffer sends N/2 times the payload (1.5 at
#   N = 3), so the slack must stay under 1.5, and the case's large tensor
#   (``cases_for``) keeps the headers' share far below the gap. It lets a ring split each chunk
#   into segments of 1 KiB or more (gloo's ~96 bytes per message stay under 10 % of them);
#   segments under about 500 bytes pass the 20 % and fail, with the bytes in the feedback.
# - Lower bound to the right: in each phase a ring sends every chunk but one, so at least
#   2(numel - ceil(numel/N)) elements leave each rank for its right neighbour (``ring_bytes``).
#   Data that takes a way the grader cannot see (a socket that is not TCP) is missing here.
# - Everything else (to the left, to non-neighbours): gloo's control messages only, bounded by
#   OTHER_SLACK of the payload plus OVERHEAD_PER_MESSAGE per message. A gather to rank 0 and a
#   broadcast, an all_gather and a local sum, and gloo's own all_reduce (a ring to the *left*)
#   each send whole chunks or buffers there.
# - Bytes no open socket explains (UDP, a TCP connection opened and closed within the case),
#   on a socket shared by two ranks, through the TCPStore past its rendezvous (STORE_BYTES),
#   or between ranks on a connection that is not the case's group's (``Traffic.outside``: a
#   new group, an earlier case's group, a socket of the learner's own): at most HIDDEN_SLACK
#   of the payload plus a constant.
#
# When grading, each call of the learner's ring is counted on its own (``rankhost``'s
# lockstep), on the connections of the group the ranks were given (``traffic.group_of``), so
# every bound holds per call and per direction, not only summed over a case.
RIGHT_SLACK = 1.2
OTHER_SLACK = 0.1
HIDDEN_SLACK = 0.05
OVERHEAD_PER_MESSAGE = 256  # measured: ~96 to the right, ~48 to the left
OVERHEAD_PER_CASE = 1024  # measured: 8 per pair for a new group
# The TCPStore (the rendezvous, on rank 0) carries init_process_group's keys: measured 1.8 to
# 9.4 KB per case at N <= 4. Data passed through it (store.set/get) counts as unseen past this.
STORE_BYTES = 32 * 1024


def ring_bytes(tensors: list[torch.Tensor], n: int) -> tuple[int, int, int]:
    """(least, most) payload bytes a ring sends to its right neighbour for ``tensors`` on ``n``
    ranks, and the messages it needs (one per step with data)."""
    low = high = messages = 0
    for t in tensors:
        numel, size, chunk = t.numel(), t.element_size(), math.ceil(t.numel() / n)
        low += 2 * max(numel - chunk, 0) * size
        high += 2 * (n - 1) * chunk * size
        messages += 2 * (n - 1)
    return low, high, messages


def judge_calls(calls: list, tensors: list[torch.Tensor], n: int, case: str) -> None:
    """``judge_traffic`` for each call of the learner's ring (``calls[k]``: the count of the
    call on ``tensors[k]``), one kind of problem at a time over every call: first bytes
    outside the group's connections, then bytes to a rank that is not the right neighbour,
    then the bytes to the right; so the verdict names the pattern (a gather sends a small
    tensor's few bytes elsewhere too, which first reads as too few to the right)."""
    for phase in ("outside", "elsewhere", "right"):
        for call, tensor in zip(calls, tensors, strict=True):
            judge_traffic(call, [tensor], n, case, store_bytes=0, phases=(phase,))


def judge_traffic(
    traffic: Any,
    tensors: list[torch.Tensor],
    n: int,
    case: str,
    store_bytes: int = STORE_BYTES,
    phases: tuple[str, ...] = ("outside", "elsewhere", "right"),
) -> None:
    """Fail ``case`` if what the grader saw move between the ranks is not a ring's.

    ``traffic``: ``course.traffic.Traffic`` of one call of the learner's ring (``tensors``:
    its one input), counted on the case's group's connections, or of a whole case (every
    tensor of one world size); ``tensors``: the inputs of one rank (their sizes and dtypes are
    every rank's); ``store_bytes``: the TCPStore's bytes that are the rendezvous (none in a
    call's count: the ranks joined their group before it).
    """
    low, high, messages = ring_bytes(tensors, n)
    right_most = int(RIGHT_SLACK * high) + OVERHEAD_PER_MESSAGE * messages + OVERHEAD_PER_CASE
    other_most = int(OTHER_SLACK * high) + OVERHEAD_PER_MESSAGE * messages + OVERHEAD_PER_CASE
    # First what went outside the group's connections: a ring on sockets of its own sends
    # nothing on them, which would read as too few bytes to the right.
    rendezvous = max(traffic.store - store_bytes, 0)
    unseen = traffic.hidden + traffic.unattributed + rendezvous + getattr(traffic, "outside", 0)
    if "outside" in phases and unseen > int(HIDDEN_SLACK * high) + OVERHEAD_PER_CASE:
        raise fail(
            _t(
                "the grader saw {unseen} bytes move between the ranks outside their "
                "process group's connections (another socket, or the rendezvous store); "
                "a ring sends only through its process group.",
                unseen=unseen,
            ),
            case,
        )
    # every rank sends its data to its left neighbour and nothing elsewhere: a ring, reversed
    left_ring = all(
        (traffic.sent(r, p) > other_most) == (p == (r - 1) % n)
        for r in range(n)
        for p in range(n)
        if p != r
    )
    for rank in range(n if "elsewhere" in phases else 0):  # it names the pattern best
        right = (rank + 1) % n
        for peer in range(n):
            if peer in (rank, right) or traffic.sent(rank, peer) <= other_most:
                continue
            if left_ring:  # the other way round: what gloo's own all_reduce sends
                raise fail(
                    _t(
                        "the grader saw rank {rank} send {sent} bytes to rank {peer}, its "
                        "left neighbour: this ring runs to the left. The exercise's ring "
                        "sends to the right, to (rank + 1) % N, and receives from the left, "
                        "as in the lesson; gloo's own all_reduce is a ring to the left, and "
                        "the grader tells your ring from it by the direction.",
                        rank=rank,
                        sent=traffic.sent(rank, peer),
                        peer=peer,
                    ),
                    case,
                )
            raise fail(
                _t(
                    "the grader saw rank {rank} send {sent} bytes to rank {peer}, which is "
                    "not its right neighbour (rank {right}); in a ring each rank sends only "
                    "to its right neighbour (a gather to one rank, an all_gather or gloo's "
                    "own all_reduce send elsewhere).",
                    rank=rank,
                    sent=traffic.sent(rank, peer),
                    peer=peer,
                    right=right,
                ),
                case,
            )
    for rank in range(n if "right" in phases else 0):
        right = (rank + 1) % n
        sent = traffic.sent(rank, right)
        if sent > right_most or sent < low:
            raise fail(
                _t(
                    "the grader saw rank {rank} send {sent} bytes to its right neighbour "
                    "(rank {right}) for these tensors on {n} ranks; a ring sends it between "
                    "{low} and {high} bytes of data (2(N-1) chunks of about numel/N), plus "
                    "a little for each message. Send one chunk per step, to the right only.",
                    rank=rank,
                    right=right,
                    sent=sent,
                    n=n,
                    low=low,
                    high=high,
                ),
                case,
            )
