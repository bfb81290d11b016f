"""Checkers of chapter 04: all-reduce as reduce + broadcast, all-gather from send/recv.

Each hidden case runs the learner's function on several ranks next to the real collective
(``dist.all_reduce``, ``dist.all_gather``), with the collective the learner must rebuild
switched off while their code runs, so that calling it is reported instead of passing.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddp_lab.course.grading import checker, fail
from ddp_lab.course.i18n import Messages

MESSAGES = Messages(
    __name__,
    {
        "forbidden": {
            "en": "your function called dist.{name}: build it from {allowed} instead",
            "zh": "你的函数调用了 dist.{name}：请改用 {allowed} 来实现",
        },
        "not_returned": {
            "en": "rank {rank}: it must return the tensor it was given (in place)",
            "zh": "rank {rank}：函数必须原地修改并返回传入的那个张量",
        },
        "values": {
            "en": "rank {rank}: expected {expected}, got {got}",
            "zh": "rank {rank}：期望 {expected}，实际得到 {got}",
        },
        "timeout": {
            "en": "the ranks were still running after {seconds} s: a deadlock? (e.g. every "
            "rank waiting in recv, or ranks calling different operations)",
            "zh": "{seconds} 秒后各 rank 仍未结束：是否死锁？（例如所有 rank 都在 recv 中等待，"
            "或各 rank 调用了不同的操作）",
        },
        "crashed": {"en": "rank {rank} raised {error}", "zh": "rank {rank} 抛出了 {error}"},
        "list": {
            "en": "rank {rank}: fill the tensors already in tensor_list (in rank order) "
            "instead of replacing them",
            "zh": "rank {rank}：请把数据写入 tensor_list 里原有的张量（按 rank 顺序），而不是替换它们",
        },
    },
)


class Forbidden(RuntimeError):
    """Raised when the learner calls a collective the exercise asks them to rebuild."""


@contextlib.contextmanager
def forbid(names: list[str], allowed: str) -> Iterator[None]:
    """Replace ``dist.<name>`` (and the c10d original) by a function that raises, for a while."""
    saved = {n: (getattr(dist, n, None), getattr(c10d, n, None)) for n in names}

    def make(name: str) -> Callable:
        def blocked(*args: object, **kwargs: object) -> None:
            raise Forbidden(MESSAGES("forbidden", name=name, allowed=allowed))

        return blocked

    try:
        for n in names:
            setattr(dist, n, make(n))
            setattr(c10d, n, getattr(dist, n))
        yield
    finally:
        for n, (a, b) in saved.items():
            setattr(dist, n, a)
            setattr(c10d, n, b)


def run_ranks(rank_fn: Callable, args: tuple, nprocs: int, case: str, timeout: float = 30) -> None:
    """Run one hidden case on ``nprocs`` ranks; raise ``fail`` with the first problem found.

    A learner's exception is reported with its own message (not the launcher's summary);
    NotImplementedError (the unsolved stub) is re-raised for ``grade`` to recognise.
    """
    from ddp_lab import spawn
    from ddp_lab.runtime.launcher import DistributedError, DistributedTimeoutError

    try:
        results = spawn(
            rank_fn, args=args, nprocs=nprocs, backend="gloo", quiet=True, timeout=timeout
        )
    except DistributedTimeoutError:
        raise fail(MESSAGES("timeout", seconds=timeout), case) from None
    except DistributedError as err:
        if any(isinstance(f.exception, NotImplementedError) for f in err.failures):
            raise
        first = err.failures[0] if err.failures else None
        if first is None or first.exception is None:
            raise
        error = f"{type(first.exception).__name__}: {str(first.exception).splitlines()[0]}"
        raise fail(MESSAGES("crashed", rank=first.rank, error=error), case) from None
    for problem in results:
        if problem:
            raise fail(problem, case)


def short(t: torch.Tensor) -> str:
    values = t.flatten()[:4].tolist()
    return f"{values}{'...' if t.numel() > 4 else ''}"


def make_input(rank: int, shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers: every dtype sums them exactly, so results compare exactly."""
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    return torch.randint(-9, 10, shape, generator=gen).to(dtype)


_ALL_REDUCE_BANNED = [
    "all_reduce",
    "all_reduce_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
]
_ALL_GATHER_BANNED = [
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
]


def _rank_all_reduce(rank: int, fn: Callable, cases: list) -> str:
    for shape, dtype, seed in cases:
        mine = make_input(rank, shape, dtype, seed)
        expected = mine.clone()
        dist.all_reduce(expected)  # the oracle
        with forbid(_ALL_REDUCE_BANNED, "dist.reduce + dist.broadcast"):
            got = fn(mine)
        if got is not mine:
            return MESSAGES("not_returned", rank=rank)
        if not torch.equal(mine, expected):
            return MESSAGES("values", rank=rank, expected=short(expected), got=short(mine))
    return ""


def _rank_all_gather(rank: int, fn: Callable, cases: list) -> str:
    n = dist.get_world_size()
    for shape, dtype, seed in cases:
        mine = make_input(rank, shape, dtype, seed)
        expected = [torch.zeros(shape, dtype=dtype) for _ in range(n)]
        dist.all_gather(expected, mine)  # the oracle
        out = [torch.full(shape, -99, dtype=dtype) for _ in range(n)]
        given = list(out)
        with forbid(_ALL_GATHER_BANNED, "dist.send / dist.recv (or isend / irecv)"):
            fn(out, mine)
        if len(out) != n or any(a is not b for a, b in zip(out, given, strict=True)):
            return MESSAGES("list", rank=rank)
        for got, want in zip(out, expected, strict=True):
            if not torch.equal(got, want):
                return MESSAGES(
                    "values",
                    rank=rank,
                    expected=[short(t) for t in expected],
                    got=[short(t) for t in out],
                )
    return ""


def _cases(rng: random.Random, dtypes: list[torch.dtype]) -> list:
    shapes = [(), (1,), (rng.randint(2, 7),), (rng.randint(2, 4), rng.randint(2, 5))]
    return [(s, rng.choice(dtypes), rng.randrange(10**6)) for s in shapes]


def _run(rng: random.Random, fn: Callable, rank_fn: Callable) -> Iterator[object]:
    world_sizes = [2, 3, 4, rng.choice([3, 4])]
    yield len(world_sizes)
    for n in world_sizes:
        cases = _cases(rng, [torch.float32, torch.float64, torch.int64, torch.int32])
        case = f"world_size={n}"
        run_ranks(rank_fn, (fn, cases), n, case)
        yield case


@checker("04.all_reduce", points=3)
def check_all_reduce(rng: random.Random, reduce_broadcast_all_reduce: Callable) -> Iterator[object]:
    """all_reduce(SUM) rebuilt from reduce + broadcast, in place, on 2-4 ranks."""
    yield from _run(rng, reduce_broadcast_all_reduce, _rank_all_reduce)


@checker("04.all_gather", points=3)
def check_all_gather(rng: random.Random, send_recv_all_gather: Callable) -> Iterator[object]:
    """all_gather(tensor_list, tensor) rebuilt from point-to-point messages, on 2-4 ranks."""
    yield from _run(rng, send_recv_all_gather, _rank_all_gather)
