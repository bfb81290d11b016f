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
    # the hidden activation is split, the block's input and output are not (the lesson's
    # answer to "TP divides a layer's memory by the number of ranks")
    assert out[0]["activations"] == {
        "this rank": (3 * 8, 3 * 16 // world, 3 * 8),
        "one process": (3 * 8, 3 * 16, 3 * 8),
    }


def test_torch_tp_sends_what_f_and_g_send_and_2d_splits_the_dimensions():
    from ddp_lab.tensor_parallel import torch_tp_and_2d

    out = spawn(torch_tp_and_2d, nprocs=4, backend="gloo", quiet=True)
    tp = out[0]["tp"]
    assert max(tp["output_diff"], tp["x_grad_diff"], tp["fc1_grad_diff"]) < 1e-5, tp
    # RowwiseParallel's Partial -> Replicate forward (g), ColwiseParallel's input gradient
    # Partial -> Replicate backward (f): one all-reduce of 4 x 8 float32 each way
    assert tp["forward"] == [("all_reduce", 128)] and tp["backward"] == [("all_reduce", 128)]
    for rank, r in enumerate(out):
        d = r["2d"]
        assert d["groups"] == {
            "dp": [rank % 2, rank % 2 + 2],
            "tp": [rank // 2 * 2, rank // 2 * 2 + 1],
        }
        assert d["grad_diff"] < 1e-5 and d["local_shape"] == [4, 8]
        # the input needs no gradient: no backward all-reduce, only FSDP's reduce-scatter
        assert d["forward"] == [("_allgather_base_", 576), ("all_reduce", 128)]
        assert d["backward"] == [("_reduce_scatter_base_", 576)]
    # separate ColwiseParallel q, k, v: each all-reduces the input's gradient (Megatron's
    # fused linear_qkv does it once); o's output all-reduce forward
    qkv = out[0]["qkv"]
    assert qkv["forward"] == [("all_reduce", 128)]
    assert qkv["backward"] == [("all_reduce", 128)] * 3


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


def _ours_against_torch(rank: int) -> dict:
    """The course's TensorParallelMLP and torch's ColwiseParallel/RowwiseParallel on a
    1D gloo DeviceMesh, from the same MLP and batch: the same local shards, output, input
    gradient and local weight gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from ddp_lab.tensor_parallel import TensorParallelMLP

    torch.manual_seed(0)
    mlp = MLP(8, 16).double()
    theirs = MLP(8, 16).double()
    theirs.load_state_dict(mlp.state_dict())
    ours = TensorParallelMLP(mlp)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(theirs, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(3, 8, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), theirs(x2)
    y1.square().sum().backward()
    y2.square().sum().backward()
    diffs = {
        "output": (y1 - y2).abs().max().item(),
        "x.grad": (x1.grad - x2.grad).abs().max().item(),
    }
    placements = {}
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        mine, their = ours.get_parameter(name), theirs.get_parameter(name)
        placements[name] = [str(p) for p in their.placements]
        diffs[name] = (mine - their.to_local()).abs().max().item()
        diffs[name + ".grad"] = (mine.grad - their.grad.to_local()).abs().max().item()
    return {"diffs": diffs, "placements": placements}


@pytest.mark.parametrize("world", [2, 4])
def test_ours_equals_torch_colwise_rowwise(world):
    out = spawn(_ours_against_torch, nprocs=world, backend="gloo", quiet=True)
    for r in out:
        assert max(r["diffs"].values()) < 1e-12, r["diffs"]
        # column-parallel = rows of the weight (Shard(0)), row-parallel = columns (Shard(1));
        # the row-parallel bias is whole (Replicate), as RowParallelLinear keeps it
        assert r["placements"] == {
            "fc1.weight": ["S(0)"], "fc1.bias": ["S(0)"], "fc2.weight": ["S(1)"], "fc2.bias": ["R"],
        }  # fmt: skip
