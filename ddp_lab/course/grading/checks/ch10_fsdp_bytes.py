"""10.fsdp_reduce's reduce-scatter, observed from outside the ranks (see ``ch10_fsdp``).

``probe_fsdp_bytes`` calls the learner's ``reduce_grad`` alone, once per large gradient, in
lockstep with the grader (``per_call``: ``course.grading.rankhost`` reads the kernel's byte
counters of the ranks' private network between the calls, ``course.grading.traffic``), in
ranks that refuse all_reduce, all_gather and broadcast (``ALLOWED``, ``checks.lockdown``: in
every thread of the rank, whatever the road). The checker then verifies each rank's shard
against the average it computes itself, and bounds the bytes each rank *received* from the
others (``judge_bytes``); what the rank says it called is only a hint for the feedback.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ddp_lab.course.grading import fail, unobserved
from ddp_lab.i18n import _t

# --- the bound, calibrated in the grading sandboxes ------------------------------------------
#
# Per call of reduce_grad on G bytes of gradient over N ranks, S = G / N the bytes of a shard:
# a reduce-scatter receives (N-1) S per rank (each other rank's part of this rank's shard,
# directly or around a ring). But gloo has no reduce-scatter of its own: torch's
# ``reduce_scatter_tensor`` on gloo all-reduces the whole input and copies the shard out
# (ProcessGroupGloo.cpp, ``reduce_scatter_tensor_coalesced``), and its list form does the same,
# so the exercise's own answer receives what an all-reduce receives, 2 (N-1) S (a ring) per
# rank. Measured (``benchmarks/bench_fsdp_traffic.py``, gloo over loopback in the grading
# sandboxes, float64, numel 60000 and 120000; numbers in docs/INSTRUCTORS.md), per rank, in
# units of (N-1) S:
#   N = 3: every correct answer 1.00 to 2.01 (dist.reduce_scatter_single, reduce_scatter_tensor,
#          funcol's reduce_scatter_tensor: 2.00, 641152 bytes at 60000 elements; the list form
#          2.01, 643392 to 643488; isend/irecv, a ring or an all_to_all_single of shards:
#          1.00, 320288; a reduce of each shard to its rank 1.34); gloo's all_reduce 2.00,
#          641152; an all-gather of whole gradients (batch_isend_irecv or batch_p2p_ops), a
#          gather of every whole gradient to each root in turn, an all_to_all of whole
#          gradients: 3.00, 960288; a reduce of the whole gradient to each root 4.01.
#   N = 2: correct answers 1.00 to 2.01, and every all-gather 2.00 as well: at N = 2 an
#          all-gather of whole gradients moves what an all-reduce does, so the bytes are judged
#          at N = 3 only.
# gloo adds about 100 bytes of header per message; a case's one group costs a few bytes more.
# The bound, (N-1) S x RECEIVED_SLACK + OVERHEAD, sits halfway between 2.00 and 3.00: 1.25 x
# above the exercise's own answer, 1.2 x below an all-gather's. An all-reduce of the whole
# gradient receives what gloo's reduce-scatter does: the bytes cannot tell them apart, so the
# probe's ranks refuse all_reduce (``ALLOWED``; ``checks.lockdown``: the dispatcher's
# ``c10d::`` operators and the backends' methods, process-wide, so a thread's all_reduce is
# refused too); the result, checked here, is then wrong.
RECEIVED_SLACK = 2.5
OVERHEAD = 4096  # gloo's headers (~100 bytes a message) and the group's few bytes
# What each rank may receive outside the group's connections, or that no socket explains
# (UDP, a connection opened and closed within the call), or through the TCPStore.
UNSEEN_SLACK = 0.05
N_OBSERVED = 3  # the world size whose bytes are judged (see above)

# The c10d operators (and backend methods) the probe's ranks allow: the reduce-scatters, and
# those a reduce-scatter can be built from whose whole-gradient use the bytes tell apart (an
# all_to_all or a gather of shards is a reduce-scatter; of whole gradients, an all-gather);
# point-to-point and the barrier are always allowed (``lockdown.POINT_TO_POINT``). Refused:
# all_reduce (on the wire what gloo's reduce-scatter is), all_gather and broadcast (no
# reduce-scatter is made of them).
ALLOWED = frozenset(
    {
        "reduce_scatter_",
        "_reduce_scatter_base_",
        "reduce_scatter_tensor_coalesced_",
        "alltoall_",
        "alltoall_base_",
        "gather_",
        "scatter_",
        "reduce_",
    }
)


def probe_fsdp_bytes(rank: int, objects: tuple, grads: list[torch.Tensor]) -> list[dict]:
    """In the learner's rank: their ``reduce_grad`` on each of this rank's gradients (the only
    data it receives). Per call, what it returned (a tensor, or None) and the first collective
    the rank's lock refused, in any thread (a hint for the feedback: the result is checked
    outside)."""
    import threading

    from ddp_lab.course.grading.checks.lockdown import Forbidden

    (reduce_grad,) = objects
    refused: list[str] = []
    hook = threading.excepthook

    def in_thread(args: Any) -> None:
        if isinstance(args.exc_value, Forbidden):
            refused.append(str(args.exc_value))
        hook(args)

    out = []
    threading.excepthook = in_thread
    try:
        for flat in grads:
            try:
                got = reduce_grad(flat.clone())
            except Forbidden as exc:
                got = None
                refused.append(str(exc))
            shard = got.detach().clone() if isinstance(got, torch.Tensor) else None
            out.append({"shard": shard, "refused": refused[0] if refused else ""})
    finally:
        threading.excepthook = hook
    return out


probe_fsdp_bytes.collectives_allowed = ALLOWED  # type: ignore[attr-defined]
# One call of the learner's reduce_grad per gradient, each observed on its own by the grader.
probe_fsdp_bytes.per_call = True  # type: ignore[attr-defined]


def byte_inputs(rng: random.Random, n: int) -> list[list[torch.Tensor]]:
    """Rank r's gradients: two float64 gradients of tens of thousands of elements (a multiple
    of ``n``, as the exercise promises), large enough that gloo's headers are noise."""
    numels = [n * rng.randint(10000, 20000) for _ in range(2)]
    gen = torch.Generator().manual_seed(rng.randrange(10**6))
    return [[torch.randn(m, dtype=torch.float64, generator=gen) for m in numels] for _ in range(n)]


def received(traffic: Any, rank: int, n: int) -> int:
    """Bytes ``rank`` received from the other ranks on the group's connections."""
    return sum(traffic.sent(peer, rank) for peer in range(n) if peer != rank)


def unseen(traffic: Any) -> int:
    """Bytes between the ranks the group's connections do not explain (any rank's)."""
    return (
        traffic.hidden
        + traffic.unattributed
        + getattr(traffic, "outside", 0)
        + getattr(traffic, "store", 0)
    )


def received_most(numel: int, element_size: int, n: int) -> int:
    """Most bytes a rank may receive for one call (see the calibration above)."""
    shard = numel // n * element_size
    return int(RECEIVED_SLACK * (n - 1) * shard) + OVERHEAD


def judge_bytes(calls: list, grads: list[torch.Tensor], n: int, case: str) -> None:
    """Fail ``case`` if, in any call (``calls[k]``: the grader's count of the call on
    ``grads[k]``), a rank received more than a reduce-scatter (as gloo runs it) does."""
    for traffic, grad in zip(calls, grads, strict=True):
        most = received_most(grad.numel(), grad.element_size(), n)
        hidden = unseen(traffic)
        for rank in range(n):
            got = received(traffic, rank, n) + hidden
            if got > most or hidden > UNSEEN_SLACK * most:
                raise fail(
                    _t(
                        "the grader saw rank {rank} receive {got} bytes from the other ranks "
                        "in one call of reduce_grad on a gradient of {numel} elements "
                        "({size} bytes each) on {n} ranks; a reduce-scatter receives at most "
                        "about {most}. Every rank received the whole gradient (or every "
                        "rank's), although it keeps only its shard: use "
                        "dist.reduce_scatter_single (reduce-scatter).",
                        rank=rank,
                        got=got,
                        numel=grad.numel(),
                        size=grad.element_size(),
                        n=n,
                        most=most,
                    ),
                    case,
                )


def judge_shards(got: Any, inputs: list[list[torch.Tensor]], n: int, case: str) -> None:
    """Each rank's result of each call must be its shard of the average: computed here from
    every rank's gradient (no rank had another's)."""
    from ddp_lab.course.grading.checks.ch10_forms import _bad

    calls = len(inputs[0])
    if not isinstance(got, list) or len(got) != n:
        raise _bad("-", "ranks", got, case)
    for rank, records in enumerate(got):
        if not isinstance(records, list) or len(records) != calls:
            raise _bad(rank, "result", records, case)
        for record in records:
            if not isinstance(record, dict) or not isinstance(record.get("refused"), str):
                raise _bad(rank, "result", record, case)
            if record["refused"]:
                raise fail(
                    _t(
                        "reduce_grad called dist.{name}, which this exercise does not allow "
                        "(in any thread): every rank would receive the whole gradient (or "
                        "every rank's) although it keeps only its shard; use "
                        "dist.reduce_scatter_single (reduce-scatter)",
                        name=record["refused"][:40],
                    ),
                    case,
                )
    for k in range(calls):
        numel = inputs[0][k].numel()
        want = (sum(mine[k] for mine in inputs) / n).chunk(n)
        for rank in range(n):
            shard = got[rank][k]["shard"]
            if not isinstance(shard, torch.Tensor) or tuple(shard.shape) != (numel // n,):
                raise fail(
                    _t(
                        "reduce_grad returned shape {got} for a gradient of {n} elements on "
                        "{world} ranks; expected this rank's shard, shape ({want},)",
                        got=tuple(shard.shape) if isinstance(shard, torch.Tensor) else None,
                        n=numel,
                        world=n,
                        want=numel // n,
                    ),
                    case,
                )
            if shard.dtype != want[rank].dtype or not torch.allclose(
                shard, want[rank], rtol=1e-9, atol=1e-12
            ):
                raise fail(
                    _t(
                        "rank {rank}: reduce_grad returned a tensor that is not its shard of "
                        "the average over the ranks of a gradient of {numel} elements (the "
                        "sum divided by {n}, elements {start} to {stop})",
                        rank=rank,
                        numel=numel,
                        n=n,
                        start=rank * (numel // n),
                        stop=(rank + 1) * (numel // n) - 1,
                    ),
                    case,
                )


def check_bytes(rng: random.Random, learner: Any, n: int, case: str) -> None:
    """The byte case of 10.fsdp_reduce on ``n`` ranks: run last, in fresh ranks locked before
    any of the learner's code runs in them (the lock lasts for their life, and the training
    probes need the other collectives)."""
    if getattr(learner, "unobserved", "") == "self-study":
        return  # the learner's own processes: nothing to count, no lock (ch10_fsdp's checks)
    inputs = byte_inputs(rng, n)
    # In new processes: the training cases ran the learner's code in this exercise's ranks
    # unlocked, and that code could have disarmed a lock taken later in the same process.
    got = learner.ranks(probe_fsdp_bytes, inputs, timeout=120, fresh=True)
    judge_shards(got, inputs, n, case)
    observed = getattr(learner, "traffic", None)
    if isinstance(observed, list):
        judge_bytes(observed, inputs[0], n, case)
    else:
        unobserved(
            learner,
            case,
            _t(
                "the grader could not count the bytes between the ranks (ss failed, or the "
                "ranks opened too many sockets), so the reduce-scatter is not shown."
            ),
            _t(
                "10.fsdp_reduce: the grader could not observe the bytes between the ranks here "
                "(no sandbox, or no ss/nsenter): what reduce_grad received was judged from the "
                "ranks' own report only."
            ),
        )
