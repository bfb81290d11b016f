"""Checker of chapter 10's 10.bf16_hook (see ``ch10``'s docstring; ``ch10`` imports this
module, so that loading chapter 10's checkers registers it).

The learner's hook is registered on torch's DDP for hidden models (``probe_bf16_hook``,
which returns the gradients after backward and what the hook's collectives carried, seen as
``c10d::`` operators by ``ddp_lab.comm_debug.watch_c10d``); the gradients must equal those
under torch's ``bf16_compress_hook`` (on the grader's ranks) bit for bit, and the
collectives must carry bfloat16, 2 bytes per gradient element.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ddp_lab.comm_debug import watch_c10d
from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.ch10_forms import _bad, _flat, _like, _load, _ranks, _spawn
from ddp_lab.i18n import _t

# ----- 10.bf16_hook -----------------------------------------------------------------------


def _hook_model(spec: dict) -> nn.Module:
    torch.manual_seed(spec["seed"])
    return nn.Sequential(nn.Linear(spec["d"], spec["h"]), nn.Tanh(), nn.Linear(spec["h"], 3))


def _hook_inputs(spec: dict, world: int) -> list[dict[str, Any]]:
    """Rank r's input: the model's shape and starting parameters, the bucket size, and rank
    r's own two batches (never a seed or another rank's data)."""
    with torch.random.fork_rng(devices=[]):
        init = _flat(_hook_model(spec).parameters())
    out = []
    for rank in range(world):
        gen = torch.Generator().manual_seed(spec["data_seed"] + rank)
        xs = [torch.randn(5, spec["d"], generator=gen) for _ in range(2)]
        out.append({"d": spec["d"], "h": spec["h"], "cap": spec["cap"], "init": init, "xs": xs})
    return out


def _hook_run(
    hook: Callable,
    mine: dict,
    _bound: tuple = (watch_c10d, _load),  # see probe_bf16_hook
) -> tuple[torch.Tensor, list]:
    """Two backward passes of a DDP model with ``hook``: the gradients, and the collectives
    the hook's calls handed over (seen as ``c10d::`` operators: whatever name the hook calls
    them by; DDP's own collectives, outside the hook, are not counted)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    watch, load = _bound
    calls: list = []

    # An unannotated wrapper: DDP checks a hook's name and annotations, not what it does.
    def watched(state, bucket):  # type: ignore[no-untyped-def]
        with watch() as log:
            future = hook(state, bucket)
        calls.extend(log.calls)
        return future

    module = nn.Sequential(nn.Linear(mine["d"], mine["h"]), nn.Tanh(), nn.Linear(mine["h"], 3))
    load(module.parameters(), mine["init"])
    model = DDP(module, bucket_cap_mb=mine["cap"])
    model.register_comm_hook(None, watched)
    for x in mine["xs"]:
        model.zero_grad()
        model(x).pow(2).mean().backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), calls


# The probe runs in the learner's process after their code; ``guard.seal`` freezes the code
# and defaults of ddp_lab's functions there, not module attributes (review 10 rebound
# ``comm_debug.watch_c10d``): what the probe reads while it records is bound as positional
# defaults (an immutable tuple) when this module loads, builtins included.
def probe_bf16_hook(
    rank: int,
    objects: tuple,
    mine: dict,
    _bound: tuple = (_hook_run, sorted, str, sum, int),
) -> dict[str, Any]:
    """In the learner's rank: their hook on torch's DDP, on this rank's own batches (the only
    data it receives, ``_hook_inputs``); the gradients and what the collectives carried (the
    rank's own account)."""
    (hook,) = objects
    hook_run, sorted_, str_, sum_, int_ = _bound
    grads, calls = hook_run(hook, mine)
    return {
        "grads": grads,
        "dtypes": sorted_({str_(d) for _, d, _ in calls}),
        "bytes": sum_(int_(b) for _, _, b in calls),
    }


def _torch_compress_hooks() -> tuple[dict[str, Any], str]:
    """torch's compression hooks: ``bf16_compress_hook`` is the oracle itself (a hook that
    returned it passed every case), ``_compress_hook`` its body, the wrappers the same steps
    around another hook."""
    import types

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    names = ("bf16_compress_hook", "fp16_compress_hook", "_compress_hook")
    names += ("bf16_compress_wrapper", "fp16_compress_wrapper")
    found = {n: getattr(default_hooks, n, None) for n in names}
    refused = {f"default_hooks.{n}": f for n, f in found.items() if type(f) is types.FunctionType}
    return refused, "bucket.buffer(), dist.all_reduce(..., async_op=True)"


probe_bf16_hook.refuses = _torch_compress_hooks  # type: ignore[attr-defined]


def _oracle_hook(rank: int, inputs: list[dict[str, Any]]) -> torch.Tensor:
    """In the grader's ranks: the same run under torch's bf16_compress_hook."""
    from ddp_lab.comm_hooks import builtin_bf16_hook

    return _hook_run(builtin_bf16_hook, inputs[rank])[0]


@checker("10.bf16_hook", points=3)
def check_bf16_hook(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = [2, 2, 3]
    yield len(cases)
    for world in cases:
        spec = {
            "seed": rng.randrange(10**6),
            "data_seed": rng.randrange(10**6),
            "d": rng.randint(4, 40),
            "h": rng.randint(4, 40),
            "cap": rng.choice([1e-4, 25.0]),  # several small buckets, or one
        }
        label = running(f"world_size={world}, bucket_cap_mb={spec['cap']}")
        inputs = _hook_inputs(spec, world)
        got = _ranks(
            learner.ranks(probe_bf16_hook, inputs, timeout=120),
            world,
            ("grads", "dtypes", "bytes"),
            label,
        )
        expected = _spawn(_oracle_hook, (inputs,), world)
        with torch.random.fork_rng(devices=[]):
            n = 2 * sum(p.numel() for p in _hook_model(spec).parameters())  # two backwards
        for rank, (r, want) in enumerate(zip(got, expected, strict=True)):
            grads, dtypes, sent = r["grads"], r["dtypes"], r["bytes"]
            if not _like(grads, want):
                raise _bad(rank, "grads", grads, label)
            if not isinstance(dtypes, list) or not all(
                isinstance(d, str) and len(d) < 40 for d in dtypes
            ):
                raise _bad(rank, "dtypes", dtypes, label)
            if type(sent) is not int:
                raise _bad(rank, "bytes", sent, label)
            if not torch.equal(grads, want):
                diff = (grads - want).abs().max().item()
                raise fail(
                    _t(
                        "gradients differ from torch's bf16_compress_hook by {diff:.3g} (cast to "
                        "bfloat16, divide by the world size, all-reduce, copy back into "
                        "bucket.buffer())",
                        diff=diff,
                    ),
                    label,
                )
            if dtypes != ["torch.bfloat16"] or sent != 2 * n:
                raise fail(
                    _t(
                        "the collectives carried {dtypes}, {got} bytes for {n} gradient "
                        "elements; a bf16 hook sends bfloat16, 2 bytes per element ({want} bytes)",
                        dtypes=dtypes,
                        got=sent,
                        n=n,
                        want=2 * n,
                    ),
                    label,
                )
        yield label
