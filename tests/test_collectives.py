"""Tests of ddp_lab.collectives: the before/after models against the real collectives."""

from __future__ import annotations

import matplotlib
import pytest

import ddp_lab as dl
from ddp_lab import collectives as col

matplotlib.use("Agg")


def _ops_of_this_torch() -> tuple[str, ...]:
    """``col.OPS`` less gloo's all_to_all where this torch lacks it (2.11: "Backend gloo does
    not support alltoall"; doctor.TORCH_FEATURES)."""
    from ddp_lab.tools.doctor import torch_features

    if torch_features()["gloo all_to_all"]:
        return col.OPS
    return tuple(op for op in col.OPS if op != "all_to_all")


def _all_ops(rank: int, ops: tuple[str, ...]) -> dict:
    return {op: col.run_op(rank, op) for op in ops}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_model_matches_the_real_collectives(world_size):
    ops = _ops_of_this_torch()
    results = dl.spawn(_all_ops, (ops,), nprocs=world_size, backend="gloo", quiet=True)
    for op in ops:
        before, after = col.model(op, world_size)
        assert len(before) == len(after) == world_size
        for rank in range(world_size):
            assert results[rank][op] == after[rank], (op, rank)


def test_probe_finds_every_collective_working_on_gloo_cpu():
    # PyTorch 2.x documents all of them for gloo on CPU; the probe must agree.
    # torch 2.11's gloo has no all_to_all: there the probe must say so.
    found = col.probe("gloo", "cpu", nprocs=2)
    ops = _ops_of_this_torch()
    assert {op: found[op] for op in ops} == dict.fromkeys(ops, "✓")
    if "all_to_all" not in ops:
        assert found["all_to_all"].startswith("✘") and "alltoall" in found["all_to_all"]


def test_notes_table_is_out_of_date_where_the_docs_changed():
    diffs = {(op, where) for op, where, _, _ in col.table_differences()}
    assert ("reduce_scatter", "gloo/cpu") in diffs
    assert ("all_to_all", "gloo/cpu") in diffs
    assert ("scatter", "nccl/gpu") in diffs
    assert ("all_reduce", "gloo/cpu") not in diffs
    # The probe confirms the documented cells for this machine, not the notes.
    for _op, where, notes, docs in col.table_differences():
        if where == "gloo/cpu":
            assert (notes, docs) == ("✘", "✓")


def test_unknown_op_and_device_are_rejected():
    with pytest.raises(ValueError, match="unknown op"):
        col.model("allreduce", 2)
    with pytest.raises(ValueError, match="device"):
        col.probe(device="tpu")


@pytest.mark.parametrize("op", col.OPS)
def test_draw_makes_one_cell_per_slot(op):
    fig = col.draw(op, 3)
    before, after = col.model(op, 3)
    cells = sum(len(ax.patches) for ax in fig.axes)
    assert cells == sum(map(len, before)) + sum(map(len, after))
