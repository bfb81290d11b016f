"""Chapter 03's checkers, through a learner handle: the reference solutions pass, typical wrong
ones fail with feedback, and results that are not data fail cleanly."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
import torch
from cheats import EqualsAnyList, EqualsAnything, verdict

import ddp_lab as dl
from ddp_lab.parallel import balanced_chunk_sizes


def _verdict(grade_id: str, obj: Any) -> tuple[bool, str]:
    return verdict(grade_id, obj)


def _grade(grade_id: str, obj: Any) -> bool:
    return _verdict(grade_id, obj)[0]


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


def array_split_default(batch: int, n: int, gpu0: int) -> list[int]:
    # the default split spread one row each (numpy.array_split), not torch.chunk's
    sizes = balanced_chunk_sizes(batch, n, gpu0)
    base, extra = divmod(batch, n)
    even = [base + (1 if i < extra else 0) for i in range(n)]
    torch_even = [c.shape[0] for c in torch.arange(batch).chunk(n)]
    return even if sizes == torch_even + [0] * (n - len(torch_even)) else sizes


def unpadded_default(batch: int, n: int, gpu0: int) -> list[int]:
    # torch.chunk's split without the zeros for devices that get no rows
    torch_even = [c.shape[0] for c in torch.arange(batch).chunk(n)]
    default = n == 1 or gpu0 >= torch_even[0]
    return torch_even if default else balanced_chunk_sizes(batch, n, gpu0)


WRONG_BALANCED = [
    notes_rule,
    no_remainder,
    remainder_on_last,
    always_cap,
    even_split,
    array_split_default,
    unpadded_default,
]


@pytest.mark.parametrize("wrong", WRONG_BALANCED)
def test_every_seed_tells_each_wrong_split_apart(wrong: Any) -> None:
    """Not a lucky seed: under every seed a hidden case separates the rule from the answer."""
    import random

    from ddp_lab.course.grading.checks import ch03

    for seed in range(100):
        cases = ch03._balanced_cases(random.Random(seed))
        assert any(wrong(*c) != ch03._expected_balanced(*c) for _, *c in cases), seed


def test_balanced_reference_passes() -> None:
    assert _grade("03.balanced_chunks", balanced_chunk_sizes)


def as_tensor(batch: int, n: int, gpu0: int) -> Any:
    return torch.tensor(balanced_chunk_sizes(batch, n, gpu0))


@pytest.mark.parametrize("wrong", WRONG_BALANCED)
def test_balanced_rejects(wrong: Any) -> None:
    passed, line = _verdict("03.balanced_chunks", wrong)
    assert not passed
    assert "FAIL 03.balanced_chunks" in line and "expected [" in line


def test_balanced_wants_a_list(capsys: pytest.CaptureFixture) -> None:
    passed, line = _verdict("03.balanced_chunks", as_tensor)
    assert not passed and "return a list of ints" in line and "not Tensor" in line
    passed, _ = _verdict("03.balanced_chunks", lambda *a: list(as_tensor(*a)))
    assert passed  # elements may be 0-d tensors, as before


def test_balanced_not_implemented_fails(capsys: pytest.CaptureFixture) -> None:
    def stub(batch: int, n: int, gpu0: int) -> list[int]:
        raise NotImplementedError("your code here")

    with pytest.raises(AssertionError) as failed:
        dl.grade("03.balanced_chunks", stub)
    # A failing graded cell shows the verdict line as its error, nothing else; the stub's
    # NotImplementedError reads as not attempted (a wrong answer reads FAIL).
    assert str(failed.value).startswith("NOT ATTEMPTED 03.balanced_chunks: 0/2 points")


@pytest.mark.parametrize(
    ("cheat", "feedback"),
    [
        (lambda *a: EqualsAnything(), "not EqualsAnything"),
        (lambda *a: [EqualsAnything()], "not EqualsAnything"),
        (lambda *a: EqualsAnyList([0]), "expected ["),
    ],
)
def test_balanced_result_that_is_not_data_fails_cleanly(cheat: Any, feedback: str) -> None:
    passed, line = _verdict("03.balanced_chunks", cheat)
    assert not passed and feedback in line


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


class Toggling(Gather):
    """Its own Function for the forward probe, torch.cat for the backward probe (told apart by
    the caller's name): its backward is never written, and never runs."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        raise RuntimeError("backward never written")

    @classmethod
    def apply(cls, target_device: int, dim: int, *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        if sys._getframe(1).f_code.co_name == "probe_gather_backward":
            return torch.cat(inputs, dim)
        return super().apply(target_device, dim, *inputs)


class MyGatherBackward:
    """Named as a Function called MyGather's backward node is (review 9)."""


class _Dressed(torch.Tensor):
    @property
    def grad_fn(self) -> Any:  # type: ignore[override]
        return MyGatherBackward()


class MyGather(Gather):
    """A wrong backward (zeros) that never runs: apply returns torch.cat's output dressed as
    a tensor whose grad_fn reads as this Function's."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return (None, None, *(torch.zeros_like(g) for g in grad.split(ctx.sizes, ctx.dim)))

    @classmethod
    def apply(cls, target_device: int, dim: int, *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        return torch.cat(inputs, dim).as_subclass(_Dressed)


class DressedOnly(Gather):
    """torch's apply; the forward returns the dressed tensor (a plain one is what counts)."""

    @staticmethod
    def forward(ctx: Any, target_device: int, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.sizes = dim, [t.size(dim) for t in inputs]
        return torch.cat(inputs, dim).as_subclass(_Dressed)


def test_gather_reference_passes() -> None:
    assert _grade("03.gather", Gather)


@pytest.mark.parametrize(
    ("wrong", "feedback"),
    [
        (EvenSplit, "raised"),  # chunk() gives the wrong sizes: autograd refuses them
        (AlwaysDim0, "raised"),  # split along dim 0 of a dim-1 gradient
        (NoNones, "raised"),
        (Averaged, "differs from single-device autograd"),
        (Stacked, "output shape"),
        (PlainCat, "not made by your Function"),
        (Toggling, "not made by your Function"),
        (MyGather, "not made by your Function"),
        (DressedOnly, "not made by your Function"),
    ],
)
def test_gather_rejects(wrong: Any, feedback: str) -> None:
    passed, line = _verdict("03.gather", wrong)
    assert not passed
    assert "FAIL 03.gather" in line and feedback in line


class EqualsAnythingOut:
    """A Function-like class whose output claims to equal everything."""

    @staticmethod
    def apply(target_device: int, dim: int, *inputs: torch.Tensor) -> Any:
        return EqualsAnything()


class ZerosOut(Gather):
    @staticmethod
    def forward(ctx: Any, target_device: int, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.sizes = dim, [t.size(dim) for t in inputs]
        return torch.zeros(3)


def test_gather_result_that_is_not_data_fails_cleanly() -> None:
    passed, line = _verdict("03.gather", EqualsAnythingOut)
    assert not passed and "returned EqualsAnything, not a tensor" in line
    passed, line = _verdict("03.gather", ZerosOut)
    assert not passed and "output shape" in line


def test_package_gather_passes() -> None:
    from ddp_lab.parallel import Gather as PackageGather

    assert _grade("03.gather", PackageGather)


def test_balanced_failure_names_the_call_that_shows_it() -> None:
    """ "expected [2, 3, 3, 3, 3, 2], got [3, 3, 3, 3, 3, 1]" alone left the learner guessing
    the arguments; the line names the call, and running it reproduces the mismatch."""
    import re

    passed, line = _verdict("03.balanced_chunks", notes_rule)
    assert not passed
    call = re.search(r"balanced_chunk_sizes\((\d+), (\d+), (\d+)\): expected (\[[\d, ]*\])", line)
    assert call, line
    args = tuple(int(a) for a in call.groups()[:3])
    assert call.group(4) == str(balanced_chunk_sizes(*args))
    assert notes_rule(*args) != balanced_chunk_sizes(*args)
