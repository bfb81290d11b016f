"""ddp_lab.labs.evaluation on real gloo ranks (the 06.accuracy checker: tests/course/checks/test_ch06.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ddp_lab as dl
from ddp_lab.labs import evaluation as E

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


def test_gather_by_index_builds_its_output_on_the_values_device(monkeypatch):
    # Under NCCL the gathered values are CUDA tensors; a CPU output fails in
    # out[where] = values. The meta device stands in for CUDA on this CPU-only machine.
    monkeypatch.setattr(E, "gather_tensor", lambda t: t)
    monkeypatch.setattr(E.dist, "get_world_size", lambda group=None: 1)
    values = torch.ones(5, 3, device="meta")
    got = E.gather_by_index(values, torch.arange(5, device="meta"), 5)
    assert got.device.type == "meta"
    assert got.shape == (5, 3)
