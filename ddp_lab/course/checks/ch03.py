"""Checkers of chapter 03's exercises: balanced chunk sizes, and gather with its backward.

Oracles: ``torch.chunk`` for the default split, and for gather the single-device
``torch.cat`` with autograd (values and gradients).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ddp_lab.course.grading import checker, fail, mismatch


def _torch_chunk_sizes(batch: int, n: int) -> list[int]:
    """The rows per device of DataParallel's default scatter, taken from torch.chunk."""
    sizes = [c.shape[0] for c in torch.arange(batch).chunk(n)]
    return sizes + [0] * (n - len(sizes))


def _expected_balanced(batch: int, n: int, gpu0: int) -> list[int]:
    even = _torch_chunk_sizes(batch, n)
    if n == 1 or gpu0 >= even[0]:
        return even
    base, extra = divmod(batch - gpu0, n - 1)
    return [gpu0] + [base + (1 if i < extra else 0) for i in range(n - 1)]


def _notes_rule(batch: int, n: int, gpu0: int) -> list[int]:
    """The source notes' rule, which falls back to torch.chunk too eagerly."""
    unit = (batch - gpu0) // (n - 1)
    if gpu0 >= unit:
        return _torch_chunk_sizes(batch, n)
    sizes = [gpu0] + [unit] * (n - 1)
    for i in range(batch - sum(sizes)):
        sizes[i + 1] += 1
    return sizes


def _capped_case(rng: random.Random) -> tuple[int, int, int]:
    """A case where the notes' rule gives device 0 more than gpu0_bsz rows."""
    while True:
        n = rng.randint(3, 6)
        batch = rng.randint(n + 1, 12 * n)
        gpu0 = rng.randint(1, batch // n)
        if _notes_rule(batch, n, gpu0) != _expected_balanced(batch, n, gpu0):
            return batch, n, gpu0


def _balanced_cases(rng: random.Random) -> list[tuple[str, int, int, int]]:
    n = rng.randint(3, 6)
    return [
        ("uneven remainder", n * rng.randint(4, 9) + rng.randint(1, n - 1), n, 2),
        ("two devices", rng.randint(20, 40), 2, rng.randint(3, 9)),
        ("gpu0_bsz = 0", rng.randint(7, 30), rng.randint(2, 5), 0),
        ("gpu0_bsz above the even share", rng.randint(10, 20), 4, rng.randint(6, 25)),
        ("device 0 capped below torch.chunk's share", *_capped_case(rng)),
        (
            "batch smaller than the device count",
            rng.randint(2, 4),
            rng.randint(5, 7),
            rng.randint(0, 1),
        ),
        ("one device", rng.randint(3, 9), 1, 1),
        ("large batch", rng.randint(100, 300), rng.randint(2, 8), rng.randint(1, 12)),
    ]


@checker("03.balanced_chunks", points=2)
def check_balanced_chunks(rng: random.Random, balanced_chunk_sizes: Callable) -> Iterator[Any]:
    cases = _balanced_cases(rng)
    yield len(cases)
    for label, batch, n, gpu0 in cases:
        got = balanced_chunk_sizes(batch, n, gpu0)
        expected = _expected_balanced(batch, n, gpu0)
        if not isinstance(got, (list, tuple)) or [int(s) for s in got] != expected:
            raise fail(mismatch(expected, got).args[0], label)
        yield label


def _gather_cases(rng: random.Random) -> list[tuple[str, int, list[int], int]]:
    """(label, dim, sizes along dim, other dimension's size)."""

    def sizes(n: int, uneven: bool) -> list[int]:
        if not uneven:
            return [rng.randint(1, 4)] * n
        s = [rng.randint(1, 5) for _ in range(n)]
        if len(set(s)) == 1:
            s[-1] += 1
        return s

    return [
        ("even chunks, dim 0", 0, sizes(rng.randint(2, 4), False), rng.randint(2, 5)),
        ("uneven chunks, dim 0", 0, sizes(rng.randint(2, 4), True), rng.randint(2, 5)),
        ("uneven chunks, dim 1", 1, sizes(rng.randint(2, 4), True), rng.randint(2, 5)),
        ("a one-row chunk", 0, [rng.randint(2, 4), 1], rng.randint(2, 5)),
        ("more devices", rng.randint(0, 1), sizes(rng.randint(5, 6), True), 3),
    ]


def _run_gather_case(
    gather_cls: Any, dim: int, sizes: list[int], other: int, gen: torch.Generator
) -> str:
    def shape(s: int) -> tuple[int, int]:
        return (s, other) if dim == 0 else (other, s)

    parts = [torch.randn(*shape(s), dtype=torch.float64, generator=gen) for s in sizes]
    weight = torch.randn(*shape(sum(sizes)), dtype=torch.float64, generator=gen)
    leaves = [p.clone().requires_grad_() for p in parts]
    for i, leaf in enumerate(leaves):
        leaf._sim_device = i  # replica i's output lives on simulated device i
    out = gather_cls.apply(0, dim, *leaves)
    oracle_leaves = [p.clone().requires_grad_() for p in parts]
    expected = torch.cat(oracle_leaves, dim)  # the oracle: one device, torch's autograd
    if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return f"output shape: expected {tuple(expected.shape)}, got {got}"
    if not torch.allclose(out, expected):
        return "output values differ from torch.cat"
    if type(out.grad_fn).__name__ != f"{gather_cls.__name__}Backward":
        return "the output was not made by your Function, so its backward is never used"
    (out * weight).sum().backward()
    (expected * weight).sum().backward()
    for i, (leaf, ref) in enumerate(zip(leaves, oracle_leaves, strict=True)):
        if leaf.grad is None:
            return f"input {i} got no gradient"
        if leaf.grad.shape != ref.grad.shape:
            return (
                f"gradient of input {i}: shape {tuple(leaf.grad.shape)}, "
                f"expected {tuple(ref.grad.shape)}"
            )
        if not torch.allclose(leaf.grad, ref.grad):
            return f"gradient of input {i} differs from single-device autograd"
    return ""


@checker("03.gather", points=3)
def check_gather(rng: random.Random, gather_cls: Any) -> Iterator[Any]:
    cases = _gather_cases(rng)
    yield len(cases)
    for label, dim, sizes, other in cases:
        gen = torch.Generator().manual_seed(rng.randrange(10**6))
        problem = _run_gather_case(gather_cls, dim, sizes, other, gen)
        if problem:
            raise fail(problem, label)
        yield label
