"""The training program's epoch checkpoints and what a resumed schedule needs.

Rank 0 writes ``model.module``'s weights, the optimizer and the history atomically, then
every rank waits at a barrier; a checkpoint is read onto the rank's own device
(``map_location``); ``rescale_schedule`` gives a restored LR schedule this world's LR.
Chapter 11's step checkpoints that resume bit for bit are ``tools/resume.py``.
``tools/train.py`` re-exports these names.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

CHECKPOINT_NAME = "last.pt"


def save_checkpoint(
    path: Path,
    model: DDP,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    history: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    """Rank 0 writes ``model.module``'s weights (not the wrapper's); then every rank waits."""
    if dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "history": history,
            "args": {k: v for k, v in vars(args).items() if k != "local_rank"},
        }
        torch.save(state, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)  # atomic: a reader never sees half a file
    dist.barrier()  # nobody reads (or resumes from) the file before it is complete


def load_checkpoint(path: str | Path, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint onto this rank's device (``map_location``), tensors only."""
    return torch.load(path, map_location=device, weights_only=True)


def rescale_schedule(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float
) -> None:
    """Give a restored ``LambdaLR`` the base LR ``lr``, at the step it had reached.

    ``LRScheduler.load_state_dict`` puts back the checkpoint's ``base_lrs`` and
    ``optimizer.load_state_dict`` its groups' ``lr``: the LR of the world that wrote the
    checkpoint. Here every group gets ``lr * lambda(last_epoch)``, what ``LambdaLR`` itself
    computes, so an unchanged world resumes with the very same floats.
    """
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    for group, fn in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
