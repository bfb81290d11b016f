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

from ddp_lab.course.grading import checker, fail, running, wrong_form
from ddp_lab.i18n import _t


def probe_average(rank: int, objects: tuple, mine: torch.Tensor) -> Any:
    """In the learner's rank (a sandbox of its own when graded): their function on this rank's
    tensor, the only input this rank receives."""
    (average_across_ranks,) = objects
    out = average_across_ranks(mine.clone())
    return out.detach() if isinstance(out, torch.Tensor) else {"kind": type(out).__name__}


def probe_mean(rank: int, objects: tuple, mine: torch.Tensor) -> dict[str, Any]:
    """``probe_average``, and this rank's tensor as the learner's function left it (the
    caller's tensor: an all-reduce in place writes the sum into it)."""
    (average_across_ranks,) = objects
    given = mine.clone()
    out = average_across_ranks(given)
    return {
        "out": out.detach() if isinstance(out, torch.Tensor) else {"kind": type(out).__name__},
        "after": given.detach(),
    }


def _oracle(values: list[torch.Tensor]) -> torch.Tensor:
    """The mean over ranks, in one process: what ``all_reduce(SUM)`` then ``/ world_size``
    leaves on every rank (the sum's order may differ from gloo's: compared with a tolerance)."""
    return torch.stack(values).sum(dim=0) / len(values)


def _head(t: torch.Tensor) -> list:
    return [round(float(x), 4) for x in t.flatten()[:3]]


@checker("00.average", points=2)
def check_average(rng: random.Random, learner: Any) -> Iterator[object]:
    # 2 ranks first (the quickest failure to read), then 3 and 4 in either order: every seed,
    # the default one a learner checks with included, has an odd world size and one above 2
    # (a divisor written for 2 and 4 fails at home, not only under the instructor's seed).
    world_sizes = [2, *rng.sample([3, 4], 2)]
    # both dtypes under every seed: a result cast to float32 fails on a float64 case
    dtypes = rng.sample(
        [torch.float32, torch.float64, rng.choice([torch.float32, torch.float64])], 3
    )
    yield len(world_sizes)
    for world_size, dtype in zip(world_sizes, dtypes, strict=True):
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 2)))
        case = running(f"world_size={world_size}, dtype={str(dtype).replace('torch.', '')}")
        gen = torch.Generator().manual_seed(rng.randrange(10**6))
        values = [torch.randn(shape, generator=gen).to(dtype) for _ in range(world_size)]
        mean = _oracle(values)
        expected = [mean] * world_size
        got = learner.ranks(probe_mean, values, timeout=60)
        if type(got) is not list or len(got) != world_size:
            raise wrong_form("-", "ranks", type(got).__name__, case)
        for rank, (record, want) in enumerate(zip(got, expected, strict=True)):
            out = record.get("out") if type(record) is dict else None
            after = record.get("after") if type(record) is dict else None
            if not isinstance(out, torch.Tensor):
                kind = out.get("kind") if type(out) is dict else None
                raise fail(
                    _t(
                        "rank {rank} returned {kind}, not a tensor",
                        rank=rank,
                        kind=kind if type(kind) is str else "?",
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
            if out.dtype != want.dtype:
                raise fail(
                    _t(
                        "rank {rank} returned {got}; the mean of {dtype} tensors is {dtype}",
                        rank=rank,
                        got=str(out.dtype).replace("torch.", ""),
                        dtype=str(want.dtype).replace("torch.", ""),
                    ),
                    case,
                )
            # float32 to float32's precision, float64 to float64's (the sum's order differs)
            tol = (1e-5, 1e-6) if want.dtype == torch.float32 else (1e-10, 1e-12)
            if not torch.allclose(out, want, rtol=tol[0], atol=tol[1]):
                raise fail(
                    _t(
                        "rank {rank} returned {got}, but the mean over ranks is {expected}",
                        rank=rank,
                        got=_head(out),
                        expected=_head(want),
                    ),
                    case,
                )
            if not isinstance(after, torch.Tensor) or not torch.equal(after, values[rank]):
                raise fail(
                    _t(
                        "rank {rank}: the caller's tensor changed (dist.all_reduce works in "
                        "place): reduce a copy, value.clone(), and leave the caller's tensor "
                        "as it was",
                        rank=rank,
                    ),
                    case,
                )
        yield case
