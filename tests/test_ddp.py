"""NaiveDDP against the oracles: torch's DistributedDataParallel and a single-process model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab as dl
from ddp_lab.ddp import NaiveDDP, max_difference_across_ranks, module_states


class FrozenMLP(nn.Module):
    """An MLP whose first layer is frozen, plus a buffer used in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(6, 8)
        self.frozen.requires_grad_(False)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
        self.register_buffer("shift", torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.frozen(x - self.shift))


def bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


MODELS = {"frozen": FrozenMLP, "batchnorm": bn_net}


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in module_states(module)])


def _vs_torch_ddp(rank: int, kind: str, steps: int) -> dict:
    torch.manual_seed(1000 + rank)  # different on every rank: the broadcast must fix it
    net = MODELS[kind]()
    ours, theirs = NaiveDDP(net), DDP(copy.deepcopy(net))
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(7 + rank)  # each rank its own data
    for _ in range(steps):
        x, y = torch.randn(5, 6, generator=gen), torch.randn(5, 2, generator=gen)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            if model is ours:
                ours.sync_gradients()
            opt.step()
    # Buffers are rank 0's before each forward, then each rank's own batch updates them:
    # compare parameters across ranks, and everything (buffers too) against torch.
    params = torch.cat([p.detach().reshape(-1) for p in ours.module.parameters()])
    spread = params.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return {
        "vs_torch": (_flat(ours.module) - _flat(theirs.module)).abs().max().item(),
        "param_spread": (spread - params).abs().max().item(),
    }


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("kind", ["frozen", "batchnorm"])
def test_naive_ddp_matches_torch_ddp(world_size: int, kind: str) -> None:
    results = dl.spawn(
        _vs_torch_ddp, args=(kind, 4), nprocs=world_size, backend="gloo", quiet=True, timeout=120
    )
    for r in results:
        # 2 ranks: bitwise. 4 ranks: gloo's ring may add the four terms in another order
        # than torch's bucketed all-reduce does, so float32 rounding may differ slightly.
        assert r["vs_torch"] <= (0.0 if world_size == 2 else 1e-6), r
        assert r["param_spread"] == 0.0, r


def _vs_single_process(rank: int, world_size: int, steps: int) -> float:
    torch.manual_seed(50 + rank)
    ours = NaiveDDP(FrozenMLP().double())
    torch.manual_seed(50)  # rank 0's model, the one the broadcast spreads
    single = FrozenMLP().double()
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.2)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.2)
    gen = torch.Generator().manual_seed(3)  # the same global batches on every rank
    per_rank = 4
    for _ in range(steps):
        x = torch.randn(per_rank * world_size, 6, generator=gen, dtype=torch.float64)
        y = torch.randn(per_rank * world_size, 2, generator=gen, dtype=torch.float64)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        opt_ours.zero_grad()
        nn.functional.mse_loss(ours(x[mine]), y[mine]).backward()
        ours.sync_gradients()
        opt_ours.step()
        opt_single.zero_grad()
        nn.functional.mse_loss(single(x), y).backward()
        opt_single.step()
    return (_flat(ours.module) - _flat(single)).abs().max().item()


@pytest.mark.parametrize("world_size", [2, 4])
def test_naive_ddp_equals_full_batch_single_process(world_size: int) -> None:
    diffs = dl.spawn(
        _vs_single_process,
        args=(world_size, 5),
        nprocs=world_size,
        backend="gloo",
        quiet=True,
        timeout=120,
    )
    assert max(diffs) < 1e-12, diffs


def _spread_before_after(rank: int) -> tuple[float, float]:
    torch.manual_seed(rank)
    net = bn_net()
    before = max_difference_across_ranks(net)
    NaiveDDP(net)
    return before, max_difference_across_ranks(net)


def test_broadcast_makes_replicas_identical() -> None:
    results = dl.spawn(_spread_before_after, nprocs=2, backend="gloo", quiet=True)
    assert all(before > 0.01 and after == 0.0 for before, after in results), results


def _unused_parameter(rank: int) -> float:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 1), nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # rank 1 never uses head b: its gradient is None there
            return self.a(x) + (self.b(x) if rank == 0 else 0)

    model = NaiveDDP(TwoHeads())
    model(torch.ones(2, 3)).sum().backward()
    model.sync_gradients()
    return model.module.b.weight.grad.sum().item()


def test_unused_parameter_gets_zero_gradient_and_does_not_hang() -> None:
    a, b = dl.spawn(_unused_parameter, nprocs=2, backend="gloo", quiet=True, timeout=60)
    assert a == b == pytest.approx(2 * 3 / 2)  # rank 0's sum of ones over 2 rows, halved


def test_errors_before_anything_starts() -> None:
    with pytest.raises(TypeError, match="nn.Module"):
        NaiveDDP("not a model")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="init_process_group"):
        NaiveDDP(nn.Linear(2, 2))
    dl.set_language("zh")
    try:
        with pytest.raises(RuntimeError, match="进程组"):
            NaiveDDP(nn.Linear(2, 2))
    finally:
        dl.set_language("en")


def _buffer_sync(rank: int, kwargs: dict) -> list[bool]:
    """Buffers equal across ranks after construction, after a training forward; per wrapper."""
    import warnings

    from ddp_lab.bucketed_ddp import BucketedDDP

    out = []
    for wrap in (DDP, NaiveDDP, BucketedDDP):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        net[1].running_mean.fill_(float(rank))  # rank-local buffer values
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = wrap(net, **kwargs)
        after_init = max_difference_across_ranks(net) == 0.0
        model(torch.randn(5, 3) + rank)
        net[1].running_mean.fill_(float(rank))  # diverge again; the next forward decides
        model(torch.randn(5, 3))
        after_forward = max_difference_across_ranks(net) == 0.0
        out.append((after_init, after_forward))
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"forward_sync_buffers": False},
        {"forward_sync_buffers": True},
        {"broadcast_buffers": False},
        {"broadcast_buffers": True},
    ],
)
def test_buffer_sync_follows_torch_2_13(kwargs):
    # forward_sync_buffers=False still syncs at construction; broadcast_buffers=False not.
    from ddp_lab.tools.doctor import torch_features

    if "forward_sync_buffers" in kwargs and not torch_features()["DDP(forward_sync_buffers=)"]:
        pytest.skip(f"torch {torch.__version__}'s DDP has no forward_sync_buffers to compare with")
    for torch_ddp, naive, bucketed in dl.spawn(
        _buffer_sync, args=(kwargs,), nprocs=2, backend="gloo"
    ):
        assert naive == torch_ddp, (kwargs, naive, torch_ddp)
        assert bucketed == torch_ddp, (kwargs, bucketed, torch_ddp)


def test_broadcast_buffers_is_deprecated_in_both_languages():
    from ddp_lab import i18n
    from ddp_lab.ddp import resolve_buffer_sync

    for lang, needle in [("en", "deprecated"), ("zh", "已弃用")]:
        before = i18n.get_language()
        i18n.set_language(lang)
        try:
            with pytest.warns(FutureWarning, match=needle):
                assert resolve_buffer_sync(False, None) == (False, False)
        finally:
            i18n.set_language(before)
    assert resolve_buffer_sync(None, False) == (False, True)
    assert resolve_buffer_sync(None, None) == (True, True)
