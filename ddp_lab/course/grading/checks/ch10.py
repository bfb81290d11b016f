"""Checkers of chapter 10: a ZeRO-1 optimizer, a bf16 comm hook, FSDP's gradient reduction.

All three are graded in the per-rank form (``learner.ranks``; when graded, a sandbox per rank,
``course.grading.rankhost``, in which ``ddp_lab.zero``, ``ddp_lab.comm_hooks`` and ``ddp_lab.fsdp``,
which hold the reference answers, cannot be imported): rank r receives only its own input,
the model's starting parameters and its own part of each batch, never a seed or another
rank's data. The oracles run here, in one process (or, for the bf16 hook, on ranks of the
grader's own), on the whole batch; a result equal to them proves that the ranks communicated.
What a rank reports about *how* it communicated (which parameters its optimizer was given,
the dtypes and bytes of its collectives) is its own account, checked as given.

10.sharded_optimizer: the learner's ``MySharded(params, optimizer_class,
**defaults)`` trains hidden models (tied weights, a frozen layer, odd shapes, their parts
defined in an order far from largest first: ``sharded_specs`` draws each again until the
rule's loads differ from those of ``WRONG_RULES``, in definition order, smallest first, round
robin, by count) on 2 or 3 ranks, each rank on its part of the batch, with gradients averaged as DDP does
(``probe_sharded``). The probe passes its own ``optimizer_class`` (AdamW with weight decay
that records which parameters each instance was given) and returns each rank's shard and
parameters: every trainable parameter must belong to exactly one rank (a ZeRO that steps
all parameters on every rank fails), the ranks' loads must be those of the exercise's rule
(largest parameter first, each to the least loaded rank: the multiset of loads does not
depend on how ties are broken, so any order among equal sizes or loads passes), and after
the steps every rank's parameters must equal those of AdamW on the full batch, computed
here. Each rank is given its own learning rate, and the oracle steps each parameter at its
owner's: a rank that forgets to share the updated parameters, or steps them all itself at its
own rate, fails. That alone does not prove the broadcasts: the gradients are averaged, so a
rank that learns the others' rates (one all-gather of a number), keeps AdamW state for every
parameter and steps them all at their owners' rates ends with the same parameters, and the
shard its inner optimizer was given is its own account. When grading, ``ch10_sharded_bytes``
then steps the optimizer alone on large parameters, one step per call, and bounds from below
the bytes each rank received, counted by the grader from outside the ranks: at each step a
rank must receive the parameters it does not own. A rank that steps every parameter and also
receives them (memory not sharded, the bytes moved anyway) still passes: the bytes cannot see
what a rank keeps; in self-study the training cases are all there is.

10.bf16_hook (in ``ch10_hooks``): the learner's hook is registered on torch's DDP for hidden
models (``probe_bf16_hook``, which returns the gradients after backward and what the hook's
collectives carried); the gradients must equal those under torch's ``bf16_compress_hook``
(on the grader's ranks) bit for bit, and the collectives must carry bfloat16, 2 bytes per
gradient element.

10.fsdp_reduce (in ``ch10_fsdp``; the forms of the ranks' results all three check are in
``ch10_forms``): the learner's ``reduce_grad(flat_grad)`` replaces the reduce-scatter of
FSDP's machinery (``ddp_lab.fsdp_base.FullyShardedBase``, ``probe_fsdp``, which returns the
trained state and, per call, the gradient's size, the result's shape and the first
collective other than a reduce-scatter that it called); training must equal single-process
training on the full batch, computed here, and an all-reduce or an all-gather (every rank
receiving the whole gradient, or every rank's) fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks import (
    ch10_fsdp,  # noqa: F401  # registers 10.fsdp_reduce
    ch10_hooks,  # noqa: F401  # registers 10.bf16_hook
)
from ddp_lab.course.grading.checks.ch10_forms import _bad, _flat, _like, _load, _ranks
from ddp_lab.course.grading.checks.ch10_sharded_bytes import _torch_zero, check_sharded_bytes
from ddp_lab.i18n import _t

# ----- 10.sharded_optimizer ---------------------------------------------------------------


PARTS = ("emb", "norm", "frozen", "mid", "out")


class TiedModel(nn.Module):
    """Tied embedding/output weights, a frozen layer, a norm's small vectors, odd widths;
    its parts defined in the order ``order`` (a permutation of ``PARTS``), so that the order
    of ``parameters()`` is far from largest first."""

    def __init__(self, vocab: int, dim: int, hidden: int, order: list[str]) -> None:
        super().__init__()
        make = {
            "emb": lambda: nn.Embedding(vocab, dim),
            "norm": lambda: nn.LayerNorm(dim),
            "frozen": lambda: nn.Linear(dim, hidden).requires_grad_(False),
            "mid": lambda: nn.Linear(hidden, dim),
            "out": lambda: nn.Linear(dim, vocab),
        }
        if sorted(order) != sorted(PARTS):
            raise ValueError(f"order must be a permutation of {PARTS}, got {order!r}")
        for name in order:
            setattr(self, name, make[name]())
        self.out.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.emb(idx))
        return self.out(torch.tanh(self.mid(torch.tanh(self.frozen(x)))))


def _tied_model(spec: dict) -> nn.Module:
    torch.manual_seed(spec["seed"])
    return TiedModel(spec["vocab"], spec["dim"], spec["hidden"], spec["order"]).double()


def _greedy(sizes: list[int], world: int, order: list[int]) -> list[int]:
    """The owner of each parameter: visited in ``order``, each to the least loaded rank."""
    loads, owner = [0] * world, [0] * len(sizes)
    for i in order:
        owner[i] = loads.index(min(loads))
        loads[owner[i]] += sizes[i]
    return owner


def _by_count(sizes: list[int], world: int) -> list[int]:
    """Largest first, each to the rank that owns the fewest *parameters*."""
    counts, owner = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owner[i] = counts.index(min(counts))
        counts[owner[i]] += 1
    return owner


# Rules that are not the exercise's, as the owner of each parameter given the sizes in the
# order of ``parameters()``: every hidden model must tell each of them from the rule.
WRONG_RULES: dict[str, Callable[[list[int], int], list[int]]] = {
    "in definition order": lambda sizes, world: _greedy(sizes, world, list(range(len(sizes)))),
    "in reverse definition order": lambda sizes, world: _greedy(
        sizes, world, list(range(len(sizes)))[::-1]
    ),
    "smallest first": lambda sizes, world: _greedy(
        sizes, world, sorted(range(len(sizes)), key=lambda i: sizes[i])
    ),
    "round robin": lambda sizes, world: [i % world for i in range(len(sizes))],
    "by count": _by_count,
}


def rule_loads(sizes: list[int], world: int) -> list[int]:
    """The exercise's rule: the largest first, each to the least loaded rank; the ranks'
    loads, sorted (which rank gets which does not depend on how ties are broken)."""
    owner = _greedy(sizes, world, sorted(range(len(sizes)), key=lambda i: -sizes[i]))
    return sorted(sum(n for n, o in zip(sizes, owner, strict=True) if o == r) for r in range(world))


def _tells_rules_apart(spec: dict, world: int) -> bool:
    """Whether ``loads_verdict`` fails every wrong rule on this model, the rule applied to
    every parameter or to the trainable ones only."""
    with torch.random.fork_rng(devices=[]):
        params = list(_tied_model(spec).parameters())
    scopes = [list(range(len(params))), [i for i, p in enumerate(params) if p.requires_grad]]
    for wrong in WRONG_RULES.values():
        for scope in scopes:
            owner = wrong([params[i].numel() for i in scope], world)
            owned = [[i for i, o in zip(scope, owner, strict=True) if o == r] for r in range(world)]
            if not loads_verdict(params, owned, world):
                return False
    return True


def sharded_specs(rng: random.Random) -> list[tuple[int, dict]]:
    """The hidden cases of 10.sharded_optimizer: (world size, model and training spec). A
    pure function of ``rng``; each model's definition order and widths are drawn again until
    the rule's loads differ from those of every rule of ``WRONG_RULES``, so that every case,
    under every seed, fails each of them."""
    cases = []
    for world in [2, 3, rng.choice([2, 3])]:
        for _ in range(10_000):
            spec = {
                "seed": rng.randrange(10**6),
                "data_seed": rng.randrange(10**6),
                "vocab": rng.randint(7, 13),
                "dim": rng.randint(3, 9),
                "hidden": rng.randint(3, 9),
                "order": rng.sample(PARTS, len(PARTS)),
                "per_rank": rng.randint(2, 4),
                "steps": rng.randint(3, 4),
                "lrs": [round(rng.uniform(0.005, 0.05), 6) for _ in range(world)],
                "wd": rng.choice([0.01, 0.1]),
            }
            if _tells_rules_apart(spec, world):
                break
        else:  # pragma: no cover  # a few draws suffice (tests/course/checks/test_ch10.py)
            raise RuntimeError("no hidden model tells the rules apart")
        cases.append((world, spec))
    return cases


def _recording_adamw(log: list[list[int]], index: dict[int, int]) -> type:
    class RecordingAdamW(torch.optim.AdamW):
        """AdamW that notes which parameters (by index in the model) it was given."""

        def __init__(self, params: Any, **defaults: Any) -> None:
            params = list(params)
            flat = [
                p for item in params for p in (item["params"] if isinstance(item, dict) else [item])
            ]
            log.append([index.get(id(p), -1) for p in flat])
            super().__init__(params, **defaults)

    return RecordingAdamW


def _batches(spec: dict, world: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(spec["data_seed"])
    for _ in range(spec["steps"]):
        idx = torch.randint(0, spec["vocab"], (world * spec["per_rank"], 4), generator=gen)
        tgt = torch.randint(0, spec["vocab"], (world * spec["per_rank"], 4), generator=gen)
        yield idx, tgt


def _sharded_inputs(spec: dict, world: int) -> list[dict[str, Any]]:
    """Rank r's input: the model's architecture and starting parameters (the same on every
    rank), rank r's own learning rate and its own part of each batch; never a seed, another
    rank's data or another rank's learning rate. The learning rates differ, so the
    parameters a rank does not own end right only if their owner sent them."""
    with torch.random.fork_rng(devices=[]):
        init = _flat(_tied_model(spec).parameters())
    b = spec["per_rank"]
    batches = list(_batches(spec, world))
    return [
        {
            **{k: spec[k] for k in ("vocab", "dim", "hidden", "order", "wd")},
            "lr": spec["lrs"][rank],
            "init": init,
            "batches": [
                [idx[rank * b : (rank + 1) * b], tgt[rank * b : (rank + 1) * b]]
                for idx, tgt in batches
            ],
        }
        for rank in range(world)
    ]


def probe_sharded(rank: int, objects: tuple, mine: dict) -> dict[str, Any]:
    """In the learner's rank: their sharded optimizer trains this rank's part of each batch
    (the only data it receives, ``_sharded_inputs``), gradients averaged as DDP does.

    Returns the indices of the parameters this rank's inner optimizers were given (the rank's
    own account) and the parameters after the steps.
    """
    (my_cls,) = objects
    world = dist.get_world_size()
    model = TiedModel(mine["vocab"], mine["dim"], mine["hidden"], mine["order"]).double()
    params = list(model.parameters())
    _load(params, mine["init"])
    index = {id(p): i for i, p in enumerate(params)}
    log: list[list[int]] = []
    kw = {"lr": mine["lr"], "weight_decay": mine["wd"]}
    opt = my_cls(model.parameters(), _recording_adamw(log, index), **kw)
    for idx, tgt in mine["batches"]:
        opt.zero_grad()
        nn.functional.cross_entropy(model(idx).flatten(0, 1), tgt.flatten()).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
    owned = sorted({i for group in log for i in group})
    return {"owned": owned, "params": [p.detach().clone() for p in params]}


# course.grading.learner.refusing; the byte probe's the same, so that it reuses these ranks
probe_sharded.refuses = _torch_zero  # type: ignore[attr-defined]


def _adamw_full_batch(spec: dict, world: int, owner: dict[int, int]) -> list[torch.Tensor]:
    """The oracle: AdamW, one process, on the whole batch of every step; each parameter at
    the learning rate of the rank that owns it (``owner``: parameter index -> rank)."""
    with torch.random.fork_rng(devices=[]):
        model = _tied_model(spec)
    params = list(model.parameters())
    groups = [
        {"params": [params[i] for i in sorted(owner) if owner[i] == r], "lr": lr}
        for r, lr in enumerate(spec["lrs"])
    ]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=spec["wd"])
    for idx, tgt in _batches(spec, world):
        opt.zero_grad()
        nn.functional.cross_entropy(model(idx).flatten(0, 1), tgt.flatten()).backward()
        opt.step()
    return [p.detach().clone() for p in params]


def loads_verdict(params: list[torch.Tensor], owned: list[list[int]], world: int) -> str:
    """'' if the ranks' loads (elements of the parameters each rank's optimizer was given,
    ``owned[rank]``: indices into ``params``) are those of the rule, else why not. The rule
    over every parameter (frozen ones too, as ZeroRedundancyOptimizer does) or over the
    trainable ones only: either is accepted."""
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    for members in (range(len(params)), trainable):
        sizes = {i: params[i].numel() for i in members}
        rule = rule_loads(list(sizes.values()), world)
        loads = [sum(sizes[i] for i in set(mine) if i in sizes) for mine in owned]
        if sorted(loads) == rule:
            return ""
    return _t(
        "the ranks own {got} elements; the rule gives {want}: assign the largest "
        "parameters first, each to the least loaded rank",
        got=loads,
        want=rule[::-1],
    )


def _sharded_verdict(results: Any, spec: dict, world: int, label: str) -> str:
    with torch.random.fork_rng(devices=[]):
        params = list(_tied_model(spec).parameters())
    results = _ranks(results, world, ("owned", "params"), label)
    for rank, r in enumerate(results):
        owned, got = r["owned"], r["params"]
        if not isinstance(owned, list) or not all(type(i) is int for i in owned):
            raise _bad(rank, "owned", owned, label)
        if not isinstance(got, list) or len(got) != len(params):
            raise _bad(rank, "params", got, label)
        for p, q in zip(got, params, strict=True):
            if not _like(p, q):
                raise _bad(rank, "params", p, label)
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    owners: dict[int, list[int]] = {i: [] for i in trainable}
    for rank, r in enumerate(results):
        owned = r["owned"]
        for i in owned:
            if i in owners:
                owners[i].append(rank)
        mine = [i for i in set(owned) if i in owners]
        if len(trainable) > 1 and len(mine) == len(trainable):
            return _t(
                "rank {rank} built its optimizer over {mine} of the {total} trainable "
                "parameters: under ZeRO-1 each rank keeps optimizer state for its own "
                "shard only",
                rank=rank,
                mine=len(mine),
                total=len(trainable),
            )
    for i, ranks in owners.items():
        shape = tuple(params[i].shape)
        if not ranks:
            return _t(
                "parameter #{index} (shape {shape}) is stepped by no rank: every "
                "trainable parameter needs exactly one owner",
                index=i,
                shape=shape,
            )
        if len(ranks) > 1:
            return _t(
                "parameter #{index} (shape {shape}) is stepped by ranks {ranks}: each "
                "parameter must belong to exactly one shard",
                index=i,
                shape=shape,
                ranks=ranks,
            )
    why = loads_verdict(params, [r["owned"] for r in results], world)
    if why:
        return why
    want = _adamw_full_batch(spec, world, {i: ranks[0] for i, ranks in owners.items()})
    for rank, r in enumerate(results):
        diff = max((p - q).abs().max().item() for p, q in zip(r["params"], want, strict=True))
        if not diff <= 1e-10:  # nan fails too
            return _t(
                "rank {rank}: parameters differ from plain AdamW on the full batch by "
                "{diff:.3g} (did every rank receive the parameters updated by their "
                "owner? broadcast each parameter from its owner after the step)",
                rank=rank,
                diff=diff,
            )
    return ""


@checker("10.sharded_optimizer", points=4)
def check_sharded_optimizer(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = sharded_specs(rng)
    yield len(cases)
    for k, (world, spec) in enumerate(cases):
        label = running(_t("world_size={world}, tied + frozen parameters", world=world))
        inputs = _sharded_inputs(spec, world)
        got = learner.ranks(probe_sharded, inputs, timeout=120)
        why = _sharded_verdict(got, spec, world, label)
        if why:
            raise fail(why, label)
        if k == len(cases) - 1:  # the broadcasts, seen from outside (ch10_sharded_bytes)
            check_sharded_bytes(rng, learner, label, rule_loads)
        yield label
