"""Checkers of chapter 03's exercises: balanced chunk sizes, and gather with its backward.

Oracles: ``torch.chunk`` for the default split, and for gather the single-device
``torch.cat`` with autograd (values and gradients), computed in the checker. The probes
(``probes.probe_balanced``, ``probe_gather_forward``, ``probe_gather_backward``) only call the
learner's code, in a rank of its own that receives one case only (``learner.ranks``; this
module, which computes the answers, is hidden there), and return what came out as data.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.probes import (
    one,
    probe_balanced,
    probe_gather_backward,
    probe_gather_forward,
)
from ddp_lab.i18n import N_, _t, lookup

MESSAGES = {
    "case_uneven_remainder": N_("uneven remainder"),
    "case_two_devices": N_("two devices"),
    "case_gpu0_zero": N_("gpu0_bsz = 0"),
    "case_gpu0_above": N_("gpu0_bsz above the even share"),
    "case_capped": N_("device 0 capped below torch.chunk's share"),
    "case_small_batch": N_("batch smaller than the device count"),
    "case_one_device": N_("one device"),
    "case_large_batch": N_("large batch"),
    "case_even_dim0": N_("even chunks, dim 0"),
    "case_uneven_dim0": N_("uneven chunks, dim 0"),
    "case_uneven_dim1": N_("uneven chunks, dim 1"),
    "case_one_row": N_("a one-row chunk"),
    "case_more_devices": N_("more devices"),
}


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


def _array_split_sizes(batch: int, n: int) -> list[int]:
    """numpy.array_split's sizes: the remainder spread one row each (not torch.chunk's)."""
    base, extra = divmod(batch, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _default_split_case(rng: random.Random) -> tuple[int, int, int]:
    """gpu0_bsz at or above the even share, on a batch where torch.chunk's split differs
    from array_split's: the default split must be torch.chunk's, padded to n devices."""
    n = rng.randint(4, 6)
    batch = rng.choice(
        [b for b in range(n + 1, 5 * n) if _torch_chunk_sizes(b, n) != _array_split_sizes(b, n)]
    )
    share = _torch_chunk_sizes(batch, n)[0]
    return batch, n, rng.randint(share, share + 10)


def _balanced_cases(rng: random.Random) -> list[tuple[str, int, int, int]]:
    n = rng.randint(3, 6)
    return [
        ("uneven_remainder", n * rng.randint(4, 9) + rng.randint(1, n - 1), n, 2),
        ("two_devices", rng.randint(20, 40), 2, rng.randint(3, 9)),
        ("gpu0_zero", rng.randint(7, 30), rng.randint(2, 5), 0),
        ("gpu0_above", *_default_split_case(rng)),
        ("capped", *_capped_case(rng)),
        # gpu0_bsz 1 is the even share here: torch.chunk's split, padded with zeros
        ("small_batch", rng.randint(2, 4), rng.randint(5, 7), 1),
        ("one_device", rng.randint(3, 9), 1, 1),
        ("large_batch", rng.randint(100, 300), rng.randint(2, 8), rng.randint(1, 12)),
    ]


def _kind(got: object) -> str:
    if isinstance(got, dict) and type(got.get("kind")) is str:
        return got["kind"][:40]
    return type(got).__name__


def _as_sizes(got: object) -> list[int] | None:
    """The sizes as ints when ``got`` is a list of whole numbers, else None."""
    if type(got) is not list:
        return None
    sizes = []
    for x in got:
        if type(x) in (int, bool):
            sizes.append(int(x))
        elif type(x) is float and x.is_integer():
            sizes.append(int(x))
        else:
            return None
    return sizes


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@checker("03.balanced_chunks", points=2)
def check_balanced_chunks(rng: random.Random, learner: Any) -> Iterator[Any]:
    cases = _balanced_cases(rng)
    yield len(cases)
    for key, batch, n, gpu0 in cases:
        case = running(lookup(MESSAGES, f"case_{key}"))
        expected = _expected_balanced(batch, n, gpu0)
        got = one(learner.ranks(probe_balanced, [[batch, n, gpu0]], timeout=30))
        sizes = _as_sizes(got)
        if sizes is None:
            bad = next((x for x in got if isinstance(x, dict)), got) if type(got) is list else got
            raise fail(
                _t("return a list of ints (rows per device), not {kind}", kind=_kind(bad)), case
            )
        if sizes != expected:
            raise fail(
                # the call itself, so that the learner can run it in the notebook
                _t(
                    "balanced_chunk_sizes({batch}, {n}, {gpu0}): expected {expected}, got {got}",
                    batch=batch,
                    n=n,
                    gpu0=gpu0,
                    expected=_short(expected),
                    got=_short(got),
                ),
                case,
            )
        yield case


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
        ("even_dim0", 0, sizes(rng.randint(2, 4), False), rng.randint(2, 5)),
        ("uneven_dim0", 0, sizes(rng.randint(2, 4), True), rng.randint(2, 5)),
        ("uneven_dim1", 1, sizes(rng.randint(2, 4), True), rng.randint(2, 5)),
        ("one_row", 0, [rng.randint(2, 4), 1], rng.randint(2, 5)),
        ("more_devices", rng.randint(0, 1), sizes(rng.randint(5, 6), True), 3),
    ]


def _made_by_function(record: dict) -> bool:
    """Whether the probe saw the output's grad_fn be the learner's Function's backward."""
    name = record.get("function")
    return type(name) is str and bool(name) and record.get("grad_fn") == f"{name}Backward"


def _gather_problem(
    learner: Any, dim: int, sizes: list[int], other: int, gen: torch.Generator
) -> str:
    """What is wrong with the learner's gather on one case ("" when nothing)."""

    def shape(s: int) -> tuple[int, int]:
        return (s, other) if dim == 0 else (other, s)

    parts = [torch.randn(*shape(s), dtype=torch.float64, generator=gen) for s in sizes]
    weight = torch.randn(*shape(sum(sizes)), dtype=torch.float64, generator=gen)
    oracle_leaves = [p.clone().requires_grad_() for p in parts]
    expected = torch.cat(oracle_leaves, dim)  # the oracle: one device, torch's autograd
    (expected * weight).sum().backward()
    want_out = expected.detach()

    fwd = one(learner.ranks(probe_gather_forward, [[dim, parts]], timeout=30))
    out = fwd.get("out") if type(fwd) is dict else None
    if not isinstance(out, torch.Tensor):
        return _t("apply(...) returned {kind}, not a tensor", kind=_kind(fwd))
    if out.shape != want_out.shape:
        return _t(
            "output shape: expected {expected}, got {got}",
            expected=tuple(want_out.shape),
            got=tuple(out.shape),
        )
    if out.is_complex() or not torch.allclose(out.to(want_out.dtype), want_out):
        return _t("output values differ from torch.cat")
    if not _made_by_function(fwd):
        return _t("the output was not made by your Function, so its backward is never used")
    back = one(learner.ranks(probe_gather_backward, [[dim, parts, weight]], timeout=30))
    if type(back) is dict and "grads" in back and not _made_by_function(back):
        return _t("the output was not made by your Function, so its backward is never used")
    grads = back.get("grads") if type(back) is dict and "grads" in back else back
    if type(grads) is not list or len(grads) != len(parts):
        return _t("backward gave {kind} instead of one gradient per input", kind=_kind(grads))
    for i, (grad, ref) in enumerate(zip(grads, oracle_leaves, strict=True)):
        if grad is None:
            return _t("input {index} got no gradient", index=i)
        if not isinstance(grad, torch.Tensor):
            return _t("backward gave {kind} instead of one gradient per input", kind=_kind(grad))
        if grad.shape != ref.grad.shape:
            return _t(
                "gradient of input {index}: shape {got}, expected {expected}",
                index=i,
                got=tuple(grad.shape),
                expected=tuple(ref.grad.shape),
            )
        if grad.is_complex() or not torch.allclose(grad.to(ref.grad.dtype), ref.grad):
            return _t("gradient of input {index} differs from single-device autograd", index=i)
    return ""


@checker("03.gather", points=3)
def check_gather(rng: random.Random, learner: Any) -> Iterator[Any]:
    cases = _gather_cases(rng)
    yield len(cases)
    for key, dim, sizes, other in cases:
        case = running(lookup(MESSAGES, f"case_{key}"))
        gen = torch.Generator().manual_seed(rng.randrange(10**6))
        problem = _gather_problem(learner, dim, sizes, other, gen)
        if problem:
            raise fail(problem, case)
        yield case
