"""Checkers of chapter 07: a naive DDP wrapper, and bucketed gradient hooks.

Rank r receives only its own input (``learner.ranks``; when graded, a sandbox per rank,
``course.rankhost``): the architecture, its starting parameters and buffers, and its own shard
of each batch, never a seed and never another rank's data or model, so a result equal to the
full-batch oracle proves that the ranks communicated.

07.naive_ddp: the learner's ``MyDDP(module)`` (forward, ``sync_gradients()``) trains on
each rank's shard of hidden batches, in the learner's ranks (``probe_naive_ddp``, which
returns every rank's parameters and buffers). The oracles run here: a single-process model
trained on the full batch (same start as rank 0) and, for a BatchNorm model, torch's
``DistributedDataParallel`` on ranks of the grader's own. Every rank starts from a different
model, so a wrapper that skips the initial broadcast fails; a hidden buffer used in forward
catches one that forgets buffers; the step size catches one that sums instead of averaging.

07.bucketed: the learner's ``GradBuckets(module, bucket_cap_mb)`` registers gradient hooks,
and ``wait()`` completes the averaging after backward. ``probe_bucketed`` returns the
parameters after a few steps and the ``dist.all_reduce`` calls seen during the last backward
(at least two, all asynchronous, in bucket index order: the model's ``pre`` layer, defined
last and used first, makes bucket 0 the last to fill); the parameters are compared here with a single-process
model trained on the full batch (tests/test_bucketed_ddp.py compares the package's
BucketedDDP with torch's DDP).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.course.grading import checker, fail, wrong_form
from ddp_lab.i18n import N_, _t, lookup

MESSAGES = {
    "naive_shifted": N_(
        "expected parameters and buffers equal to a single-process model trained "
        "on the full batch; rank {rank}: max difference {diff:.3g}"
    ),
    "naive_bn": N_(
        "expected parameters and BatchNorm buffers equal to torch's "
        "DistributedDataParallel; rank {rank}: max difference {diff:.3g}"
    ),
}

TOL = 1e-9  # float64 models: only summation order may differ from the oracles


class ShiftedMLP(nn.Module):
    """An MLP with a frozen layer, an input shift kept as a buffer, and a ``pre`` layer
    defined last but used first (its gradients arrive last, in bucket 0 of ``assign_buckets``)."""

    def __init__(self, d_in: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.register_buffer("shift", torch.randn(d_in))
        self.frozen = nn.Linear(d_in, hidden).requires_grad_(False)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Tanh(), nn.Linear(hidden, hidden)]
        self.body = nn.Sequential(*layers, nn.Tanh(), nn.Linear(hidden, 2))
        self.pre = nn.Linear(d_in, d_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.frozen(self.pre(x - self.shift)))


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


_ARCH = ("kind", "d_in", "hidden", "depth", "lr")


def _rank_input(spec: dict, model: nn.Module, rank: int, world_size: int) -> dict[str, Any]:
    """What rank r receives: the architecture, its starting model's parameters and buffers,
    and its own shard of each batch (never a seed, never another rank's data or model)."""
    mine = slice(rank * spec["per_rank"], (rank + 1) * spec["per_rank"])
    return {
        **{k: spec[k] for k in _ARCH},
        "init": _states(model),
        "batches": [[x[mine], y[mine]] for x, y in _batches(spec, world_size)],
    }


def _rank_inputs(spec: dict, world_size: int, own_models: bool) -> list[dict[str, Any]]:
    """Every rank's input; ``own_models``: rank r starts from the model of seed ``seed + r``
    (otherwise all from ``seed``)."""
    out = []
    for rank in range(world_size):
        with torch.random.fork_rng(devices=[]):
            model = _build(spec, spec["seed"] + (rank if own_models else 0))
        out.append(_rank_input(spec, model, rank, world_size))
    return out


def _model_of(mine: dict) -> nn.Module:
    """In the rank: the model of ``mine``'s architecture, set to its starting state."""
    make = ShiftedMLP if mine["kind"] == "shifted" else bn_model
    model = make(mine["d_in"], mine["hidden"], mine["depth"]).double()
    at, init = 0, mine["init"]
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.copy_(init[at : at + t.numel()].reshape(t.shape))
            at += t.numel()
    return model


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


def _kind(value: Any) -> str:
    """A short, language-neutral description of what came back."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def _states_of(out: Any, want: torch.Tensor, rank: int, field: str, label: str) -> torch.Tensor:
    """``out`` when it is a tensor like ``want`` (parameters and buffers, flattened)."""
    if not isinstance(out, torch.Tensor) or out.shape != want.shape or out.dtype != want.dtype:
        raise wrong_form(rank, field, _kind(out), label)
    return out


def _ranks(got: Any, world_size: int, label: str) -> list:
    if not isinstance(got, list) or len(got) != world_size:
        raise wrong_form("-", "ranks", _kind(got), label)
    return got


def _train_single(spec: dict, world_size: int) -> torch.Tensor:
    """The oracle of the MLP cases: rank 0's model trained on the full global batches."""
    with torch.random.fork_rng(devices=[]):
        model = _build(spec, spec["seed"])
    opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
    for x, y in _batches(spec, world_size):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return _states(model)


def _oracle_bn(rank: int, spec: dict) -> torch.Tensor:
    """In the grader's ranks: torch's DDP on each rank's shard, every rank from its own model."""
    model = _build(spec, spec["seed"] + rank)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=spec["lr"])
    mine = slice(rank * spec["per_rank"], (rank + 1) * spec["per_rank"])
    for x, y in _batches(spec, dist.get_world_size()):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
        opt.step()
    return _states(model)


def _spawn(fn: Callable, args: tuple, world_size: int) -> list[Any]:
    from ddp_lab.runtime.launcher import spawn

    return spawn(fn, args=args, nprocs=world_size, backend="gloo", quiet=True, timeout=120)


def probe_naive_ddp(rank: int, objects: tuple, mine: dict) -> torch.Tensor:
    """In the learner's rank: their wrapper trains this rank's model (every rank starts from a
    different one) on its shard, the only data it receives (``_rank_input``)."""
    (my_ddp,) = objects
    model = _model_of(mine)
    ours = my_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=mine["lr"])
    for x, y in mine["batches"]:
        opt.zero_grad()
        nn.functional.mse_loss(ours(x), y).backward()
        ours.sync_gradients()
        opt.step()
    return _states(model)


def _torch_ddp() -> tuple[dict[str, Any], str]:
    """torch's own DistributedDataParallel: the oracle of the BatchNorm case, and what the
    exercise asks the learner to write (a wrapper around it passed every case)."""
    from torch.nn.parallel import DistributedDataParallel

    refused = {"torch.nn.parallel.DistributedDataParallel": DistributedDataParallel}
    return refused, "dist.broadcast, dist.all_reduce"


probe_naive_ddp.refuses = _torch_ddp  # type: ignore[attr-defined]  # course.learner.refusing


@checker("07.naive_ddp", points=3)
def check_naive_ddp(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = [(2, "shifted"), (2, "bn"), (rng.choice([3, 4]), "shifted")]
    yield len(cases)
    for world_size, kind in cases:
        label = f"world_size={world_size}, {'BatchNorm' if kind == 'bn' else 'MLP'}"
        spec = _spec(rng, kind)
        if kind == "bn":
            expected = _spawn(_oracle_bn, (spec,), world_size)
        else:
            expected = [_train_single(spec, world_size)] * world_size
        inputs = _rank_inputs(spec, world_size, own_models=True)
        got = _ranks(learner.ranks(probe_naive_ddp, inputs, timeout=120), world_size, label)
        for rank, (out, want) in enumerate(zip(got, expected, strict=True)):
            diff = (_states_of(out, want, rank, "states", label) - want).abs().max().item()
            if not diff <= TOL:  # nan fails too
                raise fail(lookup(MESSAGES, f"naive_{kind}", rank=rank, diff=diff), label)
        yield label


def probe_bucketed(rank: int, objects: tuple, mine: dict) -> dict[str, Any]:
    """In the learner's rank: their hooks average the gradients while a few steps train on
    this rank's shard, the only data it receives (``_rank_input``, with ``cap_mb``).

    Returns the parameters and buffers at the end, and whether each ``dist.all_reduce``
    call of the last backward pass was asynchronous (the rank's own account: a hint; the
    parameters are the proof).
    """
    (grad_buckets,) = objects
    model = _model_of(mine)
    cap_mb = mine["cap_mb"]
    calls: list[bool] = []
    sizes: list[int] = []
    real_all_reduce = dist.all_reduce

    def watched(*args: Any, **kwargs: Any) -> Any:
        calls.append(bool(kwargs.get("async_op", args[3] if len(args) > 3 else False)))
        tensor = args[0] if args else kwargs.get("tensor")
        sizes.append(tensor.numel() if isinstance(tensor, torch.Tensor) else -1)
        return real_all_reduce(*args, **kwargs)

    hooks = grad_buckets(model, cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=mine["lr"])
    during_backward: list[bool] = []
    dist.all_reduce = watched
    try:
        for x, y in mine["batches"]:
            calls.clear()
            sizes.clear()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            during_backward, sizes_during = list(calls), list(sizes)
            hooks.wait()
            opt.step()
    finally:
        dist.all_reduce = real_all_reduce
    return {"async_calls": during_backward, "sizes": sizes_during, "states": _states(model)}


@checker("07.bucketed", points=3)
def check_bucketed(rng: random.Random, learner: Any) -> Iterator[object]:
    from ddp_lab.buckets import assign_buckets

    world_sizes = [2, 2, rng.choice([3, 4])]
    yield len(world_sizes)
    for world_size in world_sizes:
        spec = _spec(rng, "shifted")
        spec["depth"] = rng.randint(2, 3)
        with torch.random.fork_rng(devices=[]):
            model = _build(spec, 0)
        trainable = [p for p in model.parameters() if p.requires_grad]
        cap_mb = max(p.numel() * p.element_size() for p in trainable) / 2**20  # several buckets
        in_order = [sum(trainable[i].numel() for i in b) for b in assign_buckets(trainable, cap_mb)]
        label = f"world_size={world_size}, bucket_cap_mb={cap_mb:.2g}"
        want = _train_single(spec, world_size)
        inputs = [
            {**mine, "cap_mb": cap_mb} for mine in _rank_inputs(spec, world_size, own_models=False)
        ]
        got = _ranks(learner.ranks(probe_bucketed, inputs, timeout=120), world_size, label)
        for rank, out in enumerate(got):
            if not isinstance(out, dict):
                raise wrong_form(rank, "result", _kind(out), label)
            calls = out.get("async_calls")
            if not isinstance(calls, list) or not all(type(c) is bool for c in calls):
                raise wrong_form(rank, "async_calls", _kind(calls), label)
            if len(calls) < 2:
                raise fail(
                    _t(
                        "expected at least 2 all_reduce calls during backward (one per bucket), "
                        "got {got} on rank {rank}",
                        got=len(calls),
                        rank=rank,
                    ),
                    label,
                )
            if not all(calls):
                raise fail(
                    _t(
                        "expected every all_reduce in a hook launched with async_op=True (not "
                        "blocking backward); rank {rank} made a blocking call",
                        rank=rank,
                    ),
                    label,
                )
            sizes = out.get("sizes")
            if not isinstance(sizes, list) or not all(type(n) is int for n in sizes):
                raise wrong_form(rank, "sizes", _kind(sizes), label)
            if sizes != in_order:
                raise fail(
                    _t(
                        "rank {rank} launched buckets of {got} elements; in index order they are "
                        "{want}: launch buckets strictly in index order (a bucket that fills "
                        "early waits for the ones before it), so that every rank issues the same "
                        "collectives in the same order",
                        rank=rank,
                        got=sizes,
                        want=in_order,
                    ),
                    label,
                )
            states = _states_of(out.get("states"), want, rank, "states", label)
            diff = (states - want).abs().max().item()
            if not diff <= TOL:
                raise fail(
                    _t(
                        "expected parameters equal to a single-process model trained on the full "
                        "batch; rank {rank}: max difference {diff:.3g}",
                        rank=rank,
                        diff=diff,
                    ),
                    label,
                )
        yield label
