"""Checker of chapter 05: a hand-written ring all-reduce from point-to-point messages.

Each hidden case runs the learner's ``ring_all_reduce`` on 2 to 4 Gloo ranks next to
``dist.all_reduce`` on awkward sizes (fewer elements than ranks, sizes not divisible by the
world size, one element) and several dtypes. While the learner's code runs, the built-in
collectives are switched off and every byte sent with ``send``/``isend`` (also through
``batch_isend_irecv``) is counted: a ring sends about 2(N-1)/N of the tensor per rank, an
implementation that passes the full buffer around sends N/2 times more and fails.

The ring must also be safe on NCCL, which these Gloo ranks cannot show by hanging: while the
learner's code runs, ``dist.get_backend`` answers "nccl", and every point-to-point operation
is recorded where every road ends, as a ``c10d::`` operator of the dispatcher (``watch_p2p``:
a function imported by name or a process group's method included). A send or receive outside
``batch_isend_irecv`` fails. The batches are then
replayed as NCCL runs them: ProcessGroupNCCL runs every batched p2p op of a device on one
stream (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``pointToPoint``: a batch uses the
device's communicator), so a rank's batch can finish only when every message in it has its
partner in the batch its peer is running now. A ring that puts a receive alone in a batch
before its send (or a send alone before its receive) leaves every rank waiting: the replay
gets stuck and the case fails, with the batch that blocks.

Where each part runs: the probe (``probe_ring``) runs the learner's ring in their rank (when
graded: a sandbox per rank, ``course.grading.rankhost``, that receives only its own tensors, never the
seed that makes the others) under those guards and returns, per rank, the tensor it left, what
it sent, its batches and its loose p2p calls, as data. The sums prove that the ranks
communicated; what the guards recorded is the rank's own account (a rank could undo the
guards on purpose: the dispatch mode lives in its process), which decides the NCCL verdict
and, where the bytes cannot be counted from outside, the way. The oracle (what ``dist.all_reduce`` leaves on every rank,
``ch04.summed``), the comparison, the send limit and the NCCL replay run in the checker.

The way itself is observed from outside the ranks when grading (``judge_calls``, in
``ch05_traffic``): the grader counts, call by call, the bytes each rank sent each other rank
on the connections of the group it was given, in the ranks' private network
(``course.traffic``), and a right sum sent the wrong way (a gather and broadcast, an
all_gather and a local sum, the whole buffer around the ring, gloo's own all_reduce, a group
or sockets of the learner's own) fails.
Where that cannot be counted (self-study, no sandbox, no ``ss``/``nsenter``) the rank's own
account is all there is, and a graded verdict says so.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddp_lab.comm_debug import tensors_of, watch_c10d
from ddp_lab.course.grading import checker, fail, running, unobserved
from ddp_lab.course.grading.checks import ch04
from ddp_lab.course.grading.checks.ch04 import guarded, same, short, shown, summed
from ddp_lab.course.grading.checks.ch05_traffic import (  # noqa: F401
    judge_calls,
    judge_traffic,
    ring_bytes,
)
from ddp_lab.i18n import N_, _t, lookup

_BANNED = (  # a tuple: ``probe_ring`` binds it (see ``watch_p2p``)
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
)
# Texts picked by a computed key (ops of the send/recv log).
MESSAGES = {
    "op_send": N_("send to {peer}"),
    "op_recv": N_("receive from {peer}"),
}


# torch's own p2p functions, by their code (a name imported before, or an alias, runs the
# same code): an operator run from inside batch_isend_irecv's code is batched, one run from
# isend's code was called as isend. Taken when this module loads, before any learner code.
_BATCH_CODE = inspect.unwrap(c10d.batch_isend_irecv).__code__
_P2P_CODES = tuple(
    (inspect.unwrap(getattr(c10d, n)).__code__, n) for n in ("isend", "irecv", "send", "recv")
)


# The probe runs in the learner's process after their code; ``guard.seal`` freezes the code
# and defaults of ddp_lab's functions there, not module attributes (review 10 rebound
# ``ch05._BATCH_CODE`` and ``comm_debug.watch_c10d``). So what the probe reads while it runs is
# bound here, as positional defaults (an immutable tuple) of immutable values.
@contextlib.contextmanager
def watch_p2p(
    batches: list[list[tuple[str, int]]],
    loose: list[str],
    sent: list[int],
    _watch: Any = watch_c10d,
    _tensors_of: Any = tensors_of,
    _codes: tuple = (_BATCH_CODE, _P2P_CODES),
    _modules: tuple = (dist, c10d, sys._getframe),
    _builtins: tuple = (sum, len, type, int),
) -> Iterator[None]:
    """Record every point-to-point operation: the ops of each batch_isend_irecv (with their
    peers), the p2p calls made outside one, and the elements sent.

    Seen as ``c10d::send`` / ``c10d::recv_`` operators (``ddp_lab.comm_debug.watch_c10d``),
    not by replacing ``dist.isend``: a function imported by name before
    (``from torch.distributed import isend``), a process group's method or
    ``torch.ops.c10d`` is seen too, and a batch is what runs inside torch's
    ``batch_isend_irecv`` (its code on the Python stack), whatever name called it.
    Meanwhile ``dist.get_backend`` answers "nccl", so that code that picks its schedule by
    backend (as ``ddp_lab.ring`` does) shows the schedule it would run on GPUs.
    """
    (batch_code, p2p_codes), (dist_, c10d_, getframe) = _codes, _modules
    sum_, len_, type_, int_ = _builtins
    current: list[Any] = [None]  # the frame of the batch being recorded (held: never reused)
    saved_backend = (dist_.get_backend, c10d_.get_backend)

    def on_call(name: str, args: tuple) -> None:
        if name not in ("send", "recv"):
            return
        if name == "send":
            sent[0] += sum_(t.numel() for t in _tensors_of(args[0]))
        peer = args[2] if len_(args) > 3 and type_(args[2]) is int_ else -1
        frame, batch, called = getframe(1), None, name
        while frame is not None:
            if frame.f_code is batch_code:
                batch = frame
                break
            for code, n in p2p_codes:
                called = n if frame.f_code is code else called
            frame = frame.f_back
        if batch is None:
            loose.append(called)
            return
        if batch is not current[0]:
            current[0] = batch
            batches.append([])
        batches[-1].append((name, peer))

    def nccl(group: object = None) -> str:
        return "nccl"

    try:
        dist_.get_backend = c10d_.get_backend = nccl
        with _watch(on_call):
            yield
    finally:
        current[0] = None
        dist_.get_backend, c10d_.get_backend = saved_backend


def replay_on_one_stream(logs: list[list[list[tuple[str, int]]]]) -> tuple[int, int] | None:
    """Run every rank's batches as NCCL would, one stream per rank; None if all finish.

    ``logs[r]`` lists rank r's batches, each a list of ("send" | "recv", peer). The k-th
    send from a to b is matched with the k-th receive on b from a. A rank's current batch
    finishes when each of its messages has been matched while the peer was running the
    batch holding the partner (NCCL groups run the ops of one batch together; nothing after
    a batch starts before it ends). Returns
    (rank, batch index) of a batch that can never finish, or None.
    """
    count: dict[tuple[str, int, int], int] = {}
    msgs: list[list[list[tuple[int, int, int]]]] = []
    for r, batches in enumerate(logs):
        msgs.append([])
        for ops in batches:
            ids = []
            for kind, peer in ops:
                src, dst = (r, peer) if kind == "send" else (peer, r)
                k = count.get((kind, src, dst), 0)
                count[(kind, src, dst)] = k + 1
                ids.append((src, dst, k))
            msgs[r].append(ids)
    pos = [0] * len(logs)

    def current(r: int) -> list:
        return msgs[r][pos[r]] if pos[r] < len(msgs[r]) else []

    done: set[tuple[int, int, int]] = set()
    moved = True
    while moved:
        moved = False
        for r in range(len(logs)):  # a message moves while both ends are in their batches
            done.update(m for m in current(r) if m in current(m[1] if m[0] == r else m[0]))
        for r in range(len(logs)):
            if pos[r] < len(msgs[r]) and all(m in done for m in current(r)):
                pos[r] += 1
                moved = True
    stuck = [r for r in range(len(logs)) if pos[r] < len(msgs[r])]
    return (stuck[0], pos[stuck[0]]) if stuck else None


def send_limit(numel: int, world_size: int) -> int:
    """Most elements one rank of a ring sends: 2(N-1) chunks of at most ceil(numel/N)."""
    return 2 * (world_size - 1) * math.ceil(numel / world_size)


_ALLOWED = "dist.batch_isend_irecv"


def probe_ring(
    rank: int,
    objects: tuple,
    inputs: list[torch.Tensor],
    _bound: tuple = (watch_p2p, guarded, _BANNED),  # see ``watch_p2p``
) -> list[dict]:
    """In the learner's rank (a sandbox of its own when graded): their ring on each of this
    rank's tensors (the only inputs it receives), under the guards.

    Per case: whether it returned its input, the input after it, the forbidden collectives
    it tried, the elements it sent, its batches of p2p ops and its p2p calls outside a batch.
    The guards run in the learner's process: what they record is the rank's own account (a
    hint for the feedback); the sums are the proof that the ranks communicated.
    """
    (ring_all_reduce,) = objects
    watch, guard, banned = _bound
    out = []
    for given in inputs:
        mine = given.clone()
        sent = [0]
        batches: list[list[tuple[str, int]]] = []
        loose: list[str] = []
        with watch(batches, loose, sent):
            got, called = guard(ring_all_reduce, (mine,), banned)
        out.append(
            {
                "returned_input": got is mine,
                "tensor": mine.detach().clone(),  # as it was when the call returned
                "forbidden": called,
                "sent": sent[0],
                "batches": batches,
                "loose": loose,
            }
        )
        if called:
            break
    return out


probe_ring.collectives_allowed = ch04.POINT_TO_POINT_ONLY  # type: ignore[attr-defined]
# One call of the learner's ring per input, each observed on its own by the grader
# (``rankhost``: the ranks wait between calls while the grader reads the counters).
probe_ring.per_call = True  # type: ignore[attr-defined]


def _valid_log(batches: object, n: int) -> bool:
    return isinstance(batches, list) and all(
        isinstance(ops, list)
        and all(
            isinstance(op, tuple | list)
            and len(op) == 2
            and op[0] in ("send", "recv")
            and type(op[1]) is int
            and 0 <= op[1] < n
            for op in ops
        )
        for ops in batches
    )


def judge_ring_case(
    records: list,
    expected: list[torch.Tensor],
    n: int,
    case: str,
    given: list[torch.Tensor] | None = None,
) -> None:
    """Judge one case from every rank's record (``probe_ring``); raise ``fail`` on a problem.

    ``given``: each rank's input, shown (its shape, dtype and first values) next to a wrong
    result.
    """
    for rank, record in enumerate(records):
        if not isinstance(record, dict):
            raise fail(
                _t(
                    "rank {rank}: the result could not be read (the checker's probe was changed?)",
                    rank=rank,
                ),
                case,
            )
        ch04.judge_forbidden(record.get("forbidden"), _BANNED, _ALLOWED, case)
        if record.get("returned_input") is not True:
            raise fail(
                _t("rank {rank}: it must return the tensor it was given (in place)", rank=rank),
                case,
            )
        mine, want = record.get("tensor"), expected[rank]
        if not same(mine, want) and given is not None:
            raise fail(
                _t(
                    "rank {rank}: its input was {given} (shape {shape}, {dtype}); the sum of "
                    "all {n} ranks' inputs, which every rank must hold, is {expected}; got {got}",
                    rank=rank,
                    n=len(records),
                    given=short(given[rank]),
                    shape=tuple(given[rank].shape),
                    dtype=str(given[rank].dtype).removeprefix("torch."),
                    expected=short(want),
                    got=shown(mine),
                ),
                case,
            )
        if not same(mine, want):
            raise fail(
                _t(
                    "rank {rank}: expected {expected}, got {got}",
                    rank=rank,
                    expected=short(want),
                    got=shown(mine),
                ),
                case,
            )
        loose, sent = record.get("loose"), record.get("sent")
        if (
            not isinstance(loose, list)
            or not all(isinstance(x, str) for x in loose)
            or type(sent) is not int
            or not _valid_log(record.get("batches"), n)
        ):
            raise fail(
                _t(
                    "rank {rank}: the result could not be read (the checker's probe was changed?)",
                    rank=rank,
                ),
                case,
            )
    for rank, record in enumerate(records):
        if record["loose"]:
            name = record["loose"][0]
            name = name if name in ("send", "recv", "isend", "irecv") else "send"
            raise fail(
                _t(
                    "rank {rank} called dist.{name} outside batch_isend_irecv. That passes "
                    "on Gloo but deadlocks (or risks it) on NCCL, where dist.send does not "
                    "even block the CPU: put each step's send to the right and receive from "
                    "the left in ONE dist.batch_isend_irecv.",
                    rank=rank,
                    name=name,
                ),
                case,
            )
    logs = [[[(str(k), int(p)) for k, p in ops] for ops in r["batches"]] for r in records]
    stuck = replay_on_one_stream(logs)
    if stuck is not None:
        who, index = stuck
        ops = ", ".join(lookup(MESSAGES, "op_" + k, peer=p) for k, p in logs[who][index])
        raise fail(
            _t(
                "on NCCL this ring would deadlock: rank {rank} waits in its "
                "batch_isend_irecv number {batch} ({ops}), whose partners are not in the "
                "batches its peers are running. NCCL runs all batched p2p of a GPU on "
                "one stream (ProcessGroupNCCL.cpp, pointToPoint), so a batch holding "
                "only a receive blocks this rank's later send, and around the ring every "
                "rank waits for the others. Put the send and the receive of a step in "
                "the same batch.",
                rank=who,
                batch=index + 1,
                ops=ops,
            ),
            case,
        )
    numel, limit = expected[0].numel(), send_limit(expected[0].numel(), n)
    for rank, record in enumerate(records):
        if record["sent"] > limit:
            raise fail(
                _t(
                    "rank {rank} sent {sent} elements for a tensor of {numel} on {n} ranks; "
                    "a ring sends at most {limit} (2(N-1) chunks of about numel/N). Send one "
                    "chunk per step, not the whole buffer.",
                    rank=rank,
                    sent=record["sent"],
                    numel=numel,
                    n=n,
                    limit=limit,
                ),
                case,
            )


def cases_for(rng: random.Random, n: int) -> list:
    """Awkward sizes for N ranks, then a large one that exposes full-buffer passing: at least
    36 KB in 4- or 8-byte elements, so that gloo's message headers stay small next to the
    gap between a ring and a full-buffer ring (see ``judge_traffic``)."""
    dtypes = ["float32", "float64", "int64", "int32", "float16"]
    sizes = [
        (1,),
        (n - 1 or 1,),
        (n * rng.randint(2, 5) + rng.randint(1, n - 1),),
        (rng.randint(2, 4), n + 1),
    ]
    cases = [(s, rng.choice(dtypes), rng.randrange(10**6)) for s in sizes]
    large = (n * rng.randint(3000, 5000) + 1,)
    return [*cases, (large, rng.choice(dtypes[:4]), rng.randrange(10**6))]


@checker("05.ring", points=5)
def check_ring(rng: random.Random, learner: Any) -> Iterator[object]:
    """ring_all_reduce(tensor): SUM in place on 2-4 ranks, 2(N-1)/N of the data per rank."""
    world_sizes = [2, 3, 4, rng.choice([3, 4])]
    yield len(world_sizes)
    for n in world_sizes:
        case = running(f"world_size={n}")
        cases = cases_for(rng, n)
        inputs = ch04.rank_inputs(cases, n)
        expected = summed(inputs)
        got = ch04.ranks_case(learner, probe_ring, inputs, case, ch04.CASE_TIMEOUT_S)
        records = [ch04.records_of(g, r, len(cases), case) for r, g in enumerate(got)]
        for i in range(len(cases)):
            judge_ring_case(
                [r[i] if i < len(r) else r[-1] for r in records],
                [e[i] for e in expected],
                n,
                case,
                [mine[i] for mine in inputs],
            )
        observed = getattr(learner, "traffic", None)
        if isinstance(observed, list):  # one count per call, on the group's connections
            judge_calls(observed, inputs[0], n, case)
        elif observed is not None:
            judge_traffic(observed, inputs[0], n, case)
        else:
            unobserved(
                learner,
                case,
                _t(
                    "the grader could not count the bytes between the ranks (ss failed, or "
                    "the ranks opened too many sockets), so the ring's way is not shown."
                ),
                _t(
                    "05.ring: the grader could not observe the bytes between the ranks here "
                    "(no sandbox, or no ss/nsenter): the ring's way was judged from the ranks' "
                    "own report only."
                ),
            )
        yield case
