"""Checker of chapter 00's exercise: average a per-rank tensor across ranks."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from ddp_lab.course.grading import checker, fail, mismatch


def _run_case(rank: int, fn: Callable, shape: tuple, dtype: torch.dtype, seed: int) -> str:
    """On each rank: the learner's average vs the oracle built on dist.all_reduce."""
    gen = torch.Generator().manual_seed(seed + rank)
    value = torch.randn(shape, generator=gen).to(dtype)
    original = value.clone()
    got = fn(value.clone())
    expected = original.clone()
    dist.all_reduce(expected, op=dist.ReduceOp.SUM)  # the oracle: torch's own all-reduce
    expected /= dist.get_world_size()
    if not isinstance(got, torch.Tensor):
        return f"type: {type(got).__name__}"
    if got.shape != expected.shape:
        return f"shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}"
    if not torch.allclose(got.to(expected.dtype), expected, rtol=1e-5, atol=1e-6):
        return (
            f"values: expected {expected.flatten()[:3].tolist()}, got {got.flatten()[:3].tolist()}"
        )
    return ""


@checker("00.average", points=2)
def check_average(rng: random.Random, average_across_ranks: Callable) -> Iterator[object]:
    from ddp_lab import spawn

    world_sizes = [2, rng.choice([3, 4]), rng.choice([2, 3, 4])]
    yield len(world_sizes)
    for world_size in world_sizes:
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 2)))
        dtype = rng.choice([torch.float32, torch.float64])
        case = f"world_size={world_size}, dtype={str(dtype).replace('torch.', '')}"
        results = spawn(
            _run_case,
            args=(average_across_ranks, shape, dtype, rng.randrange(10**6)),
            nprocs=world_size,
            backend="gloo",
            quiet=True,
            timeout=60,
        )
        for rank, problem in enumerate(results):
            if problem:
                raise fail(mismatch("the mean over ranks", f"rank {rank}: {problem}").args[0], case)
        yield case
