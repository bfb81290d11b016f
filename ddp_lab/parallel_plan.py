"""The arithmetic of choosing DP, FSDP, TP, PP: memory, bytes and FLOPs per rank per step.

``per_step`` is a calculator for a stack of transformer-style MLP blocks (``dim`` ->
``4 dim`` -> ``dim``) trained with float32 AdamW on ``dp x tp x pp`` ranks. Its parts come
from the course's models: parameters, gradients and optimizer state per rank from
``labs.memory_model.zero_bytes_per_rank`` (k = 8, 4-byte parameters and gradients), the bytes a
rank sends from the ring algorithms of chapter 04/05 (an all-reduce sends ``2 (n-1)/n`` of
its payload, an all-gather or a reduce-scatter ``(n-1)/n``), FLOPs as ``6 x parameters x
rows`` (2 forward, 4 backward per parameter and row), the pipeline's bubble
(``pipeline.bubble_formula``). ``measure_tp_step`` runs the same stack for real (in each rank
of a launch) so that the calculator's numbers sit next to measured ones; ``fake_world``
answers the memory question at a world size no laptop has, with torch's fake process group.

How this differs from real planners: activations are counted for the MLP only (no attention,
no layer norm, no recomputation), communication and compute do not overlap, and the link is
one alpha-beta pair for every rank pair (a real cluster has fast links inside a node and
slower ones between nodes, which is why TP goes inside a node).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.costs import gloo_cpu
from ddp_lab.labs.memory_model import zero_bytes_per_rank
from ddp_lab.pipeline import bubble_formula


def mlp_params(dim: int, layers: int) -> int:
    """Parameters of ``layers`` blocks Linear(dim, 4 dim) + Linear(4 dim, dim)."""
    return layers * (2 * 4 * dim * dim + 4 * dim + dim)


def per_step(
    dim: int, layers: int, rows: int, dp: int = 1, tp: int = 1, pp: int = 1,
    fsdp: bool = False, micro: int = 1,
) -> dict[str, float]:  # fmt: skip
    """Per rank and step: memory (bytes), bytes sent, FLOPs, and the bubble.

    ``rows``: the global batch's rows (tokens); each DP rank gets ``rows / dp``, cut into
    ``micro`` micro-batches when ``pp > 1`` (1F1B: stage 0 holds ``min(pp, micro)`` of them).
    """
    # this rank's model slice, before FSDP: fc2's bias is whole on every TP rank
    psi = layers * (8 * dim * dim / tp + 4 * dim / tp + dim) / pp
    state = zero_bytes_per_rank(psi, dp, 3 if fsdp else 0, k=8, param_bytes=4, grad_bytes=4)
    local_rows = rows / dp
    held_rows = local_rows if pp == 1 else local_rows / micro * min(pp, micro)
    per_layer_act = (dim + 2 * 4 * dim / tp) * 4  # input, hidden before and after gelu
    activations = layers / pp * held_rows * per_layer_act
    sent = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    if dp > 1:
        share = (dp - 1) / dp * psi * 4
        sent["dp"] = 3 * share if fsdp else 2 * share  # gather, gather again, reduce-scatter
    if tp > 1:  # one all-reduce forward (g) and one backward (f) per block
        sent["tp"] = layers / pp * 2 * 2 * (tp - 1) / tp * local_rows * dim * 4
    if pp > 1:  # activations forward, their gradients backward, one boundary each way
        sent["pp"] = 2 * local_rows * dim * 4
    flops = 6 * psi * local_rows
    return {
        "params+grads+optim": state["total"],
        "activations": activations,
        "memory": state["total"] + activations,
        "sent_dp": sent["dp"],
        "sent_tp": sent["tp"],
        "sent_pp": sent["pp"],
        "sent": sum(sent.values()),
        "flops": flops,
        "bubble": bubble_formula(pp, micro) if pp > 1 else 0.0,
    }


def predict_time(
    dim: int, layers: int, rows: int, tp: int, flops_per_s: float, alpha: float, beta: float
) -> dict[str, float]:
    """A TP-only step's time: compute at the measured FLOP rate + the all-reduces (gloo model)."""
    plan = per_step(dim, layers, rows, tp=tp)
    compute = plan["flops"] / flops_per_s
    comm = 2 * layers * gloo_cpu("all_reduce", tp, rows * dim * 4, alpha, beta) if tp > 1 else 0.0
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm}


def matmul_flops_per_s(n: int = 256, reps: int = 20) -> float:
    """This process's float32 matmul rate (the best of ``reps``): the 'peak' of an MFU."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def measure_tp_step(
    rank: int, dim: int = 64, layers: int = 4, rows: int = 256, steps: int = 6
) -> dict:
    """In each rank of a launch: ``layers`` TP MLP blocks, float32 AdamW, timed steps.

    Returns the median step time, the bytes of parameters + gradients + optimizer state this
    rank holds, the all-reduce payloads counted in one step, and this rank's matmul rate.
    """
    from ddp_lab.comm_debug import count_collectives
    from ddp_lab.tensor_parallel import MLP, TensorParallelMLP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[TensorParallelMLP(MLP(dim, 4 * dim)) for _ in range(layers)])
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3)
    x = torch.randn(rows, dim, requires_grad=True)  # as inside a deep model: f's backward runs
    times: list[float] = []
    payloads: list[int] = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        with count_collectives() as log:
            blocks(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        times.append(time.perf_counter() - t0)
        payloads = [b for _, _, b in log.calls]
    held = [p for p in blocks.parameters()] + [p.grad for p in blocks.parameters()]
    held += [v for s in opt.state.values() for v in s.values() if v.dim() > 0]
    return {
        "step_s": sorted(times[1:])[len(times[1:]) // 2],
        "state_bytes": sum(t.numel() * t.element_size() for t in held),
        "payloads": payloads,
        "flops_per_s": matmul_flops_per_s(),
    }


def fake_world(rank: int, world: int = 1024, dim: int = 4096, layers: int = 4, tp: int = 8) -> dict:
    """One process as rank 17 of ``world``: torch's fake process group, a 2D mesh, and the
    local shards of a model built on the meta device (no memory) under
    ``fully_shard`` x ``parallelize_module`` (torch: ``torch/testing/_internal/distributed/
    fake_pg.py``, ``FakeStore``; the ``fake`` backend, ``FakeProcessGroup`` in
    ``torch/csrc/distributed/c10d/FakeProcessGroup.hpp``, answers every collective at once
    without communicating: an all-reduce leaves its tensor as it was, an all-gather copies
    this rank's input into every slot; shapes and placements are real, values are not). Also
    returns what one all-reduce and one all-gather gave, to show it.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ddp_lab.tensor_parallel import MLP

    dist.init_process_group("fake", store=FakeStore(), rank=17, world_size=world)
    try:
        out: dict[str, Any] = {"world": dist.get_world_size(), "rank": dist.get_rank()}
        ones = torch.ones(1)
        dist.all_reduce(ones)  # a real one would give 1,024
        slots = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(slots, torch.tensor([float(dist.get_rank())]))
        out["all_reduce"] = ones.item()
        out["all_gather"] = sorted({t.item() for t in slots})
        for name, shape in (("fsdp", (world,)), ("fsdp x tp", (world // tp, tp))):
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")[: len(shape)])
            with torch.device("meta"):
                model = torch.nn.Sequential(*[MLP(dim, 4 * dim) for _ in range(layers)])
            if len(shape) == 2:
                for block in model:
                    parallelize_module(
                        block, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
                    )
            for block in model:
                fully_shard(block, mesh=mesh["dp"])
            local = sum(p.to_local().numel() for p in model.parameters())
            out[name] = {
                "mesh": list(shape),
                "params_per_rank": local,
                "fc1.weight": [list(model[0].fc1.weight.shape), list(model[0].fc1.weight.to_local().shape),
                               [str(p) for p in model[0].fc1.weight.placements]],
            }  # fmt: skip
        out["params"] = mlp_params(dim, layers)
        return out
    finally:
        dist.destroy_process_group()
