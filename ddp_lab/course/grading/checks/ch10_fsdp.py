"""Checker of chapter 10's 10.fsdp_reduce (see ``ch10``'s docstring; ``ch10`` imports this
module, so that loading chapter 10's checkers registers it).

The learner's ``reduce_grad(flat_grad)`` replaces the reduce-scatter of FSDP's machinery
(``ddp_lab.fsdp_base.FullyShardedBase``, ``probe_fsdp``); training must equal single-process
training on the full batch, computed here, and an all-reduce or an all-gather fails.

What ``probe_fsdp`` reports about the collectives (``comm_debug.watch_c10d``, in the rank's
thread) is the rank's own account. When grading, ``ch10_fsdp_bytes`` then runs reduce_grad
alone on large gradients at N = 3, in ranks that allow only reduce-scatters and
point-to-point messages, and bounds the bytes each rank received, counted by the grader from
outside the ranks; in self-study the rank's own account is all there is.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.comm_debug import tensors_of, watch_c10d
from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.ch10_forms import _bad, _flat, _like, _load, _ranks
from ddp_lab.course.grading.checks.ch10_fsdp_bytes import N_OBSERVED, check_bytes
from ddp_lab.fsdp_base import FullyShardedBase
from ddp_lab.i18n import _t

# ----- 10.fsdp_reduce ---------------------------------------------------------------------

# Collectives that hand every rank the whole gradient (or every rank's): not a reduce-scatter.
# Names as ``comm_debug.watch_c10d`` logs them (all_gather_single ends in the operator of
# all_gather_into_tensor; a loop of broadcasts is an all-gather too).
WHOLE = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "broadcast",
)
# Collectives that can be part of a reduce-scatter (a shard to each rank) or of an all-gather
# (whole gradients): the rank's own count of what they (and recv) brought in decides.
RECEIVING = ("recv", "gather", "scatter", "all_to_all", "all_to_all_single")


def _fsdp_net(spec: dict) -> nn.Module:
    torch.manual_seed(spec["seed"])
    return _fsdp_layers(spec["widths"])


def _fsdp_layers(widths: list[int]) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).double()


def _fsdp_batches(spec: dict, world: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(spec["data_seed"])
    widths = spec["widths"]
    for _ in range(3):
        x = torch.randn(world * 3, widths[0], generator=gen, dtype=torch.float64)
        y = torch.randn(world * 3, widths[-1], generator=gen, dtype=torch.float64)
        yield x, y


def _fsdp_inputs(spec: dict, world: int) -> list[dict[str, Any]]:
    """Rank r's input: the widths, the starting parameters (the same on every rank) and rank
    r's own part of each batch (never a seed or another rank's data)."""
    with torch.random.fork_rng(devices=[]):
        init = _flat(_fsdp_net(spec).parameters())
    batches = list(_fsdp_batches(spec, world))
    return [
        {
            "widths": spec["widths"],
            "init": init,
            "batches": [[x[r * 3 : r * 3 + 3], y[r * 3 : r * 3 + 3]] for x, y in batches],
        }
        for r in range(world)
    ]


# The probe runs in the learner's process after their code; ``guard.seal`` freezes the code
# and defaults of ddp_lab's functions there, not module attributes (review 10 rebound
# ``comm_debug.watch_c10d`` from a learner's object): what the probe reads while it records
# is bound as its positional defaults (an immutable tuple) when this module loads.
_FSDP_BOUND = (watch_c10d, tensors_of, FullyShardedBase, WHOLE, RECEIVING, _fsdp_layers, _load)


def probe_fsdp(
    rank: int,
    objects: tuple,
    mine: dict,
    _bound: tuple = _FSDP_BOUND,
    _builtins: tuple = (sum, max, isinstance, list),
) -> dict[str, Any]:
    """In the learner's rank: FSDP's machinery (``ddp_lab.fsdp_base``: ``ddp_lab.fsdp``, which
    holds the reference reduce-scatter, is hidden here) trains this rank's part of each batch,
    the only data it receives (``_fsdp_inputs``), with their ``reduce_grad``.

    Returns, per call of ``reduce_grad``, the gradient's size, the result's shape (None if
    not a tensor) and the first all-reduce or all-gather it called ('' if none: the rank's own
    account); the full state after three steps, or the error that stopped training (a wrong
    result makes the machinery raise).
    """
    watch, tensors_of_, base, whole_names, receiving, layers, load = _bound
    sum_, max_, isinstance_, list_ = _builtins
    (reduce_grad,) = objects
    calls: list[list] = []
    world = dist.get_world_size()

    def recorded(flat: torch.Tensor) -> torch.Tensor:
        # c10d operators, not torch.distributed's names: an all_reduce imported by name, a
        # process group's method or torch.ops.c10d is seen as well
        got: dict[str, int] = {}

        def on_call(name: str, args: tuple) -> None:
            # what a gather (at its root), a scatter or an all_to_all brings in: its outputs
            # (the first argument), less this rank's own part where every rank has one
            if name in receiving[1:] and args:
                size = sum_(t.numel() * t.element_size() for t in tensors_of_(args[0]))
                got[name] = got.get(name, 0) + (size if name == "scatter" else size - size // world)

        with watch(on_call) as log:
            out = reduce_grad(flat)
        shape = list_(out.shape) if isinstance_(out, torch.Tensor) else None
        whole = [name for name, _, _ in log.calls if name in whole_names]
        # by hand: a reduce-scatter receives at most one shard from each other rank; an
        # all-gather (every rank's whole gradient) receives world - 1 gradients
        got["recv"] = sum_(b for name, _, b in log.calls if name == "recv")
        if sum_(got.values()) > (world - 1) * (flat.numel() // world) * flat.element_size():
            whole.append(max_(got, key=lambda name: got[name]))
        calls.append([flat.numel(), shape, whole[0] if whole else ""])
        return out

    net = layers(mine["widths"])
    load(net.parameters(), mine["init"])
    model = base(net, reduce_grad=recorded)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for x, y in mine["batches"]:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001  # reported with what reduce_grad returned
        error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        return {"calls": calls, "error": error, "state": None}
    state = {k: v.clone() for k, v in model.full_state_dict().items()}
    return {"calls": calls, "error": None, "state": state}


def _sgd_full_batch(spec: dict, world: int) -> dict[str, torch.Tensor]:
    """The oracle: plain SGD, one process, on the whole batch of every step."""
    with torch.random.fork_rng(devices=[]):
        net = _fsdp_net(spec)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in _fsdp_batches(spec, world):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _fsdp_verdict(got: Any, spec: dict, world: int, label: str) -> None:
    from ddp_lab.course.grading.learner import LearnerError

    results = _ranks(got, world, ("calls", "error", "state"), label)
    for rank, r in enumerate(results):
        calls = r["calls"]
        if not isinstance(calls, list) or not all(
            isinstance(c, list)
            and len(c) == 3
            and type(c[0]) is int
            and (c[1] is None or isinstance(c[1], list) and all(type(s) is int for s in c[1]))
            and type(c[2]) is str
            and c[2] in ("", *RECEIVING, *WHOLE)
            for c in calls
        ):
            raise _bad(rank, "calls", calls, label)
        for n, _, called in calls:
            if called in RECEIVING:
                raise fail(
                    _t(
                        "reduce_grad received more by dist.{name} than a reduce-scatter does "
                        "(one shard of {shard} elements from each other rank): every rank "
                        "received the whole gradient (or every rank's) although it keeps only "
                        "its shard; use dist.reduce_scatter_single (reduce-scatter)",
                        name=called,
                        shard=n // world,
                    ),
                    label,
                )
            if called:
                raise fail(
                    _t(
                        "reduce_grad called dist.{name}: every rank received the whole gradient "
                        "(or every rank's) although it keeps only its shard; use "
                        "dist.reduce_scatter_single (reduce-scatter)",
                        name=called,
                    ),
                    label,
                )
        for n, shape, _ in calls:
            if shape != [n // world]:
                got_shape = tuple(shape) if shape is not None else None
                raise fail(
                    _t(
                        "reduce_grad returned shape {got} for a gradient of {n} elements on "
                        "{world} ranks; expected this rank's shard, shape ({want},)",
                        got=got_shape,
                        n=n,
                        world=world,
                        want=n // world,
                    ),
                    label,
                )
    for rank, r in enumerate(results):
        if r["error"] is not None:
            if not isinstance(r["error"], str):
                raise _bad(rank, "error", r["error"], label)
            type_name, _, message = r["error"].partition(": ")
            raise LearnerError(type_name[:100], message[:300])
    want = _sgd_full_batch(spec, world)
    for rank, r in enumerate(results):
        state = r["state"]
        if not isinstance(state, dict) or sorted(state) != sorted(want):
            raise _bad(rank, "state", state, label)
        for k, v in want.items():
            if not _like(state[k], v):
                raise _bad(rank, f"state[{k!r}]", state[k], label)
        diff = max((state[k] - v).abs().max().item() for k, v in want.items())
        if not diff <= 1e-10:
            raise fail(
                _t(
                    "rank {rank}: parameters differ from single-process training on the full "
                    "batch by {diff:.3g} (return the average over the ranks, not the sum)",
                    rank=rank,
                    diff=diff,
                ),
                label,
            )


@checker("10.fsdp_reduce", points=2)
def check_fsdp_reduce(rng: random.Random, learner: Any) -> Iterator[object]:
    worlds = [2, 3]
    yield len(worlds)
    for world in worlds:
        spec = {
            "seed": rng.randrange(10**6),
            "data_seed": rng.randrange(10**6),
            "widths": [rng.randint(2, 9) for _ in range(rng.randint(3, 4))],
        }
        label = running(_t("world_size={world}, uneven shards", world=world))
        got = learner.ranks(probe_fsdp, _fsdp_inputs(spec, world), timeout=120)
        _fsdp_verdict(got, spec, world, label)
        if world == N_OBSERVED:  # last: its ranks' lock lasts for their life
            check_bytes(rng, learner, world, label)
        yield label
