"""Checkers of chapter 09: fix a hanging evaluation; an all-reduce that fails together.

Both run the learner's function on hidden world sizes under ``spawn`` with a timeout, so
a hang is reported as a failed case instead of blocking the notebook. The oracle runs on
a process group of its own, created before the learner's code runs: a learner's stray
collective can then never pair up with the oracle's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from ddp_lab.course.grading import checker, fail
from ddp_lab.course.i18n import Messages

# Seconds one hidden case may run before it counts as a hang (a correct one takes < 1 s).
HANG_TIMEOUT_S = 20.0

MESSAGES = Messages(
    __name__,
    {
        "hang": {
            "en": "it hangs: some rank waits in a collective that another rank never calls",
            "zh": "程序卡住了：有的 rank 在等待另一个 rank 永远不会调用的集合通信",
        },
        "crash": {"en": "rank {rank} raised {error}", "zh": "rank {rank} 抛出了 {error}"},
        "value": {
            "en": "rank {rank} returned {got}, expected {expected}",
            "zh": "rank {rank} 返回了 {got}，应为 {expected}",
        },
        "tensor": {
            "en": "rank {rank}: the tensor holds {got}, expected the sum over ranks {expected}",
            "zh": "rank {rank}：张量中是 {got}，应为各 rank 之和 {expected}",
        },
        "no_raise": {
            "en": "rank {rank} did not raise ValueError (it {did}); shapes or dtypes "
            "differ across ranks, so every rank must raise it",
            "zh": "rank {rank} 没有抛出 ValueError（它{did}）；各 rank 的形状或数据类型"
            "不同，所以每个 rank 都必须抛出它",
        },
        "did_returned": {"en": "returned normally", "zh": "正常返回了"},
        "did_raised": {"en": "raised {error}", "zh": "抛出了 {error}"},
    },
)


def _spawn(fn: Callable, args: tuple, world_size: int) -> list:
    """Run a case; a hang or a crash outside the learner's code becomes a CaseFailed."""
    from ddp_lab.runtime.launcher import DistributedError, DistributedTimeoutError, spawn

    try:
        return spawn(
            fn, args=args, nprocs=world_size, backend="gloo", quiet=True, timeout=HANG_TIMEOUT_S
        )
    except DistributedTimeoutError:
        raise fail(MESSAGES("hang"), f"world_size={world_size}") from None
    except DistributedError as exc:
        first = exc.failures[0] if exc.failures else None
        if first is not None and isinstance(first.exception, NotImplementedError):
            raise first.exception from None
        error = first.reason if first is not None else str(exc)
        raise fail(error, f"world_size={world_size}") from None


# --- 09.global_accuracy --------------------------------------------------------------


def _accuracy_case(rank: int, fn: Callable, counts: list[tuple[int, int]]) -> tuple:
    oracle_group = dist.new_group(backend="gloo")  # collective: every rank, before fn
    correct, total = counts[rank]
    both = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(both, group=oracle_group)  # the oracle: torch's own all-reduce
    expected = (both[0] / both[1]).item()
    got = fn(correct, total)
    # Ranks that are done wait here, as a training loop would wait in its next
    # collective: a rank stuck in the learner's code is then a real hang.
    dist.barrier(group=oracle_group)
    return expected, got


@checker("09.global_accuracy", points=3)
def check_global_accuracy(rng: random.Random, global_accuracy: Callable) -> Iterator[object]:
    world_sizes = [2, rng.choice([3, 4]), rng.choice([2, 3, 4])]
    yield len(world_sizes)
    for world_size in world_sizes:
        # Unequal totals (like a short last shard): the mean of the ranks' accuracies
        # differs from the global accuracy.
        counts = []
        for _ in range(world_size):
            total = rng.randint(5, 200)
            counts.append((rng.randint(0, total), total))
        case = f"world_size={world_size}"
        results = _spawn(_accuracy_case, (global_accuracy, counts), world_size)
        for rank, (expected, got) in enumerate(results):
            ok = isinstance(got, (int, float, torch.Tensor)) and not isinstance(got, bool)
            if ok:
                got = float(got)
                ok = abs(got - expected) <= 1e-9 + 1e-6 * abs(expected)
            if not ok:
                raise fail(
                    MESSAGES("value", rank=rank, got=repr(got)[:60], expected=round(expected, 6)),
                    case,
                )
        yield case


# --- 09.safe_all_reduce --------------------------------------------------------------


def _safe_case(rank: int, fn: Callable, shapes: list[tuple], dtypes: list[str], seed: int) -> tuple:
    oracle_group = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(seed + rank)
    tensor = torch.randn(shapes[rank], generator=gen).to(getattr(torch, dtypes[rank]))
    expected = None
    if len(set(shapes)) == 1 and len(set(dtypes)) == 1:
        expected = tensor.clone()
        dist.all_reduce(expected, group=oracle_group)  # the oracle
    try:
        fn(tensor)
        outcome = ("returned", "", tensor, expected)
    except Exception as exc:  # noqa: BLE001  # what the learner raised is the result
        if isinstance(exc, NotImplementedError):
            raise
        outcome = ("raised", type(exc).__name__, None, expected)
    dist.barrier(group=oracle_group)  # see _accuracy_case
    return outcome


@checker("09.safe_all_reduce", points=3)
def check_safe_all_reduce(rng: random.Random, safe_all_reduce: Callable) -> Iterator[object]:
    # Every kind of mismatch each time: a check of numel only, or of the shape only,
    # must meet the case it misses.
    kinds = ["same", *rng.sample(["shape", "ndim", "dtype"], 3)]
    yield len(kinds)
    for kind in kinds:
        world_size = rng.choice([2, 3, 4])
        shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 2)))
        shapes, dtypes = [shape] * world_size, ["float32"] * world_size
        odd = rng.randrange(world_size)  # the rank that differs
        if kind == "shape":
            shapes[odd] = shape[:-1] + (shape[-1] + rng.randint(1, 3),)
        elif kind == "ndim":
            shapes[odd] = shape + (1,)
        elif kind == "dtype":
            dtypes[odd] = "float64"
        case = f"world_size={world_size}, {kind}"
        results = _spawn(
            _safe_case, (safe_all_reduce, shapes, dtypes, rng.randrange(10**6)), world_size
        )
        for rank, (what, error, tensor, expected) in enumerate(results):
            if kind == "same":
                if what == "raised":
                    raise fail(MESSAGES("crash", rank=rank, error=error), case)
                if not torch.allclose(tensor, expected, rtol=1e-5, atol=1e-5):
                    raise fail(
                        MESSAGES(
                            "tensor",
                            rank=rank,
                            got=tensor.flatten()[:3].tolist(),
                            expected=expected.flatten()[:3].tolist(),
                        ),
                        case,
                    )
            elif what != "raised" or error != "ValueError":
                did = MESSAGES(f"did_{what}", error=error)
                raise fail(MESSAGES("no_raise", rank=rank, did=did), case)
        yield case
