"""Checkers of chapter 09 accept the reference solutions and reject typical wrong ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.checks import ch09
from ddp_lab.course.grading.learner import LearnerError, LocalLearner


@pytest.fixture(autouse=True)
def short_hang_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch09, "HANG_TIMEOUT_S", 5.0)  # a correct case takes < 1 s


def accuracy_ok(correct: int, total: int) -> float:
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def accuracy_rank0_only(correct: int, total: int) -> float | None:
    if dist.get_rank() == 0:  # the bug of the lesson: a hang
        return accuracy_ok(correct, total)
    return None


def accuracy_mean_of_ranks(correct: int, total: int) -> float:
    acc = torch.tensor([correct / total], dtype=torch.float64)
    dist.all_reduce(acc)
    return acc.item() / dist.get_world_size()


def accuracy_none_off_rank0(correct: int, total: int) -> float | None:
    value = accuracy_ok(correct, total)
    return value if dist.get_rank() == 0 else None


def accuracy_sum_only(correct: int, total: int) -> float:
    c = torch.tensor([float(correct)])
    dist.all_reduce(c)
    return c.item() / (total * dist.get_world_size())


def safe_ok(tensor: torch.Tensor) -> None:
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, (tuple(tensor.shape), str(tensor.dtype)))
    if len(set(metas)) > 1:
        raise ValueError(f"differ: {metas}")
    dist.all_reduce(tensor)


def safe_plain(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)


def safe_raise_alone(tensor: torch.Tensor) -> None:
    # Only the rank whose tensor is odd knows: it raises alone, the others hang.
    sizes: list = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, tensor.numel())
    if tensor.numel() != max(sizes, key=sizes.count):
        raise ValueError("my shape differs")
    dist.all_reduce(tensor)


def safe_numel_only(tensor: torch.Tensor) -> None:
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, (tensor.numel(), str(tensor.dtype)))
    if len(set(metas)) > 1:
        raise ValueError("differ")
    dist.all_reduce(tensor)


def safe_shape_only(tensor: torch.Tensor) -> None:
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, tuple(tensor.shape))
    if len(set(metas)) > 1:
        raise ValueError("differ")
    dist.all_reduce(tensor)


def safe_numel_ndim_size(tensor: torch.Tensor) -> None:
    # Every rank sees the same max and min, so all raise together; but (2, 3) vs (3, 2) and
    # float32 vs int32 agree on all three.
    mine = torch.tensor([tensor.numel(), tensor.dim(), tensor.element_size()])
    high, low = mine.clone(), mine.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    if not torch.equal(high, low):
        raise ValueError("differ")
    dist.all_reduce(tensor)


CODES = {torch.float32: 1, torch.float64: 2, torch.int32: 3, torch.bfloat16: 4, torch.float16: 5}


def safe_sum_of_meta(tensor: torch.Tensor) -> None:
    # Right when one rank differs; with (2,), (4,), (3,) the rank holding (3,) sees a sum
    # of 3 x its own and enters the all-reduce alone.
    meta = [tensor.dim(), CODES.get(tensor.dtype, 9), *tensor.shape]
    mine = torch.tensor(meta + [0] * (8 - len(meta)))
    total = mine.clone()
    dist.all_reduce(total)
    if not torch.equal(total, mine * dist.get_world_size()):
        raise ValueError("differ")
    dist.all_reduce(tensor)


def safe_returns_copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.clone()
    safe_ok(copy)
    return copy  # the tensor itself is unchanged: not in place


def accuracy_numpy(correct: int, total: int):
    import numpy as np

    return np.float32(accuracy_ok(correct, total))  # a NumPy scalar is a number (review 10)


class MismatchError(ValueError):
    """A learner's own error type: a ValueError all the same."""


def safe_own_error(tensor: torch.Tensor) -> None:
    try:
        safe_ok(tensor)
    except ValueError as exc:
        raise MismatchError(str(exc)) from None


def _grade(grade_id: str, fn, seed: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", seed)
    try:
        dl.grade(grade_id, fn)
    except AssertionError as failed:
        print(failed)  # a failing graded cell shows its verdict line as the error
        return False
    return True


@pytest.mark.parametrize("seed", ["1", "2"])
def test_reference_solutions_pass(seed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _grade("09.global_accuracy", accuracy_ok, seed, monkeypatch)
    assert _grade("09.safe_all_reduce", safe_ok, seed, monkeypatch)


def test_right_answers_in_other_forms_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _grade("09.global_accuracy", accuracy_numpy, "1", monkeypatch)
    assert _grade("09.safe_all_reduce", safe_own_error, "1", monkeypatch)


@pytest.mark.parametrize(
    "wrong",
    [accuracy_rank0_only, accuracy_mean_of_ranks, accuracy_none_off_rank0, accuracy_sum_only],
)
def test_wrong_accuracy_fails(wrong, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert not _grade("09.global_accuracy", wrong, "1", monkeypatch)
    if wrong is accuracy_rank0_only:
        assert "hangs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong",
    [
        safe_plain,
        safe_raise_alone,
        safe_numel_only,
        safe_shape_only,
        safe_returns_copy,
        safe_numel_ndim_size,
        safe_sum_of_meta,
    ],
)
@pytest.mark.parametrize("seed", ["1", "2"])
def test_wrong_safe_all_reduce_fails(wrong, seed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every seed has every kind of case (ch09.safe_cases; checked over many seeds below).
    assert not _grade("09.safe_all_reduce", wrong, seed, monkeypatch)


def accuracy_right_for_2_and_4(correct: int, total: int) -> float:
    # Wrong at 3 ranks only: the default seed drew 2, 4, 4 and passed it.
    value = accuracy_ok(correct, total)
    return value / 2 if dist.get_world_size() == 3 else value


@pytest.mark.parametrize("seed", [None, "1", "2"])
def test_every_seed_has_three_and_four_ranks(seed, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed is None:
        monkeypatch.delenv("DDP_LAB_GRADE_SEED", raising=False)
        assert not _grade_default("09.global_accuracy", accuracy_right_for_2_and_4)
    else:
        assert not _grade("09.global_accuracy", accuracy_right_for_2_and_4, seed, monkeypatch)


def _grade_default(grade_id: str, fn) -> bool:
    try:
        dl.grade(grade_id, fn)
    except AssertionError as failed:
        print(failed)
        return False
    return True


def test_stub_reports_not_implemented(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def stub(*args: object) -> None:
        raise NotImplementedError("your code here")

    assert not _grade("09.global_accuracy", stub, "1", monkeypatch)
    assert not _grade("09.safe_all_reduce", stub, "1", monkeypatch)


class EqualToEverything:
    """Not data: an object that says it equals anything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __float__(self) -> float:
        return 0.5


class SneakyFloat(float):
    """A float that says it equals anything (its value is still 0)."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    def __sub__(self, other: object) -> float:
        return 0.0


def accuracy_not_data(correct: int, total: int) -> object:
    accuracy_ok(correct, total)
    return EqualToEverything()


def accuracy_sneaky_float(correct: int, total: int) -> float:
    accuracy_ok(correct, total)
    return SneakyFloat(0.0)


@pytest.mark.parametrize(
    "wrong,words",
    [(accuracy_not_data, "returned <EqualToEverything>"), (accuracy_sneaky_float, "returned 0.0")],
)
def test_accuracy_that_is_not_data_fails_cleanly(wrong, words: str) -> None:
    passed, line = run_checker(load_checkers()["09.global_accuracy"], LocalLearner((wrong,)), "en")
    assert not passed and words in line, line


def test_hang_and_lone_raise_feedback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", "1")
    chk = load_checkers()["09.safe_all_reduce"]
    passed, line = run_checker(chk, LocalLearner((safe_plain,)), "en")
    assert not passed and ("hangs" in line or "did not raise ValueError" in line), line
    passed, line = run_checker(chk, LocalLearner((safe_numel_only,)), "en")
    assert not passed and "did not raise ValueError (it returned normally)" in line, line


# --- 09.safe_all_reduce's cases, over many seeds: each wrong rule meets its case every time ---


def _meta(shape: tuple, dtype: str) -> tuple:
    t = torch.empty(shape, dtype=ch09.DTYPES[dtype])
    return t.numel(), t.dim(), t.element_size(), tuple(t.shape), t.dtype, t.is_floating_point()


def _all_or_none(differ: bool, world: int) -> list[bool]:
    return [differ] * world


def _sum_rule(vectors: list[list[int]]) -> list[bool]:
    """Each rank raises when the sum of the ranks' vectors is not world x its own."""
    width = max(len(v) for v in vectors)
    padded = [v + [0] * (width - len(v)) for v in vectors]
    total = [sum(col) for col in zip(*padded, strict=True)]
    return [total != [len(vectors) * x for x in v] for v in padded]


CODE = {"float32": 1, "int32": 2, "bfloat16": 3, "float16": 4}

# Which ranks raise, under a rule, given every rank's (shape, dtype): the rules as data.
SAFE_RULES = {
    "reference": lambda ms: _all_or_none(len({(m[3], m[4]) for m in ms}) > 1, len(ms)),
    "numel, ndim and element size": lambda ms: _all_or_none(len({m[:3] for m in ms}) > 1, len(ms)),
    "numel and dtype": lambda ms: _all_or_none(len({(m[0], m[4]) for m in ms}) > 1, len(ms)),
    "shape only": lambda ms: _all_or_none(len({m[3] for m in ms}) > 1, len(ms)),
    "sorted shape and dtype": lambda ms: _all_or_none(
        len({(tuple(sorted(m[3])), m[4]) for m in ms}) > 1, len(ms)
    ),
    "shape and element size": lambda ms: _all_or_none(len({m[2:4] for m in ms}) > 1, len(ms)),
    "shape, element size, floating": lambda ms: _all_or_none(
        len({(*m[2:4], m[5]) for m in ms}) > 1, len(ms)
    ),
    "sum of [ndim, dtype, *shape]": lambda ms: _sum_rule(
        [[m[1], CODE[str(m[4]).removeprefix("torch.")], *m[3]] for m in ms]
    ),
    "sum of [numel, element size]": lambda ms: _sum_rule([[m[0], m[2]] for m in ms]),
    "sum of the shape's dims": lambda ms: _sum_rule([[sum(m[3]), m[1]] for m in ms]),
}


def _rule_passes(rule, cases: list) -> bool:
    """A rule passes a seed's cases if every rank raises on every mismatch and none raises
    when all agree (a rank that does not raise while another does is a hang)."""
    for kind, shapes, dtypes, _ in cases:
        raises = rule([_meta(s, d) for s, d in zip(shapes, dtypes, strict=True)])
        if raises != [kind != "same"] * len(shapes):
            return False
    return True


SEEDS = [str(i) for i in range(30)] + ["course-2026-spring", ""]


def test_safe_cases_tell_every_wrong_rule_apart_under_every_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ddp_lab.course.grading.checkers import rng_for

    same_at: set[int] = set()
    for seed in SEEDS:
        monkeypatch.setenv("DDP_LAB_GRADE_SEED", seed)
        cases = ch09.safe_cases(rng_for("09.safe_all_reduce"))
        kinds = [c[0] for c in cases]
        assert sorted(kinds) == sorted(["same", "shape", "ndim", "dtype", "dtype16", "both_ways"])
        same_at.add(kinds.index("same"))
        for name, rule in SAFE_RULES.items():
            assert _rule_passes(rule, cases) == (name == "reference"), (seed, name, cases)
    # review 7: in a fixed order (the sum first) a rank that counted its calls passed 3/3
    # without comparing anything; the seed moves the case that wants the sum
    assert len(same_at) > 1, same_at


def test_safe_all_reduce_draws_its_cases_from_safe_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker grades exactly the cases of ``safe_cases`` (what the test above reads)."""
    from ddp_lab.course.grading.checkers import rng_for

    monkeypatch.setenv("DDP_LAB_GRADE_SEED", "7")
    cases = ch09.safe_cases(rng_for("09.safe_all_reduce"))
    seen = []

    class Recorder:
        def ranks(self, probe, inputs, timeout=60, fresh=False):
            seen.append([(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in inputs])
            raise LearnerError("NotImplementedError", "your code here")

    run_checker(load_checkers()["09.safe_all_reduce"], Recorder(), "en")
    first = cases[0]
    assert seen == [list(zip(first[1], first[2], strict=True))]
