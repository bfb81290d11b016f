"""Checker of chapter 00's exercise: average a per-rank tensor across ranks.

How a checker is built (the model for every chapter):
- a *probe* (``probe_average``) is the only code that touches the learner's objects: it runs
  where the learner's code runs (their kernel, or one grading sandbox per rank), calls their
  function on the one rank's input it is given (``learner.ranks``: rank r receives only
  ``values[r]``, so a right mean proves the ranks communicated) and returns what came out,
  as data;
- the checker (``check_average``) draws the hidden cases, computes the oracle with real
  PyTorch in one process (the mean of all ranks' tensors: what ``dist.all_reduce`` and a
  division leave on every rank; one process is enough, as CS336 checks DDP against one
  process), asks the learner handle to run the probe, and compares. It never sees the
  learner's objects.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch

from ddp_lab.course.grading import checker, fail
from ddp_lab.i18n import _t


def probe_average(rank: int, objects: tuple, mine: torch.Tensor) -> Any:
    """In the learner's rank (a sandbox of its own when graded): their function on this rank's
    tensor, the only input this rank receives."""
    (average_across_ranks,) = objects
    out = average_across_ranks(mine.clone())
    return out.detach() if isinstance(out, torch.Tensor) else {"kind": type(out).__name__}


def _oracle(values: list[torch.Tensor]) -> torch.Tensor:
    """The mean over ranks, in one process: what ``all_reduce(SUM)`` then ``/ world_size``
    leaves on every rank (the sum's order may differ from gloo's: compared with a tolerance)."""
    return torch.stack(values).sum(dim=0) / len(values)


def _head(t: torch.Tensor) -> list:
    return [round(float(x), 4) for x in t.flatten()[:3]]


@checker("00.average", points=2)
def check_average(rng: random.Random, learner: Any) -> Iterator[object]:
    world_sizes = [2, rng.choice([3, 4]), rng.choice([2, 3, 4])]
    yield len(world_sizes)
    for world_size in world_sizes:
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 2)))
        dtype = rng.choice([torch.float32, torch.float64])
        case = f"world_size={world_size}, dtype={str(dtype).replace('torch.', '')}"
        gen = torch.Generator().manual_seed(rng.randrange(10**6))
        values = [torch.randn(shape, generator=gen).to(dtype) for _ in range(world_size)]
        mean = _oracle(values)
        expected = [mean] * world_size
        got = learner.ranks(probe_average, values, timeout=60)
        for rank, (out, want) in enumerate(zip(got, expected, strict=True)):
            if not isinstance(out, torch.Tensor):
                raise fail(
                    _t(
                        "rank {rank} returned {kind}, not a tensor",
                        rank=rank,
                        kind=out.get("kind", "?"),
                    ),
                    case,
                )
            if out.shape != want.shape:
                raise fail(
                    _t(
                        "rank {rank} returned shape {got}; the mean over ranks has shape "
                        "{expected}",
                        rank=rank,
                        got=tuple(out.shape),
                        expected=tuple(want.shape),
                    ),
                    case,
                )
            if not torch.allclose(out.to(want.dtype), want, rtol=1e-5, atol=1e-6):
                raise fail(
                    _t(
                        "rank {rank} returned {got}, but the mean over ranks is {expected}",
                        rank=rank,
                        got=_head(out),
                        expected=_head(want),
                    ),
                    case,
                )
        yield case
