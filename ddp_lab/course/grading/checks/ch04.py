"""Checkers of chapter 04: all-reduce as reduce + broadcast, all-gather from send/recv.

Each hidden case runs the learner's function on several ranks through a probe
(``probe_all_reduce``, ``probe_all_gather``). Rank r receives only rank r's tensors
(``learner.ranks``; when graded, a sandbox per rank, ``course.grading.rankhost``), made by the checker:
never the seed that makes the others, so a right sum or a full gathered list proves that the
ranks communicated. In the rank, the collective they must rebuild is switched off while their
code runs (by name in ``torch.distributed`` and, for aliases, on the function object itself),
and the probe returns, as data, the tensors their code left behind and the forbidden calls it
tried (the rank's own account: a hint for the feedback). The oracle is what
``dist.all_reduce`` and ``dist.all_gather`` leave on every rank, computed in the checker from
all the ranks' inputs (``summed``, ``gathered``); the checker compares.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.lockdown import Forbidden
from ddp_lab.course.grading.learner import LearnerError, Refused, refuse
from ddp_lab.i18n import _t

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
DTYPES |= {"int32": torch.int32, "float16": torch.float16}
# Seconds the ranks of one world size may run (a correct solution takes about one).
CASE_TIMEOUT_S = 30.0


# The probes run in the learner's process after their code, and ``guard.seal`` freezes the
# code and defaults of ddp_lab's functions there, not the module attributes: what a probe and
# its helpers read at run time is bound as (positional, immutable) default arguments when this
# module loads, so rebinding ``ch04.guarded`` or ``ch04.setattr`` reaches none of them.
@contextlib.contextmanager
def forbid(
    names: tuple[str, ...],
    called: list[str],
    _modules: tuple = (dist, c10d),
    _refuse: Callable = refuse,
    _forbidden: type = Forbidden,
    _builtins: tuple = (getattr, hasattr, setattr, isinstance, FunctionType),
) -> Iterator[None]:
    """Make ``dist.<name>`` raise ``Forbidden`` for a while, recording each name in ``called``.

    The module attributes (``dist`` and ``c10d``) become recording stubs; the original
    function objects refuse too (``learner.refuse``), so an alias the learner made of one
    (``from torch.distributed import all_reduce``) raises ``Refused``.
    """
    (dist_, c10d_), (getattr_, hasattr_, setattr_, isinstance_, function) = _modules, _builtins
    originals = {n: getattr_(dist_, n) for n in names if hasattr_(dist_, n)}
    saved = {n: (getattr_(dist_, n), getattr_(c10d_, n, None)) for n in originals}

    def make(name: str) -> Callable:
        def blocked(*args: object, **kwargs: object) -> None:
            called.append(name)
            raise _forbidden(name)

        return blocked

    try:
        for n in originals:
            setattr_(dist_, n, make(n))
            setattr_(c10d_, n, getattr_(dist_, n))
        functions = {f"dist.{n}": f for n, f in originals.items() if isinstance_(f, function)}
        with _refuse(functions):
            yield
    finally:
        for n, (a, b) in saved.items():
            setattr_(dist_, n, a)
            setattr_(c10d_, n, b)


def guarded(
    fn: Callable,
    args: tuple,
    banned: tuple[str, ...],
    _forbid: Callable = forbid,
    _stops: tuple = (Forbidden, Refused, str),
) -> tuple[Any, list[str]]:
    """Call the learner's ``fn(*args)`` with ``banned`` forbidden: (its result, what it tried).

    A forbidden call ends the call (result None). One that got past ``forbid`` (a name
    imported before, a process group's method) is stopped by the rank's lock
    (``checks/lockdown.py``), which names the collective; ``["*"]`` stands for a refusal
    without a name.
    """
    forbidden, refused, str_ = _stops
    called: list[str] = []
    try:
        with _forbid(banned, called):
            return fn(*args), called
    except forbidden as exc:
        return None, called or [str_(exc) or "*"]
    except refused:
        return None, called or ["*"]


def judge_forbidden(called: Any, banned: tuple[str, ...], allowed: str, case: str) -> None:
    """Fail the case if the probe recorded a call of a forbidden collective."""
    if called == []:
        return
    names = [n for n in called if n in banned] if isinstance(called, list) else []
    if names:
        raise fail(
            _t(
                "your function called dist.{name}: build it from {allowed} instead",
                name=names[0],
                allowed=allowed,
            ),
            case,
        )
    raise fail(
        _t(
            "your function called a collective this exercise asks you to build (one "
            "of {names}), or did what its ranks refuse (ctypes, writing to /proc, "
            "starting a program, a socket that is not IP): build it from {allowed} instead",
            names=", ".join(f"dist.{n}" for n in banned),
            allowed=allowed,
        ),
        case,
    )


def ranks_case(learner: Any, probe: Callable, per_rank: list, case: str, timeout: float) -> list:
    """Run ``probe`` on ``len(per_rank)`` of the learner's ranks, rank r on ``per_rank[r]``
    only (``learner.ranks``); a hang or a crash fails ``case``. NotImplementedError (the
    unsolved stub) goes up for ``run_checker``."""
    try:
        got = learner.ranks(probe, per_rank, timeout=timeout)
    except LearnerError as exc:
        if exc.not_implemented:
            raise
        if exc.timed_out:
            raise fail(
                _t(
                    "the ranks were still running after {seconds} s: a deadlock? (e.g. every "
                    "rank blocked in send or in recv, waiting for a peer that waits too, or "
                    "ranks calling different operations)",
                    seconds=timeout,
                ),
                case,
            ) from None
        if exc.type_name == "RankFailed" and exc.message:  # killed, or exited: the reason
            raise fail(exc.message, case) from None
        error = f"{exc.type_name}: {exc.message}" if exc.message else exc.type_name
        raise fail(_t("a rank raised {error}", error=error), case) from None
    if not isinstance(got, list) or len(got) != len(per_rank):
        raise fail(
            _t(
                "rank {rank}: the result could not be read (the checker's probe was changed?)",
                rank="?",
            ),
            case,
        )
    return got


def short(t: torch.Tensor) -> str:
    values = t.flatten()[:4].tolist()
    return f"{values}{'...' if t.numel() > 4 else ''}"


def same(got: Any, want: torch.Tensor) -> bool:
    """``got`` is a tensor equal to ``want`` (shape, dtype and values)."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and got.dtype == want.dtype
        and torch.equal(got, want)
    )


def shown(got: Any) -> str:
    return short(got) if isinstance(got, torch.Tensor) else repr(got)[:60]


def make_input(rank: int, shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers: every dtype sums them exactly, so results compare exactly."""
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    return torch.randint(-9, 10, shape, generator=gen).to(dtype)


_ALL_REDUCE_BANNED = (  # a tuple: probes bind it (see ``forbid``)
    "all_reduce",
    "all_reduce_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
)
_ALL_REDUCE_ALLOWED = "dist.reduce + dist.broadcast"
_ALL_GATHER_BANNED = (  # a tuple: probes bind it (see ``forbid``)
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "gather",
    "all_to_all",
    "all_to_all_single",
    "all_reduce",
    "scatter",
    "broadcast_object_list",
    "gather_object",
)
_ALL_GATHER_ALLOWED = "dist.send / dist.recv (or isend / irecv)"
# The c10d operators a graded rank of each exercise may reach (``checks/lockdown.py``: every
# other collective is locked before the learner's objects are loaded, whatever the road).
ALL_REDUCE_OPERATORS = frozenset({"reduce_", "broadcast_"})
POINT_TO_POINT_ONLY: frozenset[str] = frozenset()


# --- probes: in the learner's process, on each rank; data only, no oracle ---------------


def probe_all_reduce(
    rank: int,
    objects: tuple,
    inputs: list[torch.Tensor],
    _guarded: Callable = guarded,
    _banned: tuple = _ALL_REDUCE_BANNED,
) -> list[dict]:
    """Per case (this rank's tensors, the only inputs it receives): whether their function
    returned its input, the input after it, what it tried. (The last parameters: bound at
    import, see ``forbid``.)"""
    (reduce_broadcast_all_reduce,) = objects
    out = []
    for given in inputs:
        mine = given.clone()
        got, called = _guarded(reduce_broadcast_all_reduce, (mine,), _banned)
        out.append({"returned_input": got is mine, "tensor": mine.detach(), "forbidden": called})
        if called:
            break
    return out


probe_all_reduce.collectives_allowed = ALL_REDUCE_OPERATORS  # type: ignore[attr-defined]


def probe_all_gather(
    rank: int,
    objects: tuple,
    inputs: list[torch.Tensor],
    _guarded: Callable = guarded,
    _banned: tuple = _ALL_GATHER_BANNED,
) -> list[dict]:
    """Per case (this rank's tensors, the only inputs it receives): whether tensor_list kept
    its tensors, those tensors after the call, what it tried. (The last parameters: bound at
    import, see ``forbid``.)"""
    (send_recv_all_gather,) = objects
    n = dist.get_world_size()
    out = []
    for mine_given in inputs:
        mine = mine_given.clone()
        given = [torch.full(tuple(mine.shape), -99, dtype=mine.dtype) for _ in range(n)]
        tensor_list = list(given)
        _, called = _guarded(send_recv_all_gather, (tensor_list, mine), _banned)
        kept = len(tensor_list) == n and all(
            a is b for a, b in zip(tensor_list, given, strict=True)
        )
        tensors = [t.detach() for t in given]
        out.append({"kept_list": kept, "tensors": tensors, "forbidden": called})
        if called:
            break
    return out


probe_all_gather.collectives_allowed = POINT_TO_POINT_ONLY  # type: ignore[attr-defined]


# --- oracles: real PyTorch, in the checker's process ----------------------------------------
# What the collective leaves on every rank, computed in one process from every rank's input (as
# CS336 checks DDP against one process): the inputs are small integers, so the sum is exact in
# any order and equals gloo's bit for bit (``tests/course/checks/test_ch04_ch05.py`` compares
# both with torch's own collectives on gloo ranks). Ranks of the checker's own cost a Python
# and torch start per verdict process, i.e. per submission.


def summed(per_rank: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """``all_reduce(SUM)``: rank r's i-th result is the sum over ranks of their i-th input."""
    sums = [functools.reduce(torch.add, case) for case in zip(*per_rank, strict=True)]
    return [sums for _ in per_rank]


def gathered(per_rank: list[list[torch.Tensor]]) -> list[list[list[torch.Tensor]]]:
    """``all_gather``: rank r's i-th result is the list of every rank's i-th input, in order."""
    lists = [list(case) for case in zip(*per_rank, strict=True)]
    return [lists for _ in per_rank]


# --- checkers: in the trusted process -------------------------------------------------


def _cases(rng: random.Random, dtypes: list[str]) -> list:
    shapes = [(), (1,), (rng.randint(2, 7),), (rng.randint(2, 4), rng.randint(2, 5))]
    return [(s, rng.choice(dtypes), rng.randrange(10**6)) for s in shapes]


def _world_sizes(rng: random.Random) -> list[int]:
    return [2, 3, 4, rng.choice([3, 4])]


def rank_inputs(cases: list, n: int) -> list[list[torch.Tensor]]:
    """Rank r's tensors of each case, made here: a rank receives only its own, never a seed."""
    return [
        [make_input(r, tuple(shape), DTYPES[dtype], seed) for shape, dtype, seed in cases]
        for r in range(n)
    ]


def records_of(got: Any, rank: int, ncases: int, case: str) -> list[dict]:
    """One rank's per-case records, checked for shape (a probe stops at a forbidden call)."""
    if (
        not isinstance(got, list)
        or not 1 <= len(got) <= ncases
        or not all(isinstance(r, dict) for r in got)
        or (len(got) < ncases and not got[-1].get("forbidden"))
    ):
        raise fail(
            _t(
                "rank {rank}: the result could not be read (the checker's probe was changed?)",
                rank=rank,
            ),
            case,
        )
    return got


@checker("04.all_reduce", points=3)
def check_all_reduce(rng: random.Random, learner: Any) -> Iterator[object]:
    """all_reduce(SUM) rebuilt from reduce + broadcast, in place, on 2-4 ranks."""
    world_sizes = _world_sizes(rng)
    yield len(world_sizes)
    for n in world_sizes:
        cases = _cases(rng, ["float32", "float64", "int64", "int32"])
        case = running(f"world_size={n}")
        inputs = rank_inputs(cases, n)
        expected = summed(inputs)
        got = ranks_case(learner, probe_all_reduce, inputs, case, CASE_TIMEOUT_S)
        records = [records_of(g, r, len(cases), case) for r, g in enumerate(got)]
        for i in range(len(cases)):
            for rank in range(n):
                record = records[rank][i] if i < len(records[rank]) else {"forbidden": ["*"]}
                judge_forbidden(
                    record.get("forbidden"), _ALL_REDUCE_BANNED, _ALL_REDUCE_ALLOWED, case
                )
                if record.get("returned_input") is not True:
                    raise fail(
                        _t(
                            "rank {rank}: it must return the tensor it was given (in place)",
                            rank=rank,
                        ),
                        case,
                    )
                want, mine = expected[rank][i], record.get("tensor")
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
        yield case


@checker("04.all_gather", points=3)
def check_all_gather(rng: random.Random, learner: Any) -> Iterator[object]:
    """all_gather(tensor_list, tensor) rebuilt from point-to-point messages, on 2-4 ranks."""
    world_sizes = _world_sizes(rng)
    yield len(world_sizes)
    for n in world_sizes:
        cases = _cases(rng, ["float32", "float64", "int64", "int32"])
        case = running(f"world_size={n}")
        inputs = rank_inputs(cases, n)
        expected = gathered(inputs)
        got = ranks_case(learner, probe_all_gather, inputs, case, CASE_TIMEOUT_S)
        records = [records_of(g, r, len(cases), case) for r, g in enumerate(got)]
        for i in range(len(cases)):
            for rank in range(n):
                record = records[rank][i] if i < len(records[rank]) else {"forbidden": ["*"]}
                judge_forbidden(
                    record.get("forbidden"), _ALL_GATHER_BANNED, _ALL_GATHER_ALLOWED, case
                )
                if record.get("kept_list") is not True:
                    raise fail(
                        _t(
                            "rank {rank}: fill the tensors already in tensor_list (in rank order) "
                            "instead of replacing them",
                            rank=rank,
                        ),
                        case,
                    )
                want, tensors = expected[rank][i], record.get("tensors")
                if not isinstance(tensors, list) or len(tensors) != n:
                    raise fail(
                        _t(
                            "rank {rank}: the result could not be read (the checker's probe was "
                            "changed?)",
                            rank=rank,
                        ),
                        case,
                    )
                if not all(same(g, w) for g, w in zip(tensors, want, strict=True)):
                    raise fail(
                        _t(
                            "rank {rank}: expected {expected}, got {got}",
                            rank=rank,
                            expected=[short(t) for t in want],
                            got=[shown(t) for t in tensors],
                        ),
                        case,
                    )
        yield case
