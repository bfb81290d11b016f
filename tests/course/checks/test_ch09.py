"""Checkers of chapter 09 accept the reference solutions and reject typical wrong ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.checks import ch09
from ddp_lab.course.grading.learner import LocalLearner


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


def safe_returns_copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.clone()
    safe_ok(copy)
    return copy  # the tensor itself is unchanged: not in place


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


@pytest.mark.parametrize(
    "wrong",
    [accuracy_rank0_only, accuracy_mean_of_ranks, accuracy_none_off_rank0, accuracy_sum_only],
)
def test_wrong_accuracy_fails(wrong, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert not _grade("09.global_accuracy", wrong, "1", monkeypatch)
    if wrong is accuracy_rank0_only:
        assert "hangs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong", [safe_plain, safe_raise_alone, safe_numel_only, safe_shape_only, safe_returns_copy]
)
@pytest.mark.parametrize("seed", ["1", "2"])
def test_wrong_safe_all_reduce_fails(wrong, seed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every seed has a same-shape case and both a dtype and a shape/ndim case.
    assert not _grade("09.safe_all_reduce", wrong, seed, monkeypatch)


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
