"""Checkers of chapter 07: a naive DDP wrapper, and bucketed gradient hooks.

07.naive_ddp: the learner's ``MyDDP(module)`` (forward, ``sync_gradients()``) trains on
each rank's shard of hidden batches; the oracles are a single-process model trained on
the full batch (same start as rank 0) and, for a BatchNorm model, torch's
``DistributedDataParallel``. Every rank starts from a different model, so a wrapper that
skips the initial broadcast fails; a hidden buffer used in forward catches one that
forgets buffers; the step size catches one that sums instead of averaging.

07.bucketed: the learner's ``GradBuckets(module, bucket_cap_mb)`` registers gradient hooks,
and ``wait()`` completes the averaging after backward. Parameters are compared with a
single-process model trained on the full batch after a few steps (tests/test_bucketed_ddp.py
compares the package's BucketedDDP with torch's DDP), and ``dist.all_reduce`` is watched: at least two asynchronous calls
must happen while backward is still running.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.course.grading import checker, fail

TOL = 1e-9  # float64 models: only summation order may differ from the oracles


class ShiftedMLP(nn.Module):
    """An MLP with a frozen first layer and an input shift kept as a buffer."""

    def __init__(self, d_in: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.register_buffer("shift", torch.randn(d_in))
        self.frozen = nn.Linear(d_in, hidden).requires_grad_(False)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Tanh(), nn.Linear(hidden, hidden)]
        self.body = nn.Sequential(*layers, nn.Tanh(), nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.frozen(x - self.shift))


def bn_model(d_in: int, hidden: int, depth: int) -> nn.Module:
    """An MLP with BatchNorm layers: running statistics are buffers."""
    layers: list[nn.Module] = [nn.Linear(d_in, hidden)]
    for _ in range(depth):
        layers += [nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, hidden)]
    return nn.Sequential(*layers, nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 2))


def _build(spec: dict, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    make = ShiftedMLP if spec["kind"] == "shifted" else bn_model
    model = make(spec["d_in"], spec["hidden"], spec["depth"]).double()
    if spec["kind"] == "bn":  # non-trivial running statistics, different on every rank
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    return model


def _states(model: nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in [*model.parameters(), *model.buffers()]])


def _batches(spec: dict, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(spec["data_seed"])  # the same global batches everywhere
    n = spec["per_rank"] * world_size
    return [
        (
            torch.randn(n, spec["d_in"], generator=gen, dtype=torch.float64),
            torch.randn(n, 2, generator=gen, dtype=torch.float64),
        )
        for _ in range(spec["steps"])
    ]


def _naive_case(rank: int, my_ddp: Callable, spec: dict) -> str:
    world_size = dist.get_world_size()
    oracle = _build(spec, spec["seed"])  # rank 0's model: what the broadcast must spread
    model = _build(spec, spec["seed"] + rank)  # every rank starts from a different model
    if spec["kind"] == "bn":
        oracle = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    ours = my_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
    opt_oracle = torch.optim.SGD(oracle.parameters(), lr=spec["lr"])
    mine = slice(rank * spec["per_rank"], (rank + 1) * spec["per_rank"])
    for x, y in _batches(spec, world_size):
        opt.zero_grad()
        nn.functional.mse_loss(ours(x[mine]), y[mine]).backward()
        ours.sync_gradients()
        opt.step()
        opt_oracle.zero_grad()
        if spec["kind"] == "bn":  # torch DDP sees the same shard
            nn.functional.mse_loss(oracle(x[mine]), y[mine]).backward()
        else:  # the single-process model sees the whole global batch
            nn.functional.mse_loss(oracle(x), y).backward()
        opt_oracle.step()
    target = oracle.module if spec["kind"] == "bn" else oracle
    diff = (_states(model) - _states(target)).abs().max().item()
    return "" if diff <= TOL else f"rank {rank}: max difference {diff:.3g}"


def _spec(rng: random.Random, kind: str) -> dict:
    return {
        "kind": kind,
        "d_in": rng.randint(3, 6),
        "hidden": rng.randint(4, 9),
        "depth": rng.randint(1, 2),
        "seed": rng.randrange(10**6),
        "data_seed": rng.randrange(10**6),
        "per_rank": rng.randint(3, 5),
        "steps": rng.randint(3, 4),
        "lr": rng.choice([0.05, 0.1, 0.2]),
    }


def _run(fn: Callable, args: tuple, world_size: int) -> list[Any]:
    from ddp_lab import spawn

    return spawn(fn, args=args, nprocs=world_size, backend="gloo", quiet=True, timeout=120)


WHAT_NAIVE = {
    "shifted": "parameters and buffers equal to a single-process model trained on the full batch",
    "bn": "parameters and BatchNorm buffers equal to torch's DistributedDataParallel",
}


@checker("07.naive_ddp", points=3)
def check_naive_ddp(rng: random.Random, my_ddp: Callable) -> Iterator[object]:
    cases = [(2, "shifted"), (2, "bn"), (rng.choice([3, 4]), "shifted")]
    yield len(cases)
    for world_size, kind in cases:
        label = f"world_size={world_size}, {'BatchNorm' if kind == 'bn' else 'MLP'}"
        problems = [p for p in _run(_naive_case, (my_ddp, _spec(rng, kind)), world_size) if p]
        if problems:
            raise fail(f"expected {WHAT_NAIVE[kind]}; {problems[0]}", label)
        yield label


def _bucketed_case(rank: int, grad_buckets: Callable, spec: dict, cap_mb: float) -> str:
    model = _build(spec, spec["seed"])
    oracle = _build(spec, spec["seed"])  # a single-process model on the full batch
    calls: list[bool] = []
    real_all_reduce = dist.all_reduce

    def watched(*args: Any, **kwargs: Any) -> Any:
        calls.append(bool(kwargs.get("async_op", args[3] if len(args) > 3 else False)))
        return real_all_reduce(*args, **kwargs)

    hooks = grad_buckets(model, cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
    opt_oracle = torch.optim.SGD(oracle.parameters(), lr=spec["lr"])
    mine = slice(rank * spec["per_rank"], (rank + 1) * spec["per_rank"])
    during_backward: list[bool] = []
    dist.all_reduce = watched
    try:
        for x, y in _batches(spec, dist.get_world_size()):
            calls.clear()
            opt.zero_grad()
            nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            during_backward = list(calls)
            hooks.wait()
            opt.step()
            opt_oracle.zero_grad()
            nn.functional.mse_loss(oracle(x), y).backward()
            opt_oracle.step()
    finally:
        dist.all_reduce = real_all_reduce
    if len(during_backward) < 2:
        return (
            f"at least 2 all_reduce calls during backward (one per bucket), got "
            f"{len(during_backward)}"
        )
    if not all(during_backward):
        return "every all_reduce in a hook launched with async_op=True (not blocking backward)"
    diff = (_states(model) - _states(oracle)).abs().max().item()
    return (
        ""
        if diff <= TOL
        else (
            f"parameters equal to a single-process model trained on the "
            f"full batch; max difference {diff:.3g}"
        )
    )


@checker("07.bucketed", points=3)
def check_bucketed(rng: random.Random, grad_buckets: Callable) -> Iterator[object]:
    world_sizes = [2, 2, rng.choice([3, 4])]
    yield len(world_sizes)
    for world_size in world_sizes:
        spec = _spec(rng, "shifted")
        spec["depth"] = rng.randint(2, 3)
        model = _build(spec, 0)
        sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
        cap_mb = max(sizes) / 2**20  # several buckets whatever the sizes
        label = f"world_size={world_size}, bucket_cap_mb={cap_mb:.2g}"
        problems = [p for p in _run(_bucketed_case, (grad_buckets, spec, cap_mb), world_size) if p]
        if problems:
            raise fail(f"expected {problems[0]}", label)
        yield label
