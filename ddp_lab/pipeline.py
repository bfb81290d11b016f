"""Pipeline parallelism from scratch: stages on ranks, send/recv, schedules, the bubble.

A model cut into ``p`` consecutive stages runs with stage ``s`` on rank ``s``; a batch is cut
into ``m`` micro-batches. A *schedule* is, per stage, the order of its forward (``("F", i)``)
and backward (``("B", i)``) passes over the micro-batches. ``F(s, i)`` needs ``F(s-1, i)``'s
output (received from rank ``s-1``); ``B(s, i)`` needs ``B(s+1, i)``'s input gradient and
``F(s, i)``'s saved activations. GPipe (``gpipe_order``) runs every forward, then every
backward: each stage holds ``m`` micro-batches' activations at its peak. 1F1B
(``ddp_lab.pipeline_1f1b``, exercise 12.one_f_one_b) starts backwards as soon as it can and
holds at most ``p - s``. Both leave the same idle fraction, the *bubble*
``(p-1)/(m+p-1)`` when every forward takes the same time and every backward too.

How this differs from PyTorch's ``torch.distributed.pipelining`` (``schedules.py``:
``ScheduleGPipe``, ``Schedule1F1B``; ``stage.py``: ``PipelineStage``): torch splits a model
with ``pipeline()`` or takes one stage module per rank, infers the shapes it sends, posts
its sends and receives through ``_batch_p2p`` (plain ``isend``/``irecv``, or
``batch_isend_irecv`` when one batch mixes sends and receives, such as a forward's send with
the next backward's receive) and computes the loss per micro-batch with ``loss_fn``; this
runner takes one ``nn.Module`` per stage, knows the shapes from the first micro-batch
(``shape`` argument), sends with ``isend`` (never blocking: two neighbours that
send to each other at once would otherwise wait for each other) and receives with ``recv``.
``simulate`` is the same pipeline on paper: unit-free times, no ranks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.i18n import _t

Op = tuple[str, int]  # ("F", micro-batch) or ("B", micro-batch)


def gpipe_order(stage: int, stages: int, micro: int) -> list[Op]:
    """GPipe: every forward, then every backward (torch's ``ScheduleGPipe`` order)."""
    return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]


class ScheduleError(ValueError):
    """A schedule that cannot run: a pass missing or repeated, or a wait that never ends."""


def validate(orders: Sequence[Sequence[Op]], micro: int) -> None:
    """Every stage runs F(i) and B(i) once each for every micro-batch, F(i) before B(i), and
    its micro-batches in the order its neighbours send them.

    The last rule is ``run_stage``'s: ``recv`` takes messages in the order they were sent, so
    stage s must run its forwards in stage s-1's order of forwards and its backwards in stage
    s+1's order of backwards, or it computes on another micro-batch's activation."""
    for s, order in enumerate(orders):
        counts = Counter((kind, i) for kind, i in order)
        for kind, i in order:
            if kind not in ("F", "B") or not 0 <= i < micro:
                raise ScheduleError(
                    _t(
                        "stage {stage}: {op} is not a pass of this step (micro-batches 0 to "
                        "{last})",
                        stage=s,
                        op=f"{kind}({i})",
                        last=micro - 1,
                    )
                )
        for kind in ("F", "B"):
            for i in range(micro):
                n = counts[(kind, i)]
                if n != 1:
                    text = (
                        _t("stage {stage}: {op} is missing", stage=s, op=f"{kind}({i})")
                        if n == 0
                        else _t(
                            "stage {stage}: {op} appears {n} times", stage=s, op=f"{kind}({i})", n=n
                        )
                    )
                    raise ScheduleError(text)
        seen: set[int] = set()
        for kind, i in order:
            if kind == "F":
                seen.add(i)
            elif i not in seen:
                raise ScheduleError(_t("stage {stage}: B({i}) before F({i})", stage=s, i=i))
    for s in range(1, len(orders)):
        for kind, sender, receiver in (("F", s - 1, s), ("B", s, s - 1)):
            sent = [i for k, i in orders[sender] if k == kind]
            taken = [i for k, i in orders[receiver] if k == kind]
            for theirs, mine in zip(sent, taken, strict=True):
                if theirs != mine:
                    raise ScheduleError(
                        _t(
                            "stage {stage} runs {mine} where stage {other} sends {theirs}: recv "
                            "takes messages in the order they were sent, so neighbouring stages "
                            "run their micro-batches in the same order",
                            stage=receiver,
                            mine=f"{kind}({mine})",
                            other=sender,
                            theirs=f"{kind}({theirs})",
                        )
                    )


def simulate(
    orders: Sequence[Sequence[Op]], micro: int, f_time: float = 1.0, b_time: float = 2.0
) -> list[tuple[int, str, int, float, float]]:
    """The pipeline on paper: (stage, kind, micro-batch, start, end) of every pass.

    Each stage runs its order one pass after the other, a pass starting when the stage is
    free and its inputs have arrived (communication takes no time). Raises ScheduleError
    for an invalid order or one where every stage waits for another (a deadlock).
    """
    validate(orders, micro)
    p = len(orders)
    done: dict[tuple[int, str, int], float] = {}
    pos, free = [0] * p, [0.0] * p
    events: list[tuple[int, str, int, float, float]] = []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            needs = [(s - 1, "F", i)] if kind == "F" and s > 0 else []
            if kind == "B":
                needs = [(s, "F", i)] + ([(s + 1, "B", i)] if s < p - 1 else [])
            if not all(n in done for n in needs):
                continue
            start = max([free[s]] + [done[n] for n in needs])
            end = start + (f_time if kind == "F" else b_time)
            done[(s, kind, i)], free[s] = end, end
            events.append((s, kind, i, start, end))
            pos[s] += 1
            moved = True
        if not moved:
            stuck = [
                _t(
                    "stage {stage} waits before {op}",
                    stage=s,
                    op=f"{orders[s][pos[s]][0]}({orders[s][pos[s]][1]})",
                )
                for s in range(p)
                if pos[s] < len(orders[s])
            ]
            raise ScheduleError(_t("deadlock: {where}", where="; ".join(stuck)))
    return events


def bubble(events: Sequence[tuple[int, str, int, float, float]]) -> float:
    """The idle fraction: 1 - (time the stages compute) / (stages x the whole span)."""
    stages = {e[0] for e in events}
    start, end = min(e[3] for e in events), max(e[4] for e in events)
    busy = sum(e[4] - e[3] for e in events)
    return 1.0 - busy / (len(stages) * (end - start))


def bubble_formula(stages: int, micro: int) -> float:
    """GPipe's bubble, (p-1)/(m+p-1) (Huang et al. 2019; also 1F1B's, same pass times)."""
    return (stages - 1) / (micro + stages - 1)


def peak_in_flight(order: Sequence[Op]) -> int:
    """The most micro-batches whose activations the stage holds at once (F done, B not)."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def make_stages(stages: int, width: int = 16, seed: int = 0) -> list[nn.Module]:
    """``stages`` small blocks (Linear + tanh), the same on every rank (same seed)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(stages):
        lin = nn.Linear(width, width).double()
        with torch.no_grad():
            lin.weight.copy_(
                torch.randn(width, width, generator=gen, dtype=torch.float64) / width**0.5
            )
            lin.bias.copy_(torch.randn(width, generator=gen, dtype=torch.float64) / 10)
        out.append(nn.Sequential(lin, nn.Tanh()))
    return out


def run_stage(
    stage: nn.Module,
    order: Sequence[Op],
    micro_inputs: list[torch.Tensor] | None,
    micro_targets: list[torch.Tensor] | None,
    shape: Sequence[int],
    f_delay: float = 0.0,
    b_delay: float = 0.0,
) -> dict[str, Any]:
    """Run this rank's stage (rank = stage index) through ``order`` with real send/recv.

    The first stage reads ``micro_inputs``; the last computes the loss (MSE against
    ``micro_targets``, averaged over the micro-batches, as one batch's mean would be).
    ``f_delay``/``b_delay`` add a sleep to each pass: on a machine with fewer cores than
    stages, ranks that compute would compete for the cores and the timeline would show the
    machine, not the schedule; a sleeping rank leaves its core free, as a rank whose GPU
    computes does. Returns the passes with their times (seconds since the start, computing
    time only, not the waits), the peak number of saved activations and their bytes, and
    the parameters' gradients.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    micro = len(order) // 2
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    sends: list[Any] = []
    events: list[list[Any]] = []
    peak = peak_bytes = 0
    # a process's first backward() with a gradient argument imports ~500 modules (~2 s
    # here): done before the clock starts, so that the timeline shows the schedule
    torch.ones(1, requires_grad=True).mul(2).backward(torch.ones(1))
    dist.barrier()
    t0 = time.perf_counter()
    for kind, i in order:
        if kind == "F":
            if rank == 0:
                assert micro_inputs is not None
                x = micro_inputs[i].clone()
            else:
                x = torch.empty(*shape, dtype=torch.float64)
                dist.recv(x, src=rank - 1)
            start = time.perf_counter() - t0
            x.requires_grad_(rank > 0)
            y = stage(x)
            time.sleep(f_delay)
            saved[i] = (x, y)
            peak = max(peak, len(saved))
            held = sum(
                a.numel() * a.element_size() + b.numel() * b.element_size()
                for a, b in saved.values()
            )
            peak_bytes = max(peak_bytes, held)
            if rank < p - 1:
                sends.append(dist.isend(y.detach().contiguous(), dst=rank + 1))
        else:
            x, y = saved.pop(i)
            if rank == p - 1:
                assert micro_targets is not None
                start = time.perf_counter() - t0
                loss = nn.functional.mse_loss(y, micro_targets[i]) / micro
                loss.backward()
            else:
                grad = torch.empty_like(y)
                dist.recv(grad, src=rank + 1)
                start = time.perf_counter() - t0
                y.backward(grad)
            time.sleep(b_delay)
            if rank > 0:
                assert x.grad is not None
                sends.append(dist.isend(x.grad.contiguous(), dst=rank - 1))
        events.append([rank, kind, i, start, time.perf_counter() - t0])
    for work in sends:
        work.wait()
    grads = [p.grad.clone() if p.grad is not None else None for p in stage.parameters()]
    return {"events": events, "peak": peak, "peak_bytes": peak_bytes, "grads": grads}


def pipeline_demo(
    rank: int, order_name: str, micro: int, width: int = 16, delay: float = 0.02
) -> dict[str, Any]:
    """In each rank of a launch: one stage of ``make_stages(world)``, trained one step with
    GPipe ("gpipe") or 1F1B ("1f1b"); rank 0 also returns the gradients of the whole model
    in one process (the oracle) so that the caller compares."""
    from ddp_lab.pipeline_1f1b import one_f_one_b_order

    p = dist.get_world_size()
    make = gpipe_order if order_name == "gpipe" else one_f_one_b_order
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, width, generator=gen, dtype=torch.float64) for _ in range(micro)]
    ys = [torch.randn(4, width, generator=gen, dtype=torch.float64) for _ in range(micro)]
    stages = make_stages(p, width)
    out = run_stage(
        stages[rank],
        make(rank, p, micro),
        xs if rank == 0 else None,
        ys if rank == p - 1 else None,
        (4, width),
        f_delay=delay,
        b_delay=2 * delay,
    )
    whole = nn.Sequential(*make_stages(p, width))
    loss = sum(nn.functional.mse_loss(whole(x), y) / micro for x, y in zip(xs, ys, strict=True))
    loss.backward()
    want = [q.grad for q in whole[rank].parameters()]
    out["max_grad_diff"] = max(
        (g - w).abs().max().item() for g, w in zip(out["grads"], want, strict=True)
    )
    del out["grads"]
    return out


def measured_bubble(results: Sequence[dict[str, Any]]) -> float:
    """The bubble of a real run: ``bubble`` over every rank's measured passes."""
    return bubble([tuple(e) for r in results for e in r["events"]])


def plot_timeline(
    results: Sequence[dict[str, Any]],
    title: str = "",
    ax: Any = None,
    formula: float | None = None,
) -> Any:
    """Each rank's passes as bars (F light, B dark, the micro-batch written on each).

    With ``formula`` (the bubble (p-1)/(m+p-1)) the title also gives the measured bubble
    next to it, in the learner's language.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(results)))
    for r in results:
        for rank, kind, i, start, end in r["events"]:
            color = "#9ecae1" if kind == "F" else "#3182bd"
            ax.barh(rank, end - start, left=start, color=color, edgecolor="black", height=0.8)
            ax.text((start + end) / 2, rank, f"{kind}{i}", ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(results)), [_t("stage {stage}", stage=r) for r in range(len(results))])
    ax.invert_yaxis()
    ax.set_xlabel("s")
    if formula is not None:
        title = _t(
            "{name}: measured bubble {measured:.2f}, formula {formula:.2f}",
            name=title,
            measured=measured_bubble(results),
            formula=formula,
        )
    ax.set_title(title)
    return ax


def pipeline_runs(rank: int, micro: int = 8, width: int = 16, delay: float = 0.02) -> dict:
    """GPipe, then 1F1B, in one launch: ``pipeline_demo``'s result for each."""
    return {name: pipeline_demo(rank, name, micro, width, delay) for name in ("gpipe", "1f1b")}


def torch_pipeline_runs(rank: int, micro: int = 8, width: int = 16) -> dict[str, Any]:
    """In each rank of a launch: torch's ``ScheduleGPipe`` and ``Schedule1F1B``
    (``torch.distributed.pipelining``) on this rank's stage of ``make_stages(world)``, the
    same stages, micro-batches and loss as ``pipeline_demo``.

    Returns, per schedule, the order in which torch ran this stage's passes (recorded by
    wrapping the stage's ``forward_one_chunk`` and ``backward_one_chunk``, the calls its
    ``_step_microbatches`` makes; not the schedule's ``pipeline_order``, a table drawn for
    visualization: in torch 2.13 ``Schedule1F1B._get_pipeline_order`` gives the last stage
    F(1) .. F(m) where it runs F(0) .. F(m-1)), the largest difference of this stage's gradients from
    the whole model's in one process, and what ``Schedule1F1B`` says to fewer
    micro-batches than stages (its ``__init__`` refuses them; no pass runs).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    p = dist.get_world_size()
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, width, generator=gen, dtype=torch.float64) for _ in range(micro)]
    ys = [torch.randn(4, width, generator=gen, dtype=torch.float64) for _ in range(micro)]
    whole = nn.Sequential(*make_stages(p, width))
    sum(nn.functional.mse_loss(whole(x), y) / micro for x, y in zip(xs, ys, strict=True)).backward()
    want = [q.grad for q in whole[rank].parameters()]
    out: dict[str, Any] = {}
    for name, schedule in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        module = make_stages(p, width)[rank]
        stage = PipelineStage(module, rank, p, torch.device("cpu"))
        order: list[Op] = []
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_logged(
            i: int, *args: Any, _f: Any = forward, _o: list = order, **kwargs: Any
        ) -> Any:
            _o.append(("F", i))
            return _f(i, *args, **kwargs)

        def backward_logged(
            i: int, *args: Any, _b: Any = backward, _o: list = order, **kwargs: Any
        ) -> Any:
            _o.append(("B", i))
            return _b(i, *args, **kwargs)

        stage.forward_one_chunk = forward_logged  # type: ignore[method-assign]
        stage.backward_one_chunk = backward_logged  # type: ignore[method-assign]
        # the loss is averaged over each micro-batch, and torch divides the gradients by m
        # (scale_grads=True): the mean over the whole batch, as pipeline_demo computes it
        run = schedule(stage, micro, loss_fn=nn.functional.mse_loss)
        if rank == 0:
            run.step(torch.cat(xs))
        elif rank == p - 1:
            run.step(target=torch.cat(ys))
        else:
            run.step()
        diff = max(
            (q.grad - w).abs().max().item()
            for q, w in zip(module.parameters(), want, strict=True)
            if q.grad is not None
        )
        out[name] = {"order": order, "max_grad_diff": diff}
    try:
        Schedule1F1B(
            PipelineStage(make_stages(p, width)[rank], rank, p, torch.device("cpu")), p - 1
        )
        out["fewer_micro"] = ""
    except ValueError as exc:
        out["fewer_micro"] = " ".join(str(exc).split())
    return out
