"""Chapter 06's checkers (06.indices, 06.accuracy) through a learner handle: the references
pass, typical wrong solutions fail with feedback, calling the ready-made answers is refused at
run time, and results that are not data fail cleanly."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from cheats import EqualsAnything, verdict
from torch.utils.data import DistributedSampler

from ddp_lab import sampler as S
from ddp_lab.course.grading.checks import ch06
from ddp_lab.labs import evaluation as E


def _verdict(grade_id: str, fn: Callable) -> tuple[bool, str]:
    return verdict(grade_id, fn)


# ---- 06.indices ---------------------------------------------------------------------------


def reference(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    # Written out (the checker refuses solutions that call the samplers).
    per_rank = dataset_len // num_replicas if drop_last else -(-dataset_len // num_replicas)
    total = per_rank * num_replicas
    idx = list(range(dataset_len))
    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        idx = torch.randperm(dataset_len, generator=g).tolist()
    while len(idx) < total:
        idx += idx[: total - len(idx)]
    return idx[:total][rank::num_replicas]


def _order(n, epoch, seed, shuffle):
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def contiguous(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    idx = S.pad_or_trim(_order(n, epoch, seed, shuffle), S.num_samples_for(n, R, drop_last) * R)
    k = len(idx) // R
    return idx[rank * k : (rank + 1) * k]


def no_padding(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    return _order(n, epoch, seed, shuffle)[rank::R]


def pad_once(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    idx = _order(n, epoch, seed, shuffle)
    total = S.num_samples_for(n, R, drop_last) * R
    idx = idx[:total] if drop_last else idx + idx[: total - len(idx)]
    return idx[rank:total:R]


def pad_with_last(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    idx = _order(n, epoch, seed, shuffle)
    total = S.num_samples_for(n, R, drop_last) * R
    idx = idx[:total] + [idx[-1]] * max(0, total - len(idx)) if idx else []
    return idx[rank:total:R]


def ignores_epoch(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    return reference(n, R, rank, 0, seed, shuffle, drop_last)


def ignores_seed(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    return reference(n, R, rank, epoch, 0, shuffle, drop_last)


def drop_before_shuffle(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    if not drop_last:
        return reference(n, R, rank, epoch, seed, shuffle)
    total = S.num_samples_for(n, R, True) * R
    idx = _order(total, epoch, seed, shuffle)
    return idx[rank::R]


def drop_last_floor_wrong(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    # ceil((n - R) / R) written with floor division: one sample too few per rank.
    if not drop_last:
        return reference(n, R, rank, epoch, seed, shuffle)
    k = max(0, (n - R) // R)
    return _order(n, epoch, seed, shuffle)[: k * R][rank::R]


def python_shuffle(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    idx = list(range(n))
    if shuffle:
        random.Random(seed + epoch).shuffle(idx)
    total = S.num_samples_for(n, R, drop_last) * R
    return S.pad_or_trim(idx, total)[rank:total:R] if n else []


def ignores_shuffle_flag(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    return reference(n, R, rank, epoch, seed, True, drop_last)


def test_indices_checker_accepts_the_reference():
    passed, line = _verdict("06.indices", reference)
    assert passed and "4/4" in line, line


def test_indices_checker_covers_the_issue_edge_cases():
    for seed in range(20):
        cases = [args for _, args in ch06.index_cases(random.Random(seed))]
        assert any(a["dataset_len"] == 0 for a in cases)
        assert any(0 < a["dataset_len"] < a["num_replicas"] for a in cases)
        assert any(
            not a["drop_last"]
            and S.num_samples_for(a["dataset_len"], a["num_replicas"]) * a["num_replicas"]
            - a["dataset_len"]
            > a["dataset_len"]
            > 0
            for a in cases
        )
        assert any(
            a["drop_last"] and a["dataset_len"] % a["num_replicas"] == 0 and a["dataset_len"]
            for a in cases
        )
        assert any(a["drop_last"] and a["dataset_len"] % a["num_replicas"] for a in cases)
        assert len({a["epoch"] for a in cases}) >= 3 and len({a["seed"] for a in cases}) >= 3
        assert {f"case_{key}" for key, _ in ch06.index_cases(random.Random(seed))} <= set(
            ch06.MESSAGES
        )


@pytest.mark.parametrize(
    "wrong",
    [
        contiguous,
        no_padding,
        pad_once,
        pad_with_last,
        ignores_epoch,
        ignores_seed,
        drop_before_shuffle,
        drop_last_floor_wrong,
        python_shuffle,
        ignores_shuffle_flag,
    ],
)
@pytest.mark.parametrize("grade_seed", ["20261122", "7"])
def test_indices_checker_rejects_typical_mistakes(wrong, grade_seed, monkeypatch):
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", grade_seed)
    passed, line = _verdict("06.indices", wrong)
    assert not passed
    assert "FAIL 06.indices" in line
    assert "expected [" in line or "write it yourself" in line or "not allowed" in line


def test_indices_checker_stops_on_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError

    passed, line = _verdict("06.indices", stub)
    assert not passed and "points. The exercise is not solved yet" in line, line


def _cheat_sampler(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    s = DistributedSampler(range(n), R, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s)


def test_indices_checker_refuses_calling_the_real_sampler():
    assert ch06.uses_forbidden(_cheat_sampler, ch06.FORBIDDEN["06.indices"]) == "DistributedSampler"
    passed, line = _verdict("06.indices", _cheat_sampler)
    assert not passed and "write it yourself: your function calls DistributedSampler" in line
    # Refused before any case ran: the line names no case (no "(-)").
    assert "Hidden case 1 of " in line and " failed: write it yourself" in line, line
    assert "(-)" not in line, line


def test_indices_checker_refuses_the_sampler_at_run_time_under_another_name():
    """A name the code-object scan does not know: the call itself is refused."""
    hidden = {"sampler": DistributedSampler, "teaching": S.DistributedSampler}

    def through_a_dict(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
        s = hidden["sampler"](range(n), R, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        return list(s)

    def through_the_teaching_sampler(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
        s = hidden["teaching"](range(n), R, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        return list(s)

    for cheat in (through_a_dict, through_the_teaching_sampler):
        assert ch06.uses_forbidden(cheat, ch06.FORBIDDEN["06.indices"]) == ""
        passed, line = _verdict("06.indices", cheat)
        assert not passed and "Refused" in line and "not allowed" in line, line
    # refused only during the learner's call: the samplers work again afterwards
    assert list(DistributedSampler(range(4), 2, 0, shuffle=False)) == [0, 2]
    assert list(S.DistributedSampler(range(4), 2, 1, shuffle=False)) == [1, 3]


def test_indices_checker_refuses_chapter_11s_resumable_sampler():
    """Review 6, F1 (got 4/4): with start=0 chapter 11's sampler deals out torch's indices;
    an instance made without torch's refused __init__ used its own methods."""
    from ddp_lab.tools.resume import ResumableDistributedSampler as RDS

    def through_object_new(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
        s = object.__new__(RDS)
        s.dataset, s.num_replicas, s.rank = range(n), R, rank
        s.shuffle, s.seed, s.epoch, s.start = shuffle, seed, epoch, 0
        out = list(s)
        return out[: n // R] if drop_last else out

    hidden = {"cls": RDS}  # a name the static read does not know: refused at run time

    def through_a_dict(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
        s = object.__new__(hidden["cls"])
        s.dataset, s.num_replicas, s.rank = range(n), R, rank
        s.shuffle, s.seed, s.epoch, s.start = shuffle, seed, epoch, 0
        return list(s)

    passed, line = _verdict("06.indices", through_object_new)
    assert not passed and "ResumableDistributedSampler is not allowed" in line, line
    passed, line = _verdict("06.indices", through_a_dict)
    assert not passed and "Refused" in line and "not allowed" in line, line
    # refused only while the learner's code runs: chapter 11's sampler works again afterwards
    assert list(RDS(range(4), num_replicas=2, rank=1, shuffle=False)) == [1, 3]


@pytest.mark.parametrize(
    ("cheat", "feedback"),
    [
        (lambda *a, **k: EqualsAnything(), "return a list of ints, not EqualsAnything"),
        (lambda *a, **k: [EqualsAnything()], "not list (EqualsAnything)"),
        (lambda *a, **k: "0, 1, 2", "not str"),
    ],
)
def test_indices_result_that_is_not_data_fails_cleanly(cheat: Callable, feedback: str) -> None:
    passed, line = _verdict("06.indices", cheat)
    assert not passed and feedback in line, line


def test_indices_tensor_results_still_pass():
    passed, line = _verdict("06.indices", lambda *a, **k: torch.tensor(reference(*a, **k)))
    assert passed, line


# ---- 06.accuracy --------------------------------------------------------------------------


def fixed_by_gathering(correct, dataset_len):
    # Written with dist directly: the checker refuses calls to ddp_lab.labs.evaluation's fixes.
    parts = [torch.empty_like(correct) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, correct)
    return torch.stack(parts, dim=1).flatten()[:dataset_len].float().mean().item()


def fixed_by_counting(correct, dataset_len):
    rank, world = dist.get_rank(), dist.get_world_size()
    real = len(range(rank, dataset_len, world))  # this rank's slots that are not padding
    counts = torch.tensor([correct[:real].sum().item(), real], dtype=torch.float64)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def uses_the_package(correct, dataset_len):
    return E.gather_in_index_order(correct, dataset_len).float().mean().item()


def naive_mean(correct, dataset_len):
    return E.gather_tensor(correct).float().mean().item()


def trimmed_in_rank_order(correct, dataset_len):
    return E.gather_tensor(correct)[:dataset_len].float().mean().item()


def divided_by_dataset_len(correct, dataset_len):
    return (E.gather_tensor(correct).sum() / dataset_len).item()


def mean_of_rank_means(correct, dataset_len):
    m = correct.float().mean().reshape(1)
    dist.all_reduce(m)
    return (m / dist.get_world_size()).item()


def local_only(correct, dataset_len):
    return correct.float().mean().item()


@pytest.mark.parametrize("fixed", [fixed_by_gathering, fixed_by_counting])
def test_accuracy_checker_accepts_both_fixes(fixed):
    passed, line = _verdict("06.accuracy", fixed)
    assert passed, line


@pytest.mark.parametrize(
    ("wrong", "feedback"),
    [
        (naive_mean, "include the padding's duplicates"),
        (trimmed_in_rank_order, "include the padding's duplicates"),
        (divided_by_dataset_len, "include the padding's duplicates"),
        (mean_of_rank_means, "expected accuracy"),
        (local_only, "expected accuracy"),
        (uses_the_package, "write it yourself: your function calls"),
    ],
)
def test_accuracy_checker_rejects_biased_evaluations(wrong, feedback):
    passed, line = _verdict("06.accuracy", wrong)
    assert not passed and "FAIL 06.accuracy" in line and feedback in line, line


_PACKAGE_FIX = {"fix": E.gather_in_index_order}


def uses_the_package_under_another_name(correct, dataset_len):
    return _PACKAGE_FIX["fix"](correct, dataset_len).float().mean().item()


def test_accuracy_checker_refuses_the_package_at_run_time():
    assert (
        ch06.uses_forbidden(uses_the_package_under_another_name, ch06.FORBIDDEN["06.accuracy"])
        == ""
    )
    passed, line = _verdict("06.accuracy", uses_the_package_under_another_name)
    assert not passed and "Refused" in line and "not allowed" in line, line


def accuracy_not_data(correct, dataset_len):
    return EqualsAnything()


def accuracy_as_text(correct, dataset_len):
    return str(fixed_by_gathering(correct, dataset_len))


@pytest.mark.parametrize(
    ("cheat", "feedback"),
    [
        (accuracy_not_data, "as a float, not EqualsAnything"),
        (accuracy_as_text, "as a float, not str"),
    ],
)
def test_accuracy_result_that_is_not_data_fails_cleanly(cheat: Callable, feedback: str) -> None:
    passed, line = _verdict("06.accuracy", cheat)
    assert not passed and feedback in line, line


def test_accuracy_cases_make_the_wrong_answers_differ():
    # Over many grading seeds, every biased formula is wrong on at least one hidden case.
    import random

    for seed in range(30):
        plan = ch06.accuracy_cases(random.Random(seed))
        differs = [False] * 4
        for replicas, datasets in plan:
            for _, correct in datasets:
                truth = sum(correct) / len(correct)
                for k, v in enumerate(ch06.biased_variants(correct, replicas)):
                    differs[k] |= abs(v - truth) > 1e-6
        assert all(differs), seed


# ---- a learner's own helper, named as the lesson names the package's ---------------------------


def padded_indices(indices: list[int], total: int) -> list[int]:  # the learner's own
    out = list(indices)
    while len(out) < total:
        out.extend(indices[: total - len(out)])
    return out[:total]


def own_helper_indices(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    size = n // R if drop_last else -(-n // R)
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    return padded_indices(indices, size * R)[rank::R]


def gather_by_index(correct: torch.Tensor) -> torch.Tensor:  # the learner's own
    parts = [torch.empty_like(correct) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, correct)
    return torch.stack(parts, dim=1).reshape(-1)


def own_helper_accuracy(correct, dataset_len):
    return float(gather_by_index(correct)[:dataset_len].float().mean())


def pad_or_trim(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):  # a wrapper
    return _cheat_sampler(n, R, rank, epoch, seed, shuffle, drop_last)


def wrapped_sampler(n, R, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    return pad_or_trim(n, R, rank, epoch, seed, shuffle, drop_last)


@pytest.mark.parametrize(
    ("grade_id", "right"),
    [("06.indices", own_helper_indices), ("06.accuracy", own_helper_accuracy)],
)
def test_a_helper_of_the_learners_own_may_bear_the_lessons_name(grade_id, right):
    """Got 0 ("write it yourself: your function calls padded_indices"): the scan flagged the
    name, though the function it names is the learner's."""
    assert ch06.uses_forbidden(right, ch06.FORBIDDEN[grade_id]) == ""
    passed, line = _verdict(grade_id, right)
    assert passed, line


def test_a_helper_of_the_learners_own_is_read_too():
    """The helper's own code is read: torch's sampler behind it is still named."""
    assert ch06.uses_forbidden(wrapped_sampler, ch06.FORBIDDEN["06.indices"]) == (
        "DistributedSampler"
    )
    passed, line = _verdict("06.indices", wrapped_sampler)
    assert not passed and "your function calls DistributedSampler" in line, line
