"""The column/row-parallel MLP against the whole MLP in one process, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.runtime.launcher import spawn
from ddp_lab.tensor_parallel import (
    MLP,
    ColumnParallelLinear,
    RowParallelLinear,
    compare_with_one_process,
)


@pytest.mark.parametrize("world", [2, 4])
def test_tp_mlp_matches_one_process(world):
    out = spawn(compare_with_one_process, args=(8, 16, 3), nprocs=world, backend="gloo", quiet=True)
    for r in out:
        assert max(r["diffs"].values()) < 1e-12, r["diffs"]
        assert r["shard"] == 16 // world
        # one all-reduce forward (g) and one backward (f), each of the batch x dim output
        assert r["calls"] == [("all_reduce", 3 * 8 * 8), ("all_reduce", 3 * 8 * 8)]
    whole = sum(p.numel() for p in MLP(8, 16).parameters())
    # fc1's weight and bias and fc2's weight are split; fc2's bias is whole on every rank
    assert out[0]["params"] == (whole - 8) // world + 8


def _gathered_column(rank: int) -> float:
    torch.manual_seed(0)
    lin = nn.Linear(5, 6)
    x = torch.randn(2, 5)
    col = ColumnParallelLinear(lin, gather_output=True)
    return (col(x) - lin(x)).abs().max().item()


def test_column_gather_output():
    assert max(spawn(_gathered_column, nprocs=3, backend="gloo", quiet=True)) < 1e-6


def _indivisible(rank: int) -> list[str]:
    errors = []
    for make in (
        lambda: ColumnParallelLinear(nn.Linear(4, 5)),
        lambda: RowParallelLinear(nn.Linear(5, 4)),
    ):
        try:
            make()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_indivisible_widths_are_refused():
    errors = spawn(_indivisible, nprocs=2, backend="gloo", quiet=True)[0]
    assert len(errors) == 2 and all("not divisible by the world size 2" in e for e in errors)


def _row_bias_once(rank: int) -> float:
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    part = 4 // dist.get_world_size()
    y = RowParallelLinear(lin)(x[:, rank * part : (rank + 1) * part])
    return (y - lin(x)).abs().max().item()


def test_row_parallel_adds_the_bias_once():
    assert max(spawn(_row_bias_once, nprocs=2, backend="gloo", quiet=True)) < 1e-6
