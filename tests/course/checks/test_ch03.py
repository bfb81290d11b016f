"""Chapter 03's checkers pass the reference solutions and reject typical wrong ones."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import ddp_lab as dl
from ddp_lab.parallel import balanced_chunk_sizes


def _grade(grade_id: str, obj: Any) -> bool:
    try:
        dl.grade(grade_id, obj)
    except AssertionError:
        return False
    return True


def notes_rule(batch: int, n: int, gpu0: int) -> list[int]:
    # the source notes' rule: falls back to the default split too eagerly
    unit = (batch - gpu0) // (n - 1) if n > 1 else batch
    if gpu0 >= unit:
        sizes = [c.shape[0] for c in torch.arange(batch).chunk(n)]
        return sizes + [0] * (n - len(sizes))
    sizes = [gpu0] + [unit] * (n - 1)
    for i in range(batch - sum(sizes)):
        sizes[i + 1] += 1
    return sizes


def no_remainder(batch: int, n: int, gpu0: int) -> list[int]:
    sizes = balanced_chunk_sizes(batch, n, gpu0)
    return sizes if sizes[0] != gpu0 else [gpu0] + [(batch - gpu0) // (n - 1)] * (n - 1)


def remainder_on_last(batch: int, n: int, gpu0: int) -> list[int]:
    sizes = balanced_chunk_sizes(batch, n, gpu0)
    return sizes if sizes[0] != gpu0 or n == 1 else [sizes[0], *sorted(sizes[1:])]


def always_cap(batch: int, n: int, gpu0: int) -> list[int]:
    if n == 1:
        return [batch]
    base, extra = divmod(batch - min(gpu0, batch), n - 1)
    return [min(gpu0, batch)] + [base + (i < extra) for i in range(n - 1)]


def even_split(batch: int, n: int, gpu0: int) -> list[int]:
    size = math.ceil(batch / n)
    return [size] * (n - 1) + [batch - size * (n - 1)]


def test_balanced_reference_passes() -> None:
    assert _grade("03.balanced_chunks", balanced_chunk_sizes)


@pytest.mark.parametrize(
    "wrong", [notes_rule, no_remainder, remainder_on_last, always_cap, even_split]
)
def test_balanced_rejects(wrong: Any) -> None:
    assert not _grade("03.balanced_chunks", wrong)


def test_balanced_not_implemented_fails(capsys: pytest.CaptureFixture) -> None:
    def stub(batch: int, n: int, gpu0: int) -> list[int]:
        raise NotImplementedError("your code here")

    assert not _grade("03.balanced_chunks", stub)
    assert "03.balanced_chunks" in capsys.readouterr().out


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, target_device: int, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.sizes = dim, [t.size(dim) for t in inputs]
        return torch.cat(inputs, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return (None, None, *grad.split(ctx.sizes, ctx.dim))


class EvenSplit(Gather):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return (None, None, *grad.chunk(len(ctx.sizes), ctx.dim))


class AlwaysDim0(Gather):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return (None, None, *grad.split(ctx.sizes, 0))


class NoNones(Gather):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return tuple(grad.split(ctx.sizes, ctx.dim))


class Averaged(Gather):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return (None, None, *(g / len(ctx.sizes) for g in grad.split(ctx.sizes, ctx.dim)))


class Stacked(Gather):
    @staticmethod
    def forward(ctx: Any, target_device: int, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.sizes = dim, [t.size(dim) for t in inputs]
        return torch.stack(inputs, dim)


class PlainCat:
    """Not a Function: torch.cat's own backward would do the work."""

    @staticmethod
    def apply(target_device: int, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.cat(inputs, dim)


def test_gather_reference_passes() -> None:
    assert _grade("03.gather", Gather)


@pytest.mark.parametrize("wrong", [EvenSplit, AlwaysDim0, NoNones, Averaged, Stacked, PlainCat])
def test_gather_rejects(wrong: Any) -> None:
    assert not _grade("03.gather", wrong)


def test_package_gather_passes() -> None:
    from ddp_lab.parallel import Gather as PackageGather

    assert _grade("03.gather", PackageGather)
