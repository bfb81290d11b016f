"""Checker of chapter 05: a hand-written ring all-reduce from point-to-point messages.

Each hidden case runs the learner's ``ring_all_reduce`` on 2 to 4 Gloo ranks next to
``dist.all_reduce`` on awkward sizes (fewer elements than ranks, sizes not divisible by the
world size, one element) and several dtypes. While the learner's code runs, the built-in
collectives are switched off and every byte sent with ``send``/``isend`` (also through
``batch_isend_irecv``) is counted: a ring sends about 2(N-1)/N of the tensor per rank, an
implementation that passes the full buffer around sends N/2 times more and fails.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddp_lab.course.checks import ch04
from ddp_lab.course.checks.ch04 import forbid, make_input, run_ranks, short
from ddp_lab.course.grading import checker
from ddp_lab.course.i18n import Messages

_BANNED = [
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
]
# The messages this checker shares with ch04 (not_returned, values...) are ch04.MESSAGES.
MESSAGES = Messages(
    __name__,
    {
        "too_much": {
            "en": "rank {rank} sent {sent} elements for a tensor of {numel} on {n} ranks; a ring "
            "sends at most {limit} (2(N-1) chunks of about numel/N). Send one chunk per step, "
            "not the whole buffer.",
            "zh": "rank {rank} 为一个 {numel} 个元素的张量在 {n} 个 rank 上发送了 {sent} 个元素；"
            "环形全归约最多发送 {limit} 个（2(N-1) 个大小约为 numel/N 的块）。"
            "每一步只发送一个块，而不是整个缓冲区。",
        },
    },
)


@contextlib.contextmanager
def count_sends(counter: list[int]) -> Iterator[None]:
    """Count the elements passed to send/isend (batch_isend_irecv calls isend for each op)."""
    saved = {n: (getattr(dist, n), getattr(c10d, n)) for n in ("send", "isend")}

    def wrap(original: Callable) -> Callable:
        def counted(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
            counter[0] += tensor.numel()
            return original(tensor, *args, **kwargs)

        return counted

    try:
        for n, (a, _) in saved.items():
            setattr(dist, n, wrap(a))
            setattr(c10d, n, getattr(dist, n))  # P2POp checks its op against c10d.isend
        yield
    finally:
        for n, (a, b) in saved.items():
            setattr(dist, n, a)
            setattr(c10d, n, b)


def send_limit(numel: int, world_size: int) -> int:
    """Most elements one rank of a ring sends: 2(N-1) chunks of at most ceil(numel/N)."""
    return 2 * (world_size - 1) * math.ceil(numel / world_size)


def _rank_ring(rank: int, fn: Callable, cases: list) -> str:
    n = dist.get_world_size()
    for shape, dtype, seed in cases:
        mine = make_input(rank, shape, dtype, seed)
        expected = mine.clone()
        dist.all_reduce(expected)  # the oracle
        sent = [0]
        with forbid(_BANNED, "dist.isend / dist.irecv (or send / recv)"), count_sends(sent):
            got = fn(mine)
        if got is not mine:
            return ch04.MESSAGES("not_returned", rank=rank)
        if not torch.equal(mine, expected):
            return ch04.MESSAGES("values", rank=rank, expected=short(expected), got=short(mine))
        numel = mine.numel()
        if sent[0] > send_limit(numel, n):
            return MESSAGES(
                "too_much", rank=rank, sent=sent[0], numel=numel, n=n, limit=send_limit(numel, n)
            )
    return ""


def cases_for(rng: random.Random, n: int) -> list:
    """Awkward sizes for N ranks, then a large one that exposes full-buffer passing."""
    dtypes = [torch.float32, torch.float64, torch.int64, torch.int32, torch.float16]
    sizes = [
        (1,),
        (n - 1 or 1,),
        (n * rng.randint(2, 5) + rng.randint(1, n - 1),),
        (rng.randint(2, 4), n + 1),
        (n * rng.randint(200, 400) + 1,),
    ]
    return [(s, rng.choice(dtypes), rng.randrange(10**6)) for s in sizes]


@checker("05.ring", points=5)
def check_ring(rng: random.Random, ring_all_reduce: Callable) -> Iterator[object]:
    """ring_all_reduce(tensor): SUM in place on 2-4 ranks, 2(N-1)/N of the data per rank."""
    world_sizes = [2, 3, 4, rng.choice([3, 4])]
    yield len(world_sizes)
    for n in world_sizes:
        case = f"world_size={n}"
        run_ranks(_rank_ring, (ring_all_reduce, cases_for(rng, n)), n, case)
        yield case
