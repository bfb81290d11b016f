"""ddp_lab.evaluation on real gloo ranks, and the 06.accuracy checker against wrong fixes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ddp_lab as dl
from ddp_lab import evaluation as E
from ddp_lab.course.checks import ch06
from ddp_lab.course.grading import CaseFailed, rng_for

SIZES = list(range(0, 14)) + [31]


def _values(n: int) -> torch.Tensor:
    # Two columns so that the reordering is checked on rows, not on scalars.
    return torch.stack([torch.arange(n) * 7 % 5, torch.arange(n)], dim=1).to(torch.float32)


def _on_rank(rank: int) -> list:
    world = dist.get_world_size()
    problems = []
    for n in SIZES:
        full = _values(n)
        shard = list(DistributedSampler(range(n), world, rank, shuffle=False))
        got = E.gather_in_index_order(full[shard], n)
        if not torch.equal(got, full):
            problems.append(f"index order, n={n}")
        s = DistributedSampler(range(n), world, rank, shuffle=True, seed=3)
        s.set_epoch(2)
        idx = torch.tensor(list(s), dtype=torch.int64)
        got = E.gather_by_index(full[idx], idx, n)
        if not torch.equal(got, full):
            problems.append(f"by index, n={n}")
        if n:
            correct = (full[:, 0] < 2).double()  # per-sample "prediction was right"
            mine = correct[list(E.unpadded_shard(n, world, rank))]
            acc = E.all_reduce_accuracy(mine.sum(), mine.numel())
            if abs(acc - correct.mean().item()) > 1e-12:
                problems.append(f"counts, n={n}")
    return problems


@pytest.mark.parametrize("world", [2, 3, 4])
def test_evaluation_helpers_recover_the_single_process_result(world):
    results = dl.spawn(_on_rank, nprocs=world, backend="gloo", quiet=True, timeout=120)
    assert results == [[]] * world


def test_unpadded_shards_partition_the_dataset():
    for n in SIZES:
        for world in range(1, 6):
            shards = [list(E.unpadded_shard(n, world, r)) for r in range(world)]
            assert sorted(i for s in shards for i in s) == list(range(n))
            # Each unpadded shard is the sampler's shard with the padding cut off.
            for r, shard in enumerate(shards):
                padded = list(DistributedSampler(range(n), world, r, shuffle=False))
                assert padded[: len(shard)] == shard


def test_bad_dataset_len_is_refused():
    with pytest.raises(ValueError):
        E.unpadded_shard(-1, 2, 0)
    with pytest.raises(ValueError):
        E.unpadded_shard(4, 2, 2)


# ---- the 06.accuracy checker -------------------------------------------------------------


def fixed_by_gathering(correct, dataset_len):
    # Written with dist directly: the checker refuses calls to ddp_lab.evaluation's fixes.
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
    gen = ch06.check_accuracy(rng_for("06.accuracy"), fixed)
    total = next(gen)
    assert len(list(gen)) == total >= 5


@pytest.mark.parametrize(
    "wrong",
    [
        naive_mean,
        trimmed_in_rank_order,
        divided_by_dataset_len,
        mean_of_rank_means,
        local_only,
        uses_the_package,
    ],
)
def test_accuracy_checker_rejects_biased_evaluations(wrong):
    with pytest.raises(CaseFailed):
        list(ch06.check_accuracy(rng_for("06.accuracy"), wrong))


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


def test_gather_by_index_builds_its_output_on_the_values_device(monkeypatch):
    # Under NCCL the gathered values are CUDA tensors; a CPU output fails in
    # out[where] = values. The meta device stands in for CUDA on this CPU-only machine.
    monkeypatch.setattr(E, "gather_tensor", lambda t: t)
    monkeypatch.setattr(E.dist, "get_world_size", lambda group=None: 1)
    values = torch.ones(5, 3, device="meta")
    got = E.gather_by_index(values, torch.arange(5, device="meta"), 5)
    assert got.device.type == "meta"
    assert got.shape == (5, 3)
