"""10.sharded_optimizer's broadcasts, observed from outside the ranks (see ``ch10``).

The training cases check each rank's parameters against AdamW on the full batch, but a rank
that keeps AdamW state for every parameter and steps them all itself (the probe averages the
gradients, so its local steps are its owners' steps) ends with the same parameters, and what
a rank reports about its optimizer (which parameters it was given) is its own account. So
after them, ``probe_sharded_bytes`` runs the learner's optimizer alone on large parameters, one
``step()`` per call, in lockstep with the grader (``per_call``: ``course.grading.rankhost``
reads the kernel's byte counters of the ranks' private network between the calls,
``course.grading.traffic``). Each rank is handed the averaged gradient directly, so nothing of
the probe's own crosses the network in a call: what a rank receives there is what its
optimizer fetched. Under ZeRO-1 a rank holds the updated values only of the parameters it owns
and must receive every other one from its owner at each step; ``judge_received`` sets a lower
bound on what each rank received (a rank that steps every parameter itself receives nothing).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddp_lab.course.grading import fail, unobserved
from ddp_lab.course.grading.checks.ch10_forms import _bad, _like
from ddp_lab.course.grading.checks.ch10_fsdp_bytes import received, unseen
from ddp_lab.i18n import _t

# --- the bound, calibrated in the grading sandboxes ------------------------------------------
#
# Per step on P bytes of trainable parameters over N ranks, a rank that owns L bytes of them
# must receive the other P - L from their owners (a broadcast of each, an all-gather of the
# shards: either way each byte of another rank's shard reaches this rank at least once); the
# rule's largest load Lmax gives every rank at least P - Lmax. Measured in the grading
# sandboxes (gloo over loopback, N = 3, float64; numbers in docs/INSTRUCTORS.md), per rank and
# step, in units of the rank's own P - L: the exercise's answer (a broadcast of each parameter
# from its owner) and ``ZeroRedundancyOptimizer``'s way (async broadcasts) 1.00 plus gloo's
# headers (about 100 bytes a message); an answer that steps every parameter on every rank
# and sends nothing 0.00 (a few hundred bytes, its own set-up's, in the first step). The bound,
# (P - Lmax) x RECEIVED_SHARE, sits far from both.
RECEIVED_SHARE = 0.5
N_BYTES = 3  # the world size of the byte case (the hidden models' largest)
STEPS = 2
_HELD: dict[str, Any] = {}  # the rank's parameters and the learner's optimizer, across calls


def _torch_zero() -> tuple[dict[str, Any], str]:
    """torch's ZeroRedundancyOptimizer: the same largest-first sharding and broadcasts, so a
    wrapper around it passed every case."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return {"torch.distributed.optim.ZeroRedundancyOptimizer": ZeroRedundancyOptimizer}, (
        "dist.broadcast"
    )


def probe_sharded_bytes(rank: int, objects: tuple, steps: list[dict]) -> list[dict]:
    """In the learner's rank: one ``step()`` of their optimizer per item of ``steps`` (the
    first item also holds the starting parameters and the hyperparameters: the optimizer is
    built then and kept for the next calls), each with the averaged gradient given here. Per
    call, the parameters after the step (None but after the last)."""
    (my_cls,) = objects
    out = []
    for item in steps:
        if "init" in item:
            params = [nn.Parameter(t.clone()) for t in item["init"]]
            kw = {"lr": item["lr"], "weight_decay": item["wd"]}
            _HELD.clear()
            _HELD.update(params=params, opt=my_cls(params, torch.optim.AdamW, **kw))
        params, opt = _HELD["params"], _HELD["opt"]
        opt.zero_grad()
        for p, g in zip(params, item["grads"], strict=True):
            p.grad = g.clone()
        opt.step()
        last = [p.detach().clone() for p in params] if item["last"] else None
        out.append({"params": last})
    return out


probe_sharded_bytes.refuses = _torch_zero  # type: ignore[attr-defined]  # as probe_sharded's
# One step of the learner's optimizer per item, each observed on its own by the grader.
probe_sharded_bytes.per_call = True  # type: ignore[attr-defined]


def byte_inputs(rng: random.Random, n: int) -> tuple[list[list[dict]], list[list[torch.Tensor]]]:
    """Rank r's items (the same on every rank: the starting parameters and the gradients,
    averaged as DDP does; no seed) and the gradients of each step: six float64 parameters of
    thousands of elements, tens of thousands in all, so that gloo's headers are noise."""
    gen = torch.Generator().manual_seed(rng.randrange(10**6))
    numels = [rng.randint(3000, 12000) for _ in range(6)]
    init = [torch.randn(m, dtype=torch.float64, generator=gen) for m in numels]
    grads = [
        [torch.randn(m, dtype=torch.float64, generator=gen) for m in numels] for _ in range(STEPS)
    ]
    first = {"init": init, "lr": round(rng.uniform(0.005, 0.05), 6), "wd": rng.choice([0.01, 0.1])}
    items = [
        {**(first if k == 0 else {}), "grads": g, "last": k == STEPS - 1}
        for k, g in enumerate(grads)
    ]
    return [items for _ in range(n)], grads


def _adamw(items: list[dict]) -> list[torch.Tensor]:
    """The oracle: AdamW, one process, every parameter, on the same gradients."""
    params = [nn.Parameter(t.clone()) for t in items[0]["init"]]
    opt = torch.optim.AdamW(params, lr=items[0]["lr"], weight_decay=items[0]["wd"])
    for item in items:
        for p, g in zip(params, item["grads"], strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach().clone() for p in params]


def received_least(sizes: list[int], element_size: int, n: int, loads: Callable) -> int:
    """Fewest bytes every rank must receive in one step (see the calibration above):
    ``loads(sizes, n)`` the rule's loads."""
    return int(RECEIVED_SHARE * (sum(sizes) - max(loads(sizes, n))) * element_size)


def judge_received(calls: list, least: int, n: int, case: str) -> None:
    """Fail ``case`` if, in any step (``calls[k]``: the grader's count of step k), a rank
    received fewer than ``least`` bytes. Bytes outside the group's connections count as
    received by every rank: a lower bound gives the benefit of the doubt."""
    for step, traffic in enumerate(calls):
        hidden = unseen(traffic)
        for rank in range(n):
            got = received(traffic, rank, n) + hidden
            if got < least:
                raise fail(
                    _t(
                        "the grader saw rank {rank} receive {got} bytes from the other ranks "
                        "in step {step} on {n} ranks; each rank must receive at least about "
                        "{least}, the parameters it does not own, from their owners. Under "
                        "ZeRO-1 each rank steps only its own shard (its optimizer state is "
                        "only that shard's) and broadcasts it to the others after the step.",
                        rank=rank,
                        got=got,
                        step=step + 1,
                        n=n,
                        least=least,
                    ),
                    case,
                )


def judge_params(got: Any, items: list[dict], n: int, case: str) -> None:
    """Every rank's parameters after the last step must be AdamW's, computed here."""
    want = _adamw(items)
    if not isinstance(got, list) or len(got) != n:
        raise _bad("-", "ranks", got, case)
    for rank, records in enumerate(got):
        if not isinstance(records, list) or len(records) != len(items):
            raise _bad(rank, "result", records, case)
        if not all(isinstance(r, dict) for r in records):
            raise _bad(rank, "result", records, case)
        params = records[-1].get("params")
        if not isinstance(params, list) or len(params) != len(want):
            raise _bad(rank, "params", params, case)
        for p, q in zip(params, want, strict=True):
            if not _like(p, q):
                raise _bad(rank, "params", p, case)
        diff = max((p - q).abs().max().item() for p, q in zip(params, want, strict=True))
        if not diff <= 1e-10:  # nan fails too
            raise fail(
                _t(
                    "rank {rank}: parameters differ from plain AdamW on the full batch by "
                    "{diff:.3g} (did every rank receive the parameters updated by their "
                    "owner? broadcast each parameter from its owner after the step)",
                    rank=rank,
                    diff=diff,
                ),
                case,
            )


def check_sharded_bytes(rng: random.Random, learner: Any, case: str, loads: Callable) -> None:
    """The byte case of 10.sharded_optimizer, on ``N_BYTES`` ranks (``loads``: the rule's
    loads, ``ch10.rule_loads``)."""
    if getattr(learner, "unobserved", "") == "self-study":
        return  # the learner's own processes: nothing to count (the training cases' checks)
    inputs, grads = byte_inputs(rng, N_BYTES)
    got = learner.ranks(probe_sharded_bytes, inputs, timeout=120)
    judge_params(got, inputs[0], N_BYTES, case)
    observed = getattr(learner, "traffic", None)
    if isinstance(observed, list):
        sizes = [g.numel() for g in grads[0]]
        least = received_least(sizes, grads[0][0].element_size(), N_BYTES, loads)
        judge_received(observed, least, N_BYTES, case)
    else:
        unobserved(
            learner,
            case,
            _t(
                "the grader could not count the bytes between the ranks (ss failed, or the "
                "ranks opened too many sockets), so the broadcasts of the updated parameters "
                "are not shown."
            ),
            _t(
                "10.sharded_optimizer: the grader could not observe the bytes between the "
                "ranks here (no sandbox, or no ss/nsenter): whether each rank received the "
                "parameters it does not own was not checked."
            ),
        )
