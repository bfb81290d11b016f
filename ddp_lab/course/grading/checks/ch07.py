"""Checkers of chapter 07: a naive DDP wrapper, and bucketed gradient hooks.

Rank r receives only its own input (``learner.ranks``; when graded, a sandbox per rank,
``course.grading.rankhost``): the architecture, its starting parameters and buffers, and its own shard
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
parameters after a few steps and what happened during the last backward, in order: each
gradient becoming ready (a hook of the probe's, registered before the learner's), each
all-reduce started (a dispatch mode sees ``c10d.allreduce_`` whatever Python name called it,
``from torch.distributed import all_reduce`` included) and each wait on a ``Work`` or a
``Future`` (a blocking ``all_reduce`` waits inside torch). The checker's rules on those
events: at least two all-reduces before backward returns, in bucket index order, none waited
for before it returns, and, in the models whose bucket 0 fills first (``pre`` defined first),
one started before the last gradient is ready; in the model whose ``pre`` layer is defined
last and used first, bucket 0 fills last, so index order holds back every bucket to the last
hook. The parameters are compared here with a single-process model trained on the full batch
(tests/test_bucketed_ddp.py compares the package's BucketedDDP with torch's DDP).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.course.grading import checker, fail, running, wrong_form
from ddp_lab.course.grading.checks.ch07_events import _watching
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
    # What the two commonest mistakes look like, said as such (the difference alone says
    # nothing a learner can act on).
    "naive_apart": N_(
        "rank {rank} ended with other parameters or buffers than rank 0 (max difference "
        "{diff:.3g}): here every rank starts from a model of its own, so broadcast rank 0's "
        "parameters and buffers when you wrap the model, and average every gradient"
    ),
    "naive_sum": N_(
        "rank {rank}'s parameters are what gradients summed over the ranks give, not "
        "averaged: divide the all-reduced gradients by the world size"
    ),
    "bucketed_states": N_(
        "expected parameters equal to a single-process model trained on the full "
        "batch; rank {rank}: max difference {diff:.3g}"
    ),
}

TOL = 1e-9  # float64 models: only summation order may differ from the oracles


class ShiftedMLP(nn.Module):
    """An MLP with a frozen layer, an input shift kept as a buffer, and a ``pre`` layer used
    first. Defined last (the default), its gradients arrive last and sit in bucket 0 of
    ``assign_buckets``, so bucket 0 fills last; defined first (``pre_first``), the buckets fill
    in index order and bucket 0 can go out while backward still runs."""

    def __init__(self, d_in: int, hidden: int, depth: int, pre_first: bool = False) -> None:
        super().__init__()
        if pre_first:  # registration order is parameters() order, which assign_buckets reverses
            self.pre = nn.Linear(d_in, d_in)
        self.register_buffer("shift", torch.randn(d_in))
        self.frozen = nn.Linear(d_in, hidden).requires_grad_(False)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Tanh(), nn.Linear(hidden, hidden)]
        self.body = nn.Sequential(*layers, nn.Tanh(), nn.Linear(hidden, 2))
        if not pre_first:
            self.pre = nn.Linear(d_in, d_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.frozen(self.pre(x - self.shift)))


def bn_model(d_in: int, hidden: int, depth: int) -> nn.Module:
    """An MLP with BatchNorm layers: running statistics are buffers."""
    layers: list[nn.Module] = [nn.Linear(d_in, hidden)]
    for _ in range(depth):
        layers += [nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, hidden)]
    return nn.Sequential(*layers, nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 2))


def _make(spec: dict) -> nn.Module:
    """The untrained model of ``spec``'s kind: "shifted" (``pre`` defined last), "in_order"
    (``pre`` defined first) or "bn"."""
    if spec["kind"] == "bn":
        return bn_model(spec["d_in"], spec["hidden"], spec["depth"])
    return ShiftedMLP(spec["d_in"], spec["hidden"], spec["depth"], spec["kind"] == "in_order")


def _build(spec: dict, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = _make(spec).double()
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
    model = _make(mine).double()
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


probe_naive_ddp.refuses = _torch_ddp  # type: ignore[attr-defined]  # course.grading.learner.refusing


@checker("07.naive_ddp", points=3)
def check_naive_ddp(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = [(2, "shifted"), (2, "bn"), (rng.choice([3, 4]), "shifted")]
    yield len(cases)
    for world_size, kind in cases:
        label = running(f"world_size={world_size}, {'BatchNorm' if kind == 'bn' else 'MLP'}")
        spec = _spec(rng, kind)
        if kind == "bn":
            expected = _spawn(_oracle_bn, (spec,), world_size)
        else:
            expected = [_train_single(spec, world_size)] * world_size
        inputs = _rank_inputs(spec, world_size, own_models=True)
        got = _ranks(learner.ranks(probe_naive_ddp, inputs, timeout=120), world_size, label)
        states = [
            _states_of(out, want, r, "states", label)
            for r, (out, want) in enumerate(zip(got, expected, strict=True))
        ]
        diffs = [
            (out - want).abs().max().item() for out, want in zip(states, expected, strict=True)
        ]
        wrong = [r for r, d in enumerate(diffs) if not d <= TOL]  # nan fails too
        if wrong:
            # The ranks apart from each other: something was not broadcast, or not averaged.
            aparts = [(states[r] - states[0]).abs().max().item() for r in range(world_size)]
            for rank, apart in enumerate(aparts):
                if not apart <= TOL:
                    raise fail(lookup(MESSAGES, "naive_apart", rank=rank, diff=apart), label)
            rank = wrong[0]
            if kind == "shifted":
                _fail_if_summed(states[rank], spec, world_size, rank, label)
            raise fail(lookup(MESSAGES, f"naive_{kind}", rank=rank, diff=diffs[rank]), label)
        yield label


def _fail_if_summed(states: Any, spec: dict, world_size: int, rank: int, label: str) -> None:
    """Gradients summed, not averaged, give one process's run with ``world_size`` times the lr."""
    summed = _train_single({**spec, "lr": spec["lr"] * world_size}, world_size)
    if (states - summed).abs().max().item() <= TOL:
        raise fail(lookup(MESSAGES, "naive_sum", rank=rank), label)


def probe_bucketed(
    rank: int,
    objects: tuple,
    mine: dict,
    _bound: tuple = (_watching, _model_of, _states),  # bound at import: see ``ch07_events``
) -> dict[str, Any]:
    """In the learner's rank: their hooks average the gradients while a few steps train on
    this rank's shard, the only data it receives (``_rank_input``, with ``cap_mb``).

    Returns the parameters and buffers at the end, and the events of the last backward pass,
    in order (the rank's own account, which the checker judges; the parameters are the
    proof): ``["ready", i]`` when trainable parameter i's gradient is accumulated,
    ``["all_reduce", n]`` when an all-reduce of n elements starts, ``["wait", 0]`` at a wait
    on a ``Work`` or ``Future``, ``["returned", 0]`` when ``backward()`` returned.
    """
    (grad_buckets,) = objects
    watching, model_of, states_of = _bound
    model = model_of(mine)
    events: list[list] = []
    trainable = [p for p in model.parameters() if p.requires_grad]
    for i, p in enumerate(trainable):
        # Registered before the learner's hooks, so this one runs first: a gradient is noted
        # ready before anything the learner's hook launches for it.
        p.register_post_accumulate_grad_hook(lambda _, i=i: events.append(["ready", i]))
    hooks = grad_buckets(model, mine["cap_mb"])
    opt = torch.optim.SGD(model.parameters(), lr=mine["lr"])
    last: list[list] = []
    with watching(events):
        for x, y in mine["batches"]:
            events.clear()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            events.append(["returned", 0])
            last = [list(e) for e in events]
            hooks.wait()
            opt.step()
    return {"events": last, "states": states_of(model)}


def _backward_events(out: dict, rank: int, trainable: int, label: str) -> list[tuple[str, int]]:
    """The rank's events of its last backward, checked to be of the form the probe writes:
    each trainable parameter ready once, ``returned`` last and only there."""
    events = out.get("events")
    kinds = ("ready", "all_reduce", "wait", "returned")
    if not (
        isinstance(events, list)
        and all(
            isinstance(e, list) and len(e) == 2 and e[0] in kinds and type(e[1]) is int
            for e in events
        )
        and events
        and events[-1] == ["returned", 0]
        and [e[0] for e in events].count("returned") == 1
        and sorted(i for kind, i in events if kind == "ready") == list(range(trainable))
    ):
        raise wrong_form(rank, "events", _kind(events), label)
    return [(kind, n) for kind, n in events]


@checker("07.bucketed", points=3)
def check_bucketed(rng: random.Random, learner: Any) -> Iterator[object]:
    from ddp_lab.buckets import assign_buckets

    # "in_order": bucket 0 fills first, so a right solution launches it while backward still
    # runs; "shifted": bucket 0 fills last, so index order holds every bucket back to the last
    # hook (a solution that launches buckets as they fill fails there).
    cases = [(2, "in_order"), (2, "shifted"), (rng.choice([3, 4]), "in_order")]
    yield len(cases)
    for world_size, kind in cases:
        spec = _spec(rng, kind)
        spec["depth"] = rng.randint(2, 3)
        with torch.random.fork_rng(devices=[]):
            model = _build(spec, 0)
        trainable = [p for p in model.parameters() if p.requires_grad]
        cap_mb = max(p.numel() * p.element_size() for p in trainable) / 2**20  # several buckets
        in_order = [sum(trainable[i].numel() for i in b) for b in assign_buckets(trainable, cap_mb)]
        label = running(f"world_size={world_size}, bucket_cap_mb={cap_mb:.2g}")
        want = _train_single(spec, world_size)
        inputs = [
            {**mine, "cap_mb": cap_mb} for mine in _rank_inputs(spec, world_size, own_models=False)
        ]
        got = _ranks(learner.ranks(probe_bucketed, inputs, timeout=120), world_size, label)
        for rank, out in enumerate(got):
            if not isinstance(out, dict):
                raise wrong_form(rank, "result", _kind(out), label)
            events = _backward_events(out, rank, len(trainable), label)
            sizes = [n for what, n in events if what == "all_reduce"]
            if len(sizes) < 2:
                raise fail(
                    _t(
                        "expected at least 2 all_reduce calls during backward (one per bucket), "
                        "got {got} on rank {rank}",
                        got=len(sizes),
                        rank=rank,
                    ),
                    label,
                )
            if ("wait", 0) in events:  # a blocking all_reduce waits inside torch too
                raise fail(
                    _t(
                        "rank {rank} waited for an all_reduce before backward returned (a "
                        "blocking call, a wait right after the launch, or a loop polling "
                        "is_completed() until it is done): launch each bucket "
                        "with async_op=True and wait for the works only in wait(), so that "
                        "communication overlaps backward",
                        rank=rank,
                    ),
                    label,
                )
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
            last_ready = max(at for at, (what, _) in enumerate(events) if what == "ready")
            early = [what for what, _ in events[:last_ready] if what == "all_reduce"]
            if kind == "in_order" and not early:
                raise fail(
                    _t(
                        "rank {rank} started no all_reduce before the last gradient was ready, "
                        "although bucket 0 of this model fills first: launch each bucket from "
                        "on_grad_ready as soon as it and the buckets before it are complete, not "
                        "once backward is over",
                        rank=rank,
                    ),
                    label,
                )
            states = _states_of(out.get("states"), want, rank, "states", label)
            diff = (states - want).abs().max().item()
            if not diff <= TOL:
                _fail_if_summed(states, spec, world_size, rank, label)
                raise fail(lookup(MESSAGES, "bucketed_states", rank=rank, diff=diff), label)
        yield label
