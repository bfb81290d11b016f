"""ddp_lab.labs.recovery: DCP resharding (2 ranks -> 3) against the saved full state, a shard's
torch.save that does not load elsewhere, a gloo timeout that raises instead of hanging."""

from __future__ import annotations

import torch

import ddp_lab as dl
from ddp_lab.labs import recovery


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a
    )


def test_dcp_saved_on_2_ranks_loads_on_3_with_equal_full_state(tmp_path):
    folder = str(tmp_path / "ckpt")
    saved = dl.spawn(recovery.dcp_save, args=(folder,), nprocs=2, backend="gloo", quiet=True)
    loaded = dl.spawn(recovery.dcp_load, args=(folder,), nprocs=3, backend="gloo", quiet=True)
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    assert saved[0]["local_shapes"]["0.weight"] == (15, 12)  # dim 0 split over 2 ranks
    assert loaded[0]["local_shapes"]["0.weight"] == (10, 12)  # and over 3
    a, b = saved[0]["full"], loaded[0]["full"]
    assert _equal(a["model"], b["model"])
    assert a["optim"].keys() == b["optim"].keys() and a["optim"]
    for k in a["optim"]:
        assert _equal(a["optim"][k], b["optim"][k])  # Adam's step, exp_avg, exp_avg_sq
    fresh = recovery.small_mlp().state_dict()
    assert not torch.equal(fresh["0.weight"], a["model"]["0.weight"])  # training moved it


def test_a_ranks_torch_save_of_its_shard_does_not_load_on_3_ranks(tmp_path):
    kw = {"backend": "gloo", "quiet": True}
    dl.spawn(recovery.shard_torch_save, args=(str(tmp_path), True), nprocs=2, **kw)
    lines = dl.spawn(recovery.shard_torch_save, args=(str(tmp_path), False), nprocs=3, **kw)
    assert "must match" in lines[0] and "no file" in lines[2], lines


def test_a_stuck_peer_becomes_an_exception_after_the_timeout():
    lines = dl.spawn(recovery.collective_timeout, args=(2.0,), nprocs=2, backend="gloo", quiet=True)
    assert lines[0].startswith("rank 0: RuntimeError after") and "Timed out" in lines[0], lines


def test_overhead_and_smallest_every():
    cost = {"step": 0.01, "torch.save": 0.05}
    assert recovery.overhead(cost, 5) == 1.0
    k = recovery.smallest_every(cost)
    assert k == 50 and recovery.overhead(cost, k) <= 0.10 < recovery.overhead(cost, k - 1)
