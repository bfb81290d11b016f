"""Checkers of chapter 09: fix a hanging evaluation; an all-reduce that fails together.

Both run the learner's function on hidden world sizes on the learner's ranks with a
timeout, so a hang is reported as a failed case instead of blocking the notebook. Rank r
receives only its own counts or its own tensor (``learner.ranks``; when graded, a sandbox per
rank, ``course.grading.rankhost``): a right global accuracy, or a ValueError on every rank when one
rank's tensor differs, proves that the ranks communicated. The probes
(``probe_accuracy``, ``probe_safe``) run in the learner's rank: each rank calls their
function, then waits in a barrier on a group of its own (created before their code runs), as
a training loop would wait in its next collective, so a rank left stuck in their code is a
real hang; they return what came out (a number, a tensor, the name of what was raised) as
data. The oracle runs in the checker: the global accuracy from the counts, and
``dist.all_reduce`` in ranks of the checker's own; the checker compares.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.learner import LearnerError
from ddp_lab.i18n import N_, _t, lookup

# Seconds one hidden case may run before it counts as a hang (a correct one takes < 1 s).
HANG_TIMEOUT_S = 20.0

MESSAGES = {
    "did_returned": N_("returned normally"),
    "did_raised": N_("raised {error}"),
    "case_same": N_("world_size={world_size}, same"),
    "case_shape": N_("world_size={world_size}, shape"),
    "case_ndim": N_("world_size={world_size}, ndim"),
    "case_dtype": N_("world_size={world_size}, dtype"),
    "case_dtype16": N_("world_size={world_size}, 16-bit dtypes"),
    "case_both_ways": N_("world_size={world_size}, one shape larger and one smaller"),
}


DTYPES = {
    "float32": torch.float32,
    "int32": torch.int32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _run(learner: Any, probe: Any, inputs: list, case: str) -> list:
    """Run a probe on the learner's ranks, rank r with only ``inputs[r]``; a hang or a crash
    becomes a CaseFailed."""
    world_size = len(inputs)
    try:
        got = learner.ranks(probe, inputs, timeout=HANG_TIMEOUT_S)
    except LearnerError as exc:
        if exc.not_implemented:
            raise
        if exc.timed_out:
            raise fail(
                _t("it hangs: some rank waits in a collective that another rank never calls"), case
            ) from None
        if exc.type_name == "RankFailed" and exc.message:  # killed, or exited: the reason
            raise fail(exc.message, case) from None
        error = f"{exc.type_name}: {exc.message}" if exc.message else exc.type_name
        raise fail(_t("a rank raised {error}", error=error), case) from None
    if not isinstance(got, list) or len(got) != world_size:
        raise fail(
            _t(
                "rank {rank}: the result could not be read (the checker's probe was changed?)",
                rank="?",
            ),
            case,
        )
    return got


# --- 09.global_accuracy --------------------------------------------------------------


def _as_number(value: object) -> Any:
    """A learner's result as data: None, a float, a tensor, or the name of its type."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach()
    if (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and type(value).__name__ != "bool_"
    ):
        # a NumPy scalar too (``np.float32``: a ``numbers.Real``), as a 1-element tensor is
        return float(value)
    return {"kind": type(value).__name__}


def probe_accuracy(rank: int, objects: tuple, counts: list) -> Any:
    """In the learner's rank: their global_accuracy on this rank's counts (correct, total),
    the only ones it receives."""
    (global_accuracy,) = objects
    group = dist.new_group(backend="gloo")  # collective: every rank, before their code
    correct, total = counts
    got = global_accuracy(correct, total)
    # Ranks that are done wait here, as a training loop would wait in its next
    # collective: a rank stuck in the learner's code is then a real hang.
    dist.barrier(group=group)
    return _as_number(got)


def _number(got: Any) -> float | None:
    """The float a rank returned, or None if it is not one number."""
    if type(got) is float:
        return got
    if (
        isinstance(got, torch.Tensor)
        and got.numel() == 1
        and not got.is_complex()
        and got.dtype != torch.bool
    ):
        return float(got)
    return None


def _shown(got: Any) -> str:
    if isinstance(got, dict):
        return f"<{str(got.get('kind', '?'))[:40]}>"
    return repr(got)[:60]


@checker("09.global_accuracy", points=3)
def check_global_accuracy(rng: random.Random, learner: Any) -> Iterator[object]:
    # 2, then 3 and 4 in either order: every seed (a learner's default one too) has both.
    world_sizes = [2, *rng.sample([3, 4], 2)]
    yield len(world_sizes)
    for world_size in world_sizes:
        # Unequal totals (like a short last shard): the mean of the ranks' accuracies
        # differs from the global accuracy.
        counts = []
        for _ in range(world_size):
            total = rng.randint(5, 200)
            counts.append((rng.randint(0, total), total))
        case = running(f"world_size={world_size}")
        both = torch.tensor(counts, dtype=torch.float64).sum(dim=0)  # the oracle
        expected = (both[0] / both[1]).item()
        results = _run(learner, probe_accuracy, [list(c) for c in counts], case)
        for rank, got in enumerate(results):
            value = _number(got)
            if value is None or not abs(value - expected) <= 1e-9 + 1e-6 * abs(expected):
                raise fail(
                    _t(
                        "rank {rank} returned {got}, expected {expected}",
                        rank=rank,
                        got=_shown(got),
                        expected=round(expected, 6),
                    ),
                    case,
                )
        yield case


# --- 09.safe_all_reduce --------------------------------------------------------------


def _input(rank: int, shapes: list, dtypes: list[str], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + rank)
    return torch.randn(tuple(shapes[rank]), generator=gen).to(DTYPES[dtypes[rank]])


def safe_cases(rng: random.Random) -> list[tuple[str, list[tuple[int, ...]], list[str], int]]:
    """The hidden cases of 09.safe_all_reduce: (kind, each rank's shape, each rank's dtype,
    the data's seed), in an order drawn from ``rng``. A pure function of ``rng``, and every
    kind under every seed, so that a check that misses one kind of mismatch fails whatever
    the seed:

    - ``same``: nothing differs; the sum must equal ``dist.all_reduce``'s;
    - ``shape``: one rank's dimensions in another order ((2, 3, 4) vs (3, 4, 2)): the same
      numel, ndim and element size;
    - ``ndim``: one rank's shape with a trailing 1: the same numel;
    - ``dtype``: float32 vs int32, and ``dtype16``: bfloat16 vs float16: the same element size
      (and, for the second, both floating point);
    - ``both_ways`` (3 or 4 ranks): one rank's dimension larger, another's smaller by as
      much, so that a sum or a mean of the ranks' shapes (or numels) equals the shape of a
      rank that did not change: that rank alone would think all agree.
    """
    cases = []
    for kind in ("same", "shape", "ndim", "dtype", "dtype16", "both_ways"):
        world = rng.choice([3, 4] if kind == "both_ways" else [2, 3, 4])
        if kind == "shape":  # distinct sizes, rotated: every dimension changes
            shape = tuple(rng.sample(range(2, 6), rng.choice([2, 3])))
        else:
            shape = tuple(rng.randint(2, 5) for _ in range(rng.randint(1, 2)))
        base = {"dtype16": "bfloat16"}.get(kind, "float32")
        shapes, dtypes = [shape] * world, [base] * world
        odd = rng.randrange(world)  # the rank that differs
        if kind == "shape":
            shapes[odd] = shape[1:] + shape[:1]
        elif kind == "ndim":
            shapes[odd] = shape + (1,)
        elif kind == "dtype":
            dtypes[odd] = "int32"
        elif kind == "dtype16":
            dtypes[odd] = "float16"
        elif kind == "both_ways":
            dim, step = rng.randrange(len(shape)), rng.randint(1, shape[-1] - 1)
            dim = len(shape) - 1 if shape[dim] <= step else dim
            other = rng.choice([r for r in range(world) if r != odd])
            for rank, sign in ((odd, 1), (other, -1)):
                bigger = list(shape)
                bigger[dim] += sign * step
                shapes[rank] = tuple(bigger)
        cases.append((kind, shapes, dtypes, rng.randrange(10**6)))
    # In an order of the seed's: the ranks serve the cases one after the other, so in a fixed
    # order a rank that counts its calls would know which case wants the sum.
    rng.shuffle(cases)
    return cases


def probe_safe(rank: int, objects: tuple, mine: torch.Tensor) -> dict:
    """In the learner's rank: their safe_all_reduce on this rank's tensor (the only one it
    receives: its shape and dtype say nothing of the others'); the tensor after it, or the
    name of the exception it raised."""
    (safe_all_reduce,) = objects
    group = dist.new_group(backend="gloo")
    tensor = mine.clone()
    try:
        safe_all_reduce(tensor)
        outcome = {"what": "returned", "error": "", "tensor": tensor.detach()}
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001  # what the learner raised is the result
        # a subclass of ValueError is a ValueError (``class MismatchError(ValueError)``)
        name = "ValueError" if isinstance(exc, ValueError) else type(exc).__name__
        outcome = {"what": "raised", "error": name}
    dist.barrier(group=group)  # see probe_accuracy
    return outcome


def _oracle_safe(rank: int, shapes: list, dtypes: list[str], seed: int) -> torch.Tensor:
    """In the checker's ranks: torch's own all-reduce of the same tensors."""
    tensor = _input(rank, shapes, dtypes, seed)
    dist.all_reduce(tensor)
    return tensor


@checker("09.safe_all_reduce", points=3)
def check_safe_all_reduce(rng: random.Random, learner: Any) -> Iterator[object]:
    from ddp_lab.runtime.launcher import spawn

    cases = safe_cases(rng)
    yield len(cases)
    for kind, shapes, dtypes, data_seed in cases:
        world_size = len(shapes)
        case = running(lookup(MESSAGES, f"case_{kind}", world_size=world_size))
        data = (shapes, dtypes, data_seed)
        expected = None
        if kind == "same":
            expected = spawn(_oracle_safe, args=data, nprocs=world_size, backend="gloo", quiet=True)
        inputs = [_input(r, *data) for r in range(world_size)]
        results = _run(learner, probe_safe, inputs, case)
        for rank, outcome in enumerate(results):
            what = outcome.get("what") if isinstance(outcome, dict) else None
            error = outcome.get("error") if isinstance(outcome, dict) else None
            if what not in ("returned", "raised") or not isinstance(error, str):
                raise fail(
                    _t(
                        "rank {rank}: the result could not be read (the checker's probe was "
                        "changed?)",
                        rank=rank,
                    ),
                    case,
                )
            error = error[:60]
            if expected is not None:
                if what == "raised":
                    raise fail(_t("rank {rank} raised {error}", rank=rank, error=error), case)
                tensor, want = outcome.get("tensor"), expected[rank]
                if (
                    not isinstance(tensor, torch.Tensor)
                    or tensor.shape != want.shape
                    or tensor.dtype != want.dtype
                ):
                    raise fail(
                        _t(
                            "rank {rank}: the result could not be read (the checker's probe was "
                            "changed?)",
                            rank=rank,
                        ),
                        case,
                    )
                if not torch.allclose(tensor, want, rtol=1e-5, atol=1e-5):
                    raise fail(
                        _t(
                            "rank {rank}: the tensor holds {got}, expected the sum over ranks "
                            "{expected}",
                            rank=rank,
                            got=tensor.flatten()[:3].tolist(),
                            expected=want.flatten()[:3].tolist(),
                        ),
                        case,
                    )
            elif what != "raised" or error != "ValueError":
                did = lookup(MESSAGES, f"did_{what}", error=error)
                raise fail(
                    _t(
                        "rank {rank} did not raise ValueError (it {did}); shapes or dtypes "
                        "differ across ranks, so every rank must raise it",
                        rank=rank,
                        did=did,
                    ),
                    case,
                )
        yield case
