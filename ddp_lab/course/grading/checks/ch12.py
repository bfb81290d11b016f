"""Checkers of chapter 12: the conjugate pair of tensor parallelism, and a 1F1B schedule.

12.tp_pair: the learner's ``copy_to_tp(x)`` (Megatron's ``f``) and ``reduce_from_tp(x)``
(``g``) run a two-layer MLP split over hidden world sizes (``probe_tp``): rank r receives the
input, its rows of the first weight (column-parallel) and its columns of the second
(row-parallel), never another rank's slice; it returns the output and every gradient it
holds. The oracle is the whole MLP in this process: the output, the input's gradient (the
sum over the ranks, which only an all-reduce in ``f``'s backward gives every rank) and the
slices of the weight gradients must match in float64.

12.one_f_one_b: the learner's ``schedule(stage, stages, micro)`` returns one stage's order of
("F", i) / ("B", i) passes. Its orders for hidden (stages, micro-batches) pairs come back from
one rank (``probe_orders``: the function alone, no communication); here they are checked on
paper (``ddp_lab.pipeline.simulate``): every pass once, F(i) before B(i), no wait that never
ends, at most ``min(p - s, m)`` activations held on stage s (1F1B's bound; GPipe holds m) and
the bubble (p-1)/(m+p-1). Then the orders of one case run for real on ``p`` ranks
(``probe_run``: ``ddp_lab.pipeline.run_stage``, send/recv), whose gradients must equal the
whole model's in this process. ``ddp_lab.pipeline_1f1b`` (the reference) is hidden from
the ranks; ``ddp_lab.pipeline`` (the runner, GPipe) is not.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ddp_lab.course.grading import checker, fail, running, wrong_form
from ddp_lab.i18n import _t


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


# ----- 12.tp_pair ---------------------------------------------------------------------------

# in the order checked: a gradient nearer the output says more precisely what went wrong
TP_FIELDS = ("y", "b2_grad", "w2_grad", "w1_grad", "b1_grad", "x_grad", "kept_grad", "own")


def _mlp_params(spec: dict) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec["seed"])
    d, h, n = spec["dim"], spec["hidden"], spec["batch"]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "x": rnd(n, d),
        "w1": rnd(h, d),
        "b1": rnd(h),
        "w2": rnd(d, h),
        "b2": rnd(d),
        "c": rnd(n, d),
    }


def _tp_inputs(spec: dict, world: int) -> list[dict[str, Any]]:
    """Rank r's input: x, the loss weights c, its rows of w1 and b1, its columns of w2, b2."""
    t = _mlp_params(spec)
    part = spec["hidden"] // world
    return [
        {
            "x": t["x"],
            "c": t["c"],
            "w1": t["w1"][r * part : (r + 1) * part].clone(),
            "b1": t["b1"][r * part : (r + 1) * part].clone(),
            "w2": t["w2"][:, r * part : (r + 1) * part].clone(),
            "b2": t["b2"],
            # this rank's own scale for the side tests: data that differs between ranks, where
            # the MLP's is the same on all (an all-reduce by MAX or AVG in place of identity
            # is identity on equal data)
            "s": torch.tensor(float(r + 1), dtype=t["c"].dtype),
        }
        for r in range(world)
    ]


def probe_tp(rank: int, objects: tuple, mine: dict) -> dict[str, Any]:
    """In the learner's rank: the MLP's slice of this rank, with their ``f`` and ``g``."""
    copy_to_tp, reduce_from_tp = objects
    x, w1, b1, w2, b2 = (mine[k].clone().requires_grad_() for k in ("x", "w1", "b1", "w2", "b2"))
    copied = copy_to_tp(x)
    if not isinstance(copied, torch.Tensor):  # said outside, in the learner's language
        return {"returned": ["copy_to_tp", copied is None]}
    reduced = reduce_from_tp(F.linear(torch.tanh(F.linear(copied, w1, b1)), w2))
    if not isinstance(reduced, torch.Tensor):
        return {"returned": ["reduce_from_tp", reduced is None]}
    y = reduced + b2
    (y * mine["c"]).sum().backward()

    def grad(t: torch.Tensor) -> torch.Tensor | None:
        return None if t.grad is None else t.grad.detach().clone()

    # g on a tensor autograd keeps for the backward of the operation before it (exp keeps
    # its output): a g that all-reduces its input in place changes that tensor, and exp's
    # gradient comes out wrong (F.linear's output above is kept by nothing, so it cannot tell)
    # the gradient g's backward gets differs between ranks (weights scaled by the rank's s):
    # identity passes each rank's own through
    a = (mine["c"] / 2).requires_grad_()
    kept = reduce_from_tp(torch.exp(a))
    if not isinstance(kept, torch.Tensor):
        return {"returned": ["reduce_from_tp", kept is None]}
    (kept * (mine["c"] * mine["s"])).sum().backward()
    # f's forward on an input that differs between ranks: identity returns each rank's own
    own = copy_to_tp(mine["x"] * mine["s"])
    if not isinstance(own, torch.Tensor):
        return {"returned": ["copy_to_tp", own is None]}
    return {"y": y.detach().clone(), "x_grad": grad(x), "w1_grad": grad(w1), "b1_grad": grad(b1),
            "w2_grad": grad(w2), "b2_grad": grad(b2), "kept_grad": grad(a),
            "own": own.detach().clone()}  # fmt: skip


def _tp_oracle(spec: dict) -> dict[str, torch.Tensor]:
    t = _mlp_params(spec)
    x, w1, b1, w2, b2 = (t[k].clone().requires_grad_() for k in ("x", "w1", "b1", "w2", "b2"))
    y = F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2)
    (y * t["c"]).sum().backward()
    # g passes its gradient through: exp's input gets exp(a) times the loss weights
    # (times rank r's scale r + 1 on rank r, _tp_verdict)
    kept_grad = torch.exp(t["c"] / 2) * t["c"]
    return {"y": y.detach(), "x_grad": x.grad, "w1_grad": w1.grad, "b1_grad": b1.grad,
            "w2_grad": w2.grad, "b2_grad": b2.grad, "kept_grad": kept_grad,
            "x": t["x"]}  # type: ignore[dict-item]  # fmt: skip


def _tp_verdict(got: Any, spec: dict, world: int, label: str) -> None:
    if not isinstance(got, list) or len(got) != world:
        raise wrong_form("-", "ranks", _kind(got), label)
    want = _tp_oracle(spec)
    part = spec["hidden"] // world
    hints = {
        "y": _t(
            "the output differs from the whole MLP's: reduce_from_tp must sum the ranks' partial "
            "products in forward, copy_to_tp must return its input unchanged",
        ),
        "x_grad": _t(
            "the input's gradient differs from the whole MLP's: copy_to_tp's backward must sum "
            "the ranks' gradients (all-reduce)",
        ),
        "w": _t(
            "the weight gradients differ from the whole MLP's slices: reduce_from_tp's backward "
            "must pass the gradient through unchanged",
        ),
        "kept_grad": _t(
            "reduce_from_tp(torch.exp(a)) gives a the wrong gradient: its backward must pass "
            "each rank's own gradient through unchanged (they differ between ranks here), and "
            "it must not change its input in place (exp keeps it for its backward): all-reduce "
            "a copy (x.clone()) and return that",
        ),
        "own": _t(
            "copy_to_tp changed an input that differs between ranks: its forward must return "
            "each rank's own input unchanged, with no communication",
        ),
    }
    for rank, r in enumerate(got):
        returned = r.get("returned") if isinstance(r, dict) and len(r) == 1 else None
        if (
            isinstance(returned, list)
            and len(returned) == 2
            and returned[0] in ("copy_to_tp", "reduce_from_tp")
            and type(returned[1]) is bool
        ):
            # the grader's own string, equal to the one received, never the received object
            name = "copy_to_tp" if returned[0] == "copy_to_tp" else "reduce_from_tp"
            text = (
                _t(
                    "{name} returned None, not a tensor (dist.all_reduce works in place and "
                    "returns None: return the tensor it reduced)",
                    name=name,
                )
                if returned[1]
                else _t("{name} must return a tensor", name=name)
            )
            raise fail(_t("rank {rank}: {text}", rank=rank, text=text), label)
        if not isinstance(r, dict) or sorted(r) != sorted(TP_FIELDS):
            raise wrong_form(rank, "result", _kind(r), label)
        rows = slice(rank * part, (rank + 1) * part)
        expected = {
            "y": want["y"], "x_grad": want["x_grad"], "w1_grad": want["w1_grad"][rows],
            "b1_grad": want["b1_grad"][rows], "w2_grad": want["w2_grad"][:, rows],
            "b2_grad": want["b2_grad"],
            "kept_grad": want["kept_grad"] * (rank + 1),
            "own": want["x"] * (rank + 1),
        }  # fmt: skip
        for key in TP_FIELDS:
            value, w = r[key], expected[key]
            ok = (
                isinstance(value, torch.Tensor)
                and value.shape == w.shape
                and value.dtype == w.dtype
            )
            if ok and (value - w).abs().max().item() <= 1e-9:
                continue
            if value is not None and not (
                isinstance(value, torch.Tensor) and value.shape == w.shape
            ):
                raise wrong_form(rank, key, _kind(value), label)
            hint = hints.get(key, hints["w"])
            if value is None:  # a backward that returned None: no gradient at all
                hint = _t(
                    "no gradient: {name}'s backward returned None (return the gradient)",
                    name="copy_to_tp" if key == "x_grad" else "reduce_from_tp",
                )
            raise fail(_t("rank {rank}, {what}: {hint}", rank=rank, what=key, hint=hint), label)


@checker("12.tp_pair", points=3)
def check_tp_pair(rng: random.Random, learner: Any) -> Iterator[object]:
    worlds = [2, 3]
    yield len(worlds)
    for world in worlds:
        spec = {
            "seed": rng.randrange(10**6),
            "dim": rng.randint(3, 7),
            "hidden": world * rng.randint(2, 4),
            "batch": rng.randint(2, 5),
        }
        label = running(
            _t("world_size={world}, hidden width {hidden}", world=world, hidden=spec["hidden"])
        )
        got = learner.ranks(probe_tp, _tp_inputs(spec, world), timeout=120)
        _tp_verdict(got, spec, world, label)
        yield label


# ----- 12.one_f_one_b -----------------------------------------------------------------------


def probe_orders(rank: int, objects: tuple, mine: dict) -> list[list[Any]]:
    """In the learner's rank: their schedule's order of every stage of every case."""
    (schedule,) = objects
    out = []
    for p, m in mine["cases"]:
        stages = []
        for s in range(p):
            order = schedule(s, p, m)
            if isinstance(order, (list, tuple)):
                stages.append([list(op) if isinstance(op, tuple) else op for op in order])
            else:  # said outside: None (a missing return?) or another kind of value
                stages.append(None if order is None else 0)
        out.append(stages)
    return out


def _orders(got: Any, p: int, m: int, label: str) -> list[list[tuple[str, int]]]:
    """The orders as (kind, micro-batch) pairs, or a failure that names the call."""
    if not isinstance(got, list) or len(got) != p:
        raise wrong_form(0, "orders", _kind(got), label)
    orders = []
    for s, order in enumerate(got):
        call = f"schedule_1f1b({s}, {p}, {m})"
        if not isinstance(order, list):
            raise fail(
                _t("{call} returned None: is its return missing?", call=call)
                if order is None
                else _t("{call} must return a list of passes", call=call),
                label,
            )
        for j, op in enumerate(order):
            if not (
                isinstance(op, list) and len(op) == 2 and op[0] in ("F", "B") and type(op[1]) is int
            ):
                raise fail(
                    _t(
                        'item {j} of {call} is not `("F", i)` or `("B", i)` with i an int',
                        j=j,
                        call=call,
                    ),
                    label,
                )
        orders.append([(k, i) for k, i in order])
    return orders


def judge_orders(orders: list[list[tuple[str, int]]], p: int, m: int, label: str) -> None:
    """Each order checked on paper: dependencies, activations held, the bubble."""
    from ddp_lab.pipeline import ScheduleError, bubble, bubble_formula, peak_in_flight, simulate

    try:
        events = simulate(orders, m)
    except ScheduleError as exc:
        raise fail(_t("the orders cannot run: {why}", why=str(exc)), label) from None
    for s, order in enumerate(orders):
        peak, bound = peak_in_flight(order), min(p - s, m)
        if peak > bound:
            raise fail(
                _t(
                    "stage {stage} holds {peak} micro-batches' activations at once; 1F1B holds at "
                    "most {bound} there, min(stages - stage, micro): the forward that follows "
                    "the warm-up holds one more, so warm up with stages - stage - 1 forwards",
                    stage=s,
                    peak=peak,
                    bound=bound,
                ),
                label,
            )
    got, want = bubble(events), bubble_formula(p, m)
    if abs(got - want) > 1e-9:
        raise fail(
            _t(
                "the bubble is {got:.3f}, expected (p-1)/(m+p-1) = {want:.3f}: warm up with "
                "stages - stage - 1 forwards before alternating",
                got=got,
                want=want,
            ),
            label,
        )


def _run_inputs(orders: list[list[tuple[str, int]]], width: int, seed: int) -> tuple[list, dict]:
    from ddp_lab.pipeline import make_stages

    p, m = len(orders), len(orders[0]) // 2
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(3, width, generator=gen, dtype=torch.float64) for _ in range(m)]
    ys = [torch.randn(3, width, generator=gen, dtype=torch.float64) for _ in range(m)]
    stages = make_stages(p, width, seed)
    inputs = []
    for s in range(p):
        inputs.append({
            "order": [list(op) for op in orders[s]], "width": width,
            "params": [q.detach().clone() for q in stages[s].parameters()],
            "xs": xs if s == 0 else None, "ys": ys if s == p - 1 else None,
        })  # fmt: skip
    whole = nn.Sequential(*stages)
    sum(F.mse_loss(whole(x), y) / m for x, y in zip(xs, ys, strict=True)).backward()
    want = [[q.grad for q in stage.parameters()] for stage in stages]
    return inputs, {"grads": want}


def probe_run(rank: int, objects: tuple, mine: dict) -> list[torch.Tensor]:
    """In the learner's rank: stage ``rank`` run through its (already checked) order."""
    from ddp_lab.pipeline import run_stage

    width = mine["width"]
    stage = nn.Sequential(nn.Linear(width, width).double(), nn.Tanh())
    with torch.no_grad():
        for q, v in zip(stage.parameters(), mine["params"], strict=True):
            q.copy_(v)
    order = [(k, i) for k, i in mine["order"]]
    out = run_stage(stage, order, mine["xs"], mine["ys"], (3, width))
    return out["grads"]


@checker("12.one_f_one_b", points=3)
def check_one_f_one_b(rng: random.Random, learner: Any) -> Iterator[object]:
    drawn = [(2, rng.randint(3, 6)), (3, rng.randint(3, 7)), (4, rng.randint(5, 9)),
             (rng.randint(4, 6), 2), (rng.randint(5, 8), rng.randint(9, 16))]  # fmt: skip
    # Every small pipeline as well, on paper (cheap): a warm-up that is wrong only for some
    # (stages, micro-batches), such as min(stages - stage - 1, micro // 2), must not pass
    # because the drawn cases missed them.
    small = [(p, m) for p in range(2, 7) for m in range(1, 9)]
    cases = drawn + small
    yield len(drawn) + 2
    got = learner.ranks(probe_orders, [{"cases": [list(c) for c in cases]}], timeout=60)
    if not isinstance(got, list) or len(got) != 1 or not isinstance(got[0], list):
        raise wrong_form(0, "result", _kind(got), "-")
    if len(got[0]) != len(cases):
        raise wrong_form(0, "cases", _kind(got[0]), "-")
    checked = []
    for k, ((p, m), orders) in enumerate(zip(cases, got[0], strict=True)):
        label = _t("{p} stages, {m} micro-batches", p=p, m=m)
        checked.append(_orders(orders, p, m, label))
        judge_orders(checked[-1], p, m, label)
        if k < len(drawn):
            yield label
    yield _t("every pipeline of 2 to 6 stages and 1 to 8 micro-batches")
    orders = checked[1]
    label = running(_t("run on {p} ranks with send/recv", p=len(orders)))
    inputs, want = _run_inputs(orders, rng.randint(3, 6), rng.randrange(10**6))
    grads = learner.ranks(probe_run, inputs, timeout=120)
    for s, (g, w) in enumerate(zip(grads, want["grads"], strict=True)):
        if (
            not isinstance(g, list)
            or len(g) != len(w)
            or not all(
                isinstance(a, torch.Tensor) and a.shape == b.shape
                for a, b in zip(g, w, strict=True)
            )
        ):
            raise wrong_form(s, "grads", _kind(g), label)
        diff = max((a - b).abs().max().item() for a, b in zip(g, w, strict=True))
        if not diff <= 1e-10:  # NaN too
            raise fail(
                _t(
                    "stage {stage}: gradients differ from one process by {diff:.3g}",
                    stage=s,
                    diff=diff,
                ),
                label,
            )
    yield label
