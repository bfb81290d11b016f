"""Chapter 00's checker (00.average) through a learner handle: the reference passes; the first
try of the chapter's concept check (an all-reduce of the caller's tensor), a result in
another dtype and a sum fail, each with what is wrong."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from cheats import verdict

from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import LearnerError


def _verdict(fn: Callable, lang: str = "en") -> tuple[bool, str]:
    return verdict("00.average", fn, lang)


def reference(value: torch.Tensor) -> torch.Tensor:
    total = value.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def in_place(value: torch.Tensor) -> torch.Tensor:  # the concept check's "first try"
    dist.all_reduce(value)
    return value / dist.get_world_size()


def as_float32(value: torch.Tensor) -> torch.Tensor:
    return reference(value).float()


def summed(value: torch.Tensor) -> torch.Tensor:
    total = value.clone()
    dist.all_reduce(total)
    return total


def test_reference_passes() -> None:
    passed, line = _verdict(reference)
    assert passed, line


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (in_place, "the caller's tensor changed"),
        (as_float32, "returned float32; the mean of float64 tensors is float64"),
        (summed, "but the mean over ranks is"),
    ],
)
@pytest.mark.parametrize("seed", ["1", "2", "3"])
def test_wrong_solutions_fail_with_what_is_wrong(
    wrong: Callable, words: str, seed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", seed)
    passed, line = _verdict(wrong)
    assert not passed and line.startswith("FAIL 00.average") and words in line, line


def test_feedback_in_chinese() -> None:
    passed, line = _verdict(in_place, "zh")
    assert not passed and "调用者传入的张量被改了" in line, line


def fails_beyond_two_ranks(value: torch.Tensor) -> torch.Tensor:
    if dist.get_world_size() > 2:
        raise ValueError("only written for two ranks")
    return reference(value)


def even_divisor(value: torch.Tensor) -> torch.Tensor:
    # Right for 2 and 4 ranks only: a divisor written for the world sizes the learner tried.
    total = value.clone()
    dist.all_reduce(total)
    return total / (4 if dist.get_world_size() > 2 else 2)


@pytest.mark.parametrize("seed", [None, "1", "2", "3"])
def test_every_seed_has_three_ranks(seed: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default seed (what a learner's `ddp-lab check` uses) included: before, it drew world
    # sizes 2, 4, 4 and this answer passed at home.
    if seed is None:
        monkeypatch.delenv("DDP_LAB_GRADE_SEED", raising=False)
    else:
        monkeypatch.setenv("DDP_LAB_GRADE_SEED", seed)
    passed, line = _verdict(even_divisor)
    assert not passed and "world_size=3" in line, line


def test_an_exception_names_the_case_it_happened_in() -> None:
    # 00.average runs 2 ranks first, then 3 and 4: the second case raises, and the verdict
    # names that case (a learner reproduces it from the label), not "-".
    passed, line = _verdict(fails_beyond_two_ranks)
    assert not passed, line
    assert "Hidden case 2 of 3 (world_size=" in line and "(-)" not in line, line
    assert "your code raised ValueError: only written for two ranks" in line, line


class RaisingRanks:
    """A sandbox's learner handle whose ranks raised (how ``ddp-lab check`` hears of it)."""

    def ranks(self, *args: object, **kwargs: object) -> list:
        raise LearnerError("IndexError", "list index out of range")


def test_an_exception_in_the_sandbox_names_the_case_too() -> None:
    passed, line = run_checker(load_checkers()["00.average"], RaisingRanks(), "en")
    assert not passed, line
    assert "Hidden case 1 of 3 (world_size=2, dtype=float" in line, line
    assert "your code raised IndexError: list index out of range" in line, line
