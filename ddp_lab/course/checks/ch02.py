"""Checker of chapter 02's exercise: rank, local rank, node and GPU of every process.

The learner writes ``place(nproc_per_node, cuda_visible_devices, gpus_per_node)`` returning
one dict per process in global rank order. The ranks are checked against a real torchrun
launch on localhost (two simulated nodes, c10d rendezvous); the GPUs against CUDA's rule
for ``CUDA_VISIBLE_DEVICES`` (``ddp_lab.ranks.visible_gpus``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from ddp_lab import ranks
from ddp_lab.course.grading import checker, fail

KEYS = ("rank", "local_rank", "node_rank", "world_size", "device", "gpu")


def _compare(got: object, want: list[dict], case: str) -> None:
    if not isinstance(got, list) or len(got) != len(want):
        n = len(got) if isinstance(got, list) else type(got).__name__
        raise fail(f"expected a list of {len(want)} dicts (one per process), got {n}", case)
    for g, w in zip(got, want, strict=True):
        if not isinstance(g, dict):
            raise fail(f"expected dicts, got {type(g).__name__}", case)
        for k in KEYS:
            if g.get(k) != w[k]:
                raise fail(
                    f"process with rank {w['rank']}: {k} should be {w[k]!r}, got {g.get(k)!r}", case
                )


def _as_dicts(procs: list[ranks.Proc]) -> list[dict]:
    return [{k: getattr(p, k) for k in KEYS} for p in procs]


@checker("02.place", points=3)
def check_place(rng: random.Random, place: Callable) -> Iterator[object]:
    yield 4
    # Case 1: the oracle is torchrun itself (2 simulated nodes of different sizes).
    counts = rng.choice([[2, 3], [3, 2], [1, 3]])
    cvds = [rng.choice(["2,3,1", "1,0,3"]), None]
    seen = ranks.torchrun_assignment(counts, cvds)
    by_node = sorted(
        {(r["GROUP_RANK"], r["LOCAL_WORLD_SIZE"], r["CUDA_VISIBLE_DEVICES"]) for r in seen}
    )
    order_counts = [n for _, n, _ in by_node]
    order_cvds = [c for _, _, c in by_node]
    want = _as_dicts(ranks.assign(order_counts, cuda_visible_devices=order_cvds, gpus_per_node=4))
    for w, r in zip(want, seen, strict=True):  # torchrun's numbers replace the model's
        w.update(
            rank=r["RANK"],
            local_rank=r["LOCAL_RANK"],
            node_rank=r["GROUP_RANK"],
            world_size=r["WORLD_SIZE"],
        )
    _compare(place(order_counts, order_cvds, 4), want, "torchrun, 2 nodes")
    yield "torchrun"
    # Cases 2-4: CUDA_VISIBLE_DEVICES edge cases on bigger launches.
    for case, nnodes, cvd in [
        ("3 nodes, GPUs hidden", 3, rng.choice(["", "-1"])),
        ("invalid entry", 2, rng.choice(["5,7,9", "1,3,8,2"])),
        ("too few GPUs", 2, rng.choice(["6,7", "3"])),
    ]:
        counts = [rng.randint(2, 4) for _ in range(nnodes)]
        cvds = (
            [cvd] + [None] * (nnodes - 1) if rng.random() < 0.5 else [None] * (nnodes - 1) + [cvd]
        )
        want = _as_dicts(ranks.assign(counts, cuda_visible_devices=cvds, gpus_per_node=8))
        _compare(place(counts, cvds, 8), want, case)
        yield case
