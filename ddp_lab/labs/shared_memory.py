"""Tensors shared between processes with ``torch.multiprocessing``, and Hogwild.

Chapter 07 contrasts DDP (every process has its own replica; gradients are all-reduced;
the replicas stay identical) with the other way to train in several processes on one
machine: one model in **shared memory**, updated by every process without locks (Hogwild,
Recht et al. 2011; ``examples/mnist_hogwild`` in pytorch/examples).

What ``torch.multiprocessing`` does (torch 2.13, ``torch/multiprocessing/reductions.py``):
a CPU tensor sent to another process (through a ``torch.multiprocessing`` queue, or as an
argument of a process it starts) is not copied: its storage is moved to shared memory
(``share_memory_()``) and the receiver gets a handle to the same memory, so in-place changes
are seen on both sides. The handle travels as a file descriptor ("file_descriptor", the
default on Linux) or as a file name in shared memory ("file_system", for when too many
descriptors would be open); ``torch.multiprocessing.get_all_sharing_strategies()`` lists
them. CUDA tensors are shared with CUDA IPC instead, and the sender must keep them alive.

The children run functions of this module (never of a notebook), started with the
"spawn" method: each child imports torch afresh, which takes a few seconds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn


def _add_one(t: torch.Tensor, queue: Any) -> None:
    torch.set_num_threads(1)
    queue.put((t.is_shared(), t.data_ptr() != 0))
    t.add_(1)  # in place: visible to the parent only if the memory is shared


def send_tensor() -> dict[str, Any]:
    """Send a tensor to a child that adds 1 in place; return what each side saw."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    t = torch.zeros(3)
    before = t.is_shared()
    child = ctx.Process(target=_add_one, args=(t, queue))
    child.start()
    child_shared, _ = queue.get(timeout=120)
    child.join(timeout=120)
    return {
        "strategy": mp.get_sharing_strategy(),
        "strategies": sorted(mp.get_all_sharing_strategies()),
        "shared before sending": before,
        "shared after sending": t.is_shared(),
        "shared in the child": child_shared,
        "parent sees the child's add_": t.tolist(),
    }


def _hogwild_worker(model: nn.Module, rank: int, steps: int, lr: float) -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(rank)
    w_true = torch.tensor([[2.0, -3.0]])
    opt = torch.optim.SGD(model.parameters(), lr=lr)  # each process its own optimizer
    for _ in range(steps):
        x = torch.randn(16, 2, generator=gen)
        loss = nn.functional.mse_loss(model(x), x @ w_true.T)
        opt.zero_grad()
        loss.backward()
        opt.step()  # writes straight into the shared parameters, no lock, no all-reduce


def hogwild(nprocs: int = 2, steps: int = 200, lr: float = 0.05) -> dict[str, Any]:
    """Train one shared ``nn.Linear(2, 1)`` from ``nprocs`` processes, Hogwild-style.

    This process is worker 0; it starts ``nprocs - 1`` children and trains alongside them.
    """
    torch.manual_seed(0)
    model = nn.Linear(2, 1, bias=False)
    model.share_memory()  # the parameters' storage moves to shared memory
    start = model.weight.detach().clone()
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_hogwild_worker, args=(model, r, steps, lr)) for r in range(1, nprocs)
    ]
    for p in procs:
        p.start()
    threads = torch.get_num_threads()
    _hogwild_worker(model, 0, steps, lr)
    torch.set_num_threads(threads)
    for p in procs:
        p.join(timeout=300)
    return {
        "shared": model.weight.is_shared(),
        "start": start.flatten().tolist(),
        "after": [round(v, 3) for v in model.weight.detach().flatten().tolist()],
        "target": [2.0, -3.0],
        "exit codes": [p.exitcode for p in procs],
    }
