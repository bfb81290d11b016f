"""BucketedDDP against torch's DistributedDataParallel, and its bucket plan against torch's."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import matplotlib
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab as dl
from ddp_lab.bucketed_ddp import (
    BucketedDDP,
    assign_buckets,
    bucket_plan,
    bucket_widget,
    plot_timeline,
)
from ddp_lab.ddp import module_states

matplotlib.use("Agg")


def _torch_plan(params: list[torch.Tensor], cap_mb: float | None, find_unused: bool) -> list:
    """torch's own bucket assignment, called as DDP calls it (torch 2.13)."""
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    cap = 25 * 1024 * 1024 if cap_mb is None else int(cap_mb * 1024 * 1024)
    if find_unused:
        # _ddp_init_helper: definition order, limits [first, cap] (default) or [cap], reversed;
        # never rebuilt (Reducer::should_rebuild_buckets is false with find_unused_parameters).
        limits = [first, cap] if cap_mb is None else [cap]
        expected, _ = dist._compute_bucket_assignment_by_size(params, limits)
        return list(reversed(expected))
    # Reducer::rebuild_buckets: gradient-arrival order, limits [first_bucket_bytes_cap, cap],
    # where first_bucket_bytes_cap is 1 MiB by default and the cap itself when it is given.
    limits = [first if cap_mb is None else cap, cap]
    order = list(range(len(params)))[::-1]  # reverse definition order
    expected, _ = dist._compute_bucket_assignment_by_size(
        [params[i] for i in order], limits, [False] * len(params), order
    )
    return expected


@settings(max_examples=200, deadline=None)
@given(
    numels=st.lists(st.integers(1, 5000), min_size=1, max_size=12),
    cap_kib=st.one_of(st.none(), st.floats(0.001, 40.0)),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
    find_unused=st.booleans(),
)
def test_assign_buckets_matches_torch(
    numels: list[int], cap_kib: float | None, dtype: torch.dtype, find_unused: bool
) -> None:
    params = [torch.empty(n, dtype=dtype) for n in numels]
    cap_mb = None if cap_kib is None else cap_kib / 1024
    # torch truncates the cap to whole bytes; keep caps where that cannot matter.
    if cap_mb is None or float(int(cap_mb * 2**20)) == cap_mb * 2**20:
        ours = assign_buckets(params, cap_mb, find_unused_parameters=find_unused)
        assert ours == _torch_plan(params, cap_mb, find_unused)


def test_assign_buckets_small_cap_matches_torch_exactly() -> None:
    params = [torch.empty(n) for n in [100, 300, 50, 1000, 10, 10, 200]]
    for cap_bytes in [1, 1024, 1200, 1600, 4000, 10**6]:
        for find_unused in (False, True):
            ours = assign_buckets(params, cap_bytes / 2**20, find_unused_parameters=find_unused)
            assert ours == _torch_plan(params, cap_bytes / 2**20, find_unused)


def _wide_mlp(width: int = 512, depth: int = 4) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(128, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _ddp_buckets(rank: int) -> list:
    """What torch's DDP reports about its buckets, at construction and after the rebuild."""
    rows = []
    for kwargs in [
        {},
        {"bucket_cap_mb": 1},
        {"bucket_cap_mb": 25},
        {"find_unused_parameters": True},
    ]:
        torch.manual_seed(0)
        model = DDP(_wide_mlp(), **kwargs)
        built = model._get_ddp_logging_data()["bucket_sizes"]
        for _ in range(3):  # the rebuild happens in forward 2, the logger sees it in forward 3
            model(torch.randn(4, 128)).sum().backward()
        data = model._get_ddp_logging_data()
        rows.append(
            (
                kwargs,
                built,
                data["has_rebuilt_buckets"],
                data.get("rebuilt_per_bucket_param_indices"),
                data.get("rebuilt_bucket_sizes"),
            )
        )
    return rows


def test_bucket_plan_matches_ddp_logging_data() -> None:
    """assign_buckets against the buckets torch's DDP really uses (two ranks, gloo)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = dl.spawn(_ddp_buckets, nprocs=2, backend="gloo", quiet=True)[0]
    params = list(_wide_mlp().parameters())

    def sizes(plan: list) -> str:
        return ", ".join(str(sum(params[i].numel() * 4 for i in b)) for b in plan)

    for kwargs, built, rebuilt, indices, rebuilt_sizes in rows:
        cap = kwargs.get("bucket_cap_mb")
        if kwargs.get("find_unused_parameters"):
            assert rebuilt == 0 and indices is None  # never rebuilt
            assert built == sizes(assign_buckets(params, cap, find_unused_parameters=True))
            continue
        assert built == str(sum(p.numel() * 4 for p in params))  # one bucket, 1st iteration
        assert rebuilt == 1
        plan = assign_buckets(params, cap)
        assert indices == ", ".join(" ".join(map(str, b)) for b in plan)
        assert rebuilt_sizes == sizes(plan)
    # the default's first bucket is the 1 MiB one, holding the output layers
    assert assign_buckets(params, None)[0] == [11, 10, 9, 8]


class FrozenMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(6, 32)
        self.frozen.requires_grad_(False)
        self.body = nn.Sequential(
            nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.frozen(x))


def bn_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 2),
    )


MODELS = {"frozen": FrozenMLP, "batchnorm": bn_net}
CAP_MB = 2e-4  # ~210 bytes: three or more buckets for these models


def _vs_torch(rank: int, kind: str, steps: int, accumulate: int) -> dict:
    torch.manual_seed(1000 + rank)
    net = MODELS[kind]()
    ours = BucketedDDP(net, bucket_cap_mb=CAP_MB)
    theirs = DDP(copy.deepcopy(net))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, theirs)]
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(steps):
        batches = [
            (torch.randn(5, 6, generator=gen), torch.randn(5, 2, generator=gen))
            for _ in range(accumulate)
        ]
        for model, opt in zip((ours, theirs), opts, strict=True):
            opt.zero_grad()
            for i, (x, y) in enumerate(batches):
                last = i == len(batches) - 1
                with model.no_sync() if not last else nullcontext():
                    nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    flat = [
        torch.cat([t.reshape(-1).double() for t in module_states(m.module)]) for m in (ours, theirs)
    ]
    params = torch.cat([p.detach().reshape(-1) for p in ours.module.parameters()])
    spread = params.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return {
        "vs_torch": (flat[0] - flat[1]).abs().max().item(),
        "spread": (spread - params).abs().max().item(),
        "buckets": len(ours.buckets),
    }


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("kind", ["frozen", "batchnorm"])
def test_bucketed_ddp_matches_torch_ddp(world_size: int, kind: str) -> None:
    results = dl.spawn(
        _vs_torch, args=(kind, 3, 1), nprocs=world_size, backend="gloo", quiet=True, timeout=120
    )
    for r in results:
        assert r["buckets"] >= 3, r
        assert r["vs_torch"] <= (0.0 if world_size == 2 else 1e-6), r
        assert r["spread"] == 0.0, r


def test_no_sync_accumulation_matches_torch_ddp() -> None:
    results = dl.spawn(
        _vs_torch, args=("frozen", 2, 3), nprocs=2, backend="gloo", quiet=True, timeout=120
    )
    assert all(r["vs_torch"] == 0.0 and r["spread"] == 0.0 for r in results), results


def _timeline(rank: int) -> tuple:
    torch.manual_seed(0)
    model = BucketedDDP(FrozenMLP(), bucket_cap_mb=CAP_MB, record_timeline=True)
    counts = []
    real = dist.all_reduce

    def counting(*args: object, **kwargs: object) -> object:
        counts.append(kwargs.get("async_op", False))
        return real(*args, **kwargs)

    dist.all_reduce = counting
    for _ in range(2):
        model(torch.randn(4, 6)).sum().backward()
    with model.no_sync():
        model(torch.randn(4, 6)).sum().backward()
    dist.all_reduce = real
    return model.timeline, counts, len(model.buckets)


def test_timeline_records_buckets_launched_during_backward() -> None:
    timeline, counts, n_buckets = dl.spawn(_timeline, nprocs=2, backend="gloo", quiet=True)[0]
    assert len(timeline) == 2  # the no_sync step records nothing and sends nothing
    assert counts == [True] * (2 * n_buckets)
    for step in timeline:
        assert len(step.comm) == n_buckets
        assert step.comm[0][0] < step.backward_end  # the first bucket left before the end
        assert step.synced >= max(done for _, done in step.comm) - 1e-3
        assert 0.0 <= step.overlap() <= 1.0
    plot_timeline(timeline[-1])


def _unused(rank: int) -> str:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 1), nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x)  # head b never takes part

    model = BucketedDDP(TwoHeads(), bucket_cap_mb=1e-6)
    try:
        model(torch.ones(2, 3)).sum().backward()
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_unused_parameter_is_a_clear_error() -> None:
    messages = dl.spawn(_unused, nprocs=2, backend="gloo", quiet=True, timeout=60)
    assert all("find_unused_parameters" in m and "b.weight" in m for m in messages), messages


def test_bad_arguments_fail_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        assign_buckets([torch.empty(3)], 0)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        BucketedDDP(nn.Linear(2, 2), bucket_cap_mb=-1)
    with pytest.raises(RuntimeError, match="init_process_group"):
        BucketedDDP(nn.Linear(2, 2))


def test_bucket_plan_and_widget() -> None:
    net = FrozenMLP()
    plan = bucket_plan(net, CAP_MB)
    assert sorted(n for b in plan for n in b) == sorted(
        n for n, p in net.named_parameters() if p.requires_grad
    )
    assert plan[0][0] == "body.5.bias"  # the last layer's gradients come first
    assert len(bucket_plan(net, None)) == 1
    widget = bucket_widget(net)
    assert widget.children[0].description == "bucket_cap_mb"


def _mixed_no_sync(rank: int, forward_inside: bool) -> dict:
    """One step with forward and backward on different sides of no_sync(), for both DDPs.

    torch decides in the forward (DistributedDataParallel._post_forward calls
    reducer.prepare_for_backward only when require_backward_grad_sync is set), so the
    forward's side of no_sync() decides whether the backward all-reduces.
    """
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    x = torch.randn(5, 4) * (rank + 1)  # different data per rank: synced grads differ
    synced = {}
    for name, wrap in [("torch", DDP), ("bucketed", BucketedDDP)]:
        model = wrap(copy.deepcopy(net))
        if forward_inside:
            with model.no_sync():
                loss = model(x).sum()
            loss.backward()
        else:
            loss = model(x).sum()
            with model.no_sync():
                loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        everyone = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, grads)
        synced[name] = all(torch.equal(everyone[0], g) for g in everyone)
    return synced


@pytest.mark.parametrize("forward_inside", [False, True])
def test_no_sync_is_decided_in_forward_like_torch(forward_inside: bool) -> None:
    results = dl.spawn(_mixed_no_sync, args=(forward_inside,), nprocs=2, backend="gloo")
    for synced in results:
        # forward outside + backward inside: torch syncs; forward inside: it does not
        assert synced["torch"] is (not forward_inside)
        assert synced["bucketed"] == synced["torch"]
