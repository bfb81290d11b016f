"""Calibration of 10.sharded_optimizer's byte bound: what each rank receives per step.

Runs each way below as a graded submission of 10.sharded_optimizer's byte probe
(``ch10_sharded_bytes.probe_sharded_bytes`` in the grader's per-rank sandboxes,
``course.rankhost.RankPool``) and prints, per step, the bytes each rank received from the
others (``course.traffic``: on the connections of the group the ranks were given), the same
in units of what the rank does not own (the rule's owners), the bound, whether the
parameters were right, and the bytes outside the group's connections.
``ch10_sharded_bytes``'s bound comes from these numbers (see its comment and
docs/INSTRUCTORS.md). Needs bubblewrap, ss and nsenter (root or user namespaces).

    .venv/bin/python benchmarks/bench_zero_traffic.py [--seed 0] [--ways a,b]
"""

from __future__ import annotations

import argparse
import random
import sys

import cloudpickle
import torch
import torch.distributed as dist

from ddp_lab.course.grading import sandbox, traffic
from ddp_lab.course.grading.checks.ch10 import rule_loads
from ddp_lab.course.grading.checks.ch10_sharded_bytes import (
    N_BYTES,
    _adamw,
    byte_inputs,
    probe_sharded_bytes,
    received,
    received_least,
    unseen,
)
from ddp_lab.course.grading.learner import probe_name
from ddp_lab.course.grading.rankhost import RankPool


def _owners(params: list, world: int) -> list[int]:
    loads, owner = [0] * world, [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        r = loads.index(min(loads))
        owner[i], loads[r] = r, loads[r] + params[i].numel()
    return owner


class Reference:
    """The exercise's answer: step the own shard, broadcast each parameter from its owner."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        self.owner = _owners(self.params, dist.get_world_size())
        mine = [p for p, o in zip(self.params, self.owner, strict=True) if o == dist.get_rank()]
        self.optim = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        if self.optim is not None:
            self.optim.step()
        for p, owner in zip(self.params, self.owner, strict=True):
            dist.broadcast(p, src=owner)


class AsyncBroadcasts(Reference):
    """ZeroRedundancyOptimizer's (and ``ddp_lab.zero``'s) way: async broadcasts, owner by owner."""

    @torch.no_grad()
    def step(self):
        if self.optim is not None:
            self.optim.step()
        works = []
        for src in range(dist.get_world_size()):
            for p, owner in zip(self.params, self.owner, strict=True):
                if owner == src:
                    works.append(dist.broadcast(p, src=src, async_op=True))
        for w in works:
            w.wait()


class AllGatherShards(Reference):
    """Each rank's shard flattened, padded to the largest, all-gathered."""

    @torch.no_grad()
    def step(self):
        if self.optim is not None:
            self.optim.step()
        world, rank = dist.get_world_size(), dist.get_rank()
        shards = [
            [p for p, o in zip(self.params, self.owner, strict=True) if o == r]
            for r in range(world)
        ]
        size = max(sum(p.numel() for p in s) for s in shards)
        mine = torch.zeros(size, dtype=torch.float64)
        flat = torch.cat([p.reshape(-1) for p in shards[rank]]) if shards[rank] else mine[:0]
        mine[: flat.numel()] = flat
        out = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(out, mine)
        for r in range(world):
            at = 0
            for p in shards[r]:
                p.copy_(out[r][at : at + p.numel()].view_as(p))
                at += p.numel()


class StepsAll(Reference):
    """Wrong: no sharding, no broadcast; every rank steps every parameter (the review's forge,
    with one learning rate: the rank's own is every rank's here)."""

    def __init__(self, params, optimizer_class, **defaults):
        super().__init__(params, optimizer_class, **defaults)
        base = next(c for c in optimizer_class.__mro__ if c.__module__.startswith("torch.optim"))
        self.full = base(self.params, **defaults)

    @torch.no_grad()
    def step(self):
        self.full.step()


class StepsAllSharesRates(Reference):
    """Wrong: the review's forge as written, the ranks' learning rates all-gathered (8 bytes
    a rank) and every parameter stepped at its owner's rate, no broadcast."""

    def __init__(self, params, optimizer_class, **defaults):
        super().__init__(params, optimizer_class, **defaults)
        world = dist.get_world_size()
        lr = torch.tensor([float(defaults["lr"])], dtype=torch.float64)
        lrs = [torch.zeros_like(lr) for _ in range(world)]
        dist.all_gather(lrs, lr)
        base = next(c for c in optimizer_class.__mro__ if c.__module__.startswith("torch.optim"))
        rest = {k: v for k, v in defaults.items() if k != "lr"}
        groups = [
            {"params": [p for p, o in zip(self.params, self.owner, strict=True) if o == r]}
            | {"lr": lrs[r].item()}
            for r in range(world)
        ]
        self.full = base([g for g in groups if g["params"]], **rest)

    @torch.no_grad()
    def step(self):
        self.full.step()


class StepsAllAndBroadcasts(StepsAll):
    """Steps every parameter and broadcasts anyway (memory not sharded): the bytes pass."""

    @torch.no_grad()
    def step(self):
        self.full.step()
        for p, owner in zip(self.params, self.owner, strict=True):
            dist.broadcast(p, src=owner)


WAYS = [
    Reference, AsyncBroadcasts, AllGatherShards,  # right
    StepsAll, StepsAllSharesRates,  # wrong
    StepsAllAndBroadcasts,  # wrong, but its bytes are a right one's: passes
]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ways", default=",".join(w.__name__ for w in WAYS))
    args = p.parse_args()
    if not sandbox.available() or traffic.tools() is None:
        sys.exit("needs bubblewrap, ss and nsenter")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    n = N_BYTES
    inputs, grads = byte_inputs(random.Random(args.seed), n)
    sizes = [g.numel() for g in grads[0]]
    least = received_least(sizes, 8, n, rule_loads)
    owner = _owners(grads[0], n)
    not_owned = [8 * sum(s for s, o in zip(sizes, owner, strict=True) if o != r) for r in range(n)]
    want = _adamw(inputs[0])
    print(f"N={n} sizes={sizes} not owned (bytes)={not_owned} bound={least}", flush=True)
    for name in args.ways.split(","):
        pool = RankPool(cloudpickle.dumps((globals()[name],)), "en", 0)
        try:
            got = pool.run(probe_name(probe_sharded_bytes), inputs, 60)
            ok = all(
                max(
                    (a - b).abs().max().item()
                    for a, b in zip(got[r][-1]["params"], want, strict=True)
                )
                <= 1e-10
                for r in range(n)
            )
            for step, seen in enumerate(pool.traffic):
                recv = [received(seen, r, n) for r in range(n)]
                print(
                    f"{name:22} step {step + 1} received={recv} "
                    f"x(not owned)={[round(x / m, 3) for x, m in zip(recv, not_owned, strict=True)]} "
                    f"pass={min(recv) + unseen(seen) >= least} right={ok} unseen={unseen(seen)}",
                    flush=True,
                )
        finally:
            pool.close()


if __name__ == "__main__":
    main()
