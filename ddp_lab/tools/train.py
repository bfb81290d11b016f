"""A complete DDP training program: a small CNN on the 8x8 digits, torchrun-ready.

Run it with any launcher::

    torchrun --nproc_per_node=2 -m ddp_lab.tools.train --epochs 10 --checkpoint-dir ckpt
    python -m ddp_lab.tools.train --epochs 3            # one process, no launcher needed

or from a notebook with ``launch(["--epochs", "3"], nprocs=2)`` (``dl.spawn`` underneath).
Every piece a real DDP program needs is here: process group from the launcher's
environment, DistributedSampler + ``set_epoch``, DDP, per-rank vs global batch and LR
scaling, the loss averaged over ranks for logging, evaluation gathered from all ranks
without the sampler's padding, a progress bar on rank 0 only, checkpoints written by
rank 0 (then a barrier) and read with ``map_location``, resume, and a clean shutdown.
Chapter 11 adds ``--checkpoint-every K`` (atomic step checkpoints that resume bit for bit,
``ddp_lab/tools/resume.py``), ``--fail-at-step S`` and the SHA-256 of the final parameters; for
its elastic and Slurm demos ``--timeout`` (the process group's), ``--step-sleep`` and
``--preempt-signal`` (checkpoint and stop on a scheduler's warning or SIGTERM).

How it differs from a production script: no mixed precision, no gradient clipping, only a
linear LR warmup, no DataLoader workers (the whole data set is a 1 MB tensor).

The command line lives in ``train_args.py``, the epoch checkpoints in ``train_checkpoint.py``
and the process's start and end in ``train_process.py``; this module is the program itself
(model, loop, evaluation, entry points) and re-exports their names.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddp_lab.i18n import _t
from ddp_lab.runtime import device as device_rule
from ddp_lab.tools import attempt_store
from ddp_lab.tools.data import load_digits_split
from ddp_lab.tools.train_args import (
    PREEMPT_SIGNALS,  # noqa: F401  # re-exported (as every name these imports bring)
    check_args,
    make_parser,
    parse_args,
)
from ddp_lab.tools.train_checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    rescale_schedule,
    save_checkpoint,
)
from ddp_lab.tools.train_process import (
    _ensure_launcher_env,
    exit_without_finalizing,
    fixed_buckets,
    make_deterministic,
    pick_device,
)


class SmallCNN(nn.Module):
    """Two 3x3 convolutions and a linear classifier for 1x8x8 images (about 25k weights)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def scaled_lr(lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """The learning rate for ``global_batch`` when ``lr`` was tuned for ``base_batch``.

    With k = global_batch / base_batch: "linear" (Goyal et al. 2017) multiplies the LR by k,
    which keeps SGD's gradient noise scale (about lr * dataset_size / batch, Smith and Le
    2017) constant, and needs a warmup from ``lr`` to ``k * lr`` over the first epochs
    (Goyal et al. used 5); "sqrt" (Krizhevsky 2014) multiplies it by sqrt(k), which keeps
    the variance of one update (lr**2 / batch times the per-sample gradient covariance)
    constant, so the noise scale falls as the batch grows; "none" keeps the LR.
    """
    k = global_batch / base_batch
    return lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[rule]


def comm_device(device: torch.device | None = None) -> torch.device:
    """Where tensors for collectives must live: nccl only reduces CUDA tensors.

    ``device``: this rank's compute device; with ``"cpu:gloo,cuda:nccl"`` a CPU rank's
    tensors go through gloo (``device_rule.settle_gpu`` may have kept the rank on CPU).
    """
    if not device_rule.uses_nccl(dist.get_backend()):
        return torch.device("cpu")
    return device or torch.device("cuda", torch.cuda.current_device())


def mean_across_ranks(total: float, count: int, device: torch.device | None = None) -> float:
    """The mean over every rank's samples, from each rank's local sum and count.

    Each rank's loss is its own; this is the number to log. Weighting by ``count`` keeps
    it right when ranks saw different numbers of samples.
    """
    t = torch.tensor([float(total), float(count)], dtype=torch.float64, device=comm_device(device))
    dist.all_reduce(t)  # SUM: the total over ranks and the number of samples
    return (t[0] / t[1]).item()


def unpadded_mean(indices: torch.Tensor, values: torch.Tensor) -> float:
    """Mean of ``values`` counting each sample index once (drops the sampler's padding)."""
    first = torch.zeros(0, dtype=torch.long)
    if len(indices):
        uniq, inverse = torch.unique(indices, return_inverse=True)
        # The first position of each index: padding repeats indices already seen.
        pos = torch.arange(len(indices))
        first = torch.full((len(uniq),), len(indices)).scatter_reduce(0, inverse, pos, "amin")
    return values[first].double().mean().item() if len(first) else float("nan")


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, batch_size: int, device: torch.device
) -> tuple[float, float]:
    """Test loss and accuracy over the whole data set, computed by all ranks together.

    Each rank scores its DistributedSampler shard; ``all_gather`` collects (index,
    correct, loss) from every rank, and duplicated indices (the padding that makes the
    shards equal) are counted once, so the result equals a single-process evaluation.
    """
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    model.eval()
    rows = []
    for x, y in loader:
        out = model(x.to(device))
        y = y.to(device)
        loss = F.cross_entropy(out, y, reduction="none")
        rows.append(torch.stack([(out.argmax(1) == y).double(), loss.double()], 1).cpu())
    model.train()
    local = torch.cat(rows) if rows else torch.zeros(0, 2, dtype=torch.float64)
    index = torch.tensor(list(iter(sampler)), dtype=torch.float64).unsqueeze(1)
    local = torch.cat([index, local], 1).to(device)
    # Every shard has sampler.num_samples rows, so a plain all_gather fits.
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    every = torch.cat(parts).cpu()
    idx = every[:, 0].long()
    return unpadded_mean(idx, every[:, 2]), unpadded_mean(idx, every[:, 1])


class Progress:
    """A minimal text progress bar: redrawn in a terminal, one line per epoch otherwise."""

    def __init__(self, total: int, label: str, enabled: bool, stream: TextIO | None = None):
        self.total, self.label, self.enabled = total, label, enabled
        self.stream = stream or sys.stdout
        self.tty = enabled and self.stream.isatty()
        self.done = 0

    def _line(self, extra: str) -> str:
        filled = round(20 * self.done / max(1, self.total))
        return (
            f"{self.label} [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} {extra}"
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.tty:
            self.stream.write("\r" + self._line(""))
            self.stream.flush()

    def close(self, extra: str) -> None:
        if self.enabled:
            self.stream.write(("\r" if self.tty else "") + self._line(extra) + "\n")
            self.stream.flush()


def pick_backend(choice: str) -> str:
    """``auto``: ``"cpu:gloo,cuda:nccl"`` when every local rank can have its own GPU, else
    gloo (``runtime/device.py``'s rule)."""
    if choice != "auto":
        return choice
    return device_rule.auto_backend(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def augment(x: torch.Tensor) -> torch.Tensor:
    """Shift each image by -1, 0 or 1 pixel in each direction (draws from torch's RNG)."""
    shifts = torch.randint(-1, 2, (len(x), 2))
    return torch.stack(
        [
            torch.roll(img, (int(dy), int(dx)), dims=(-2, -1))
            for img, (dy, dx) in zip(x, shifts, strict=True)
        ]
    )


def warmup(steps: int):
    """The LR factor of a linear warmup over ``steps`` steps (LambdaLR's lambda)."""
    return lambda step: min(1.0, (step + 1) / steps) if steps else 1.0


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The training run on this rank (the process group is already initialised)."""
    from ddp_lab.tools import resume  # chapter 11: step checkpoints that resume bit for bit

    rank, world = dist.get_rank(), dist.get_world_size()
    # The one device rule (runtime/device.py): nccl -> this local rank's own GPU; gloo: CPU.
    device = pick_device(rank, args.quiet)
    if args.threads:
        # Two ranks x two threads on two cores fight for them; a busy machine makes it worse.
        torch.set_num_threads(args.threads)
    train_set, test_set = load_digits_split(args.data_dir)

    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = SmallCNN().to(device)
    torch.manual_seed(args.seed + 1 + rank)  # but each rank its own random stream after it
    global_batch = args.batch_size * world
    lr = scaled_lr(args.lr, global_batch, args.base_batch, args.lr_scaling)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup(args.warmup_steps))
    history: dict[str, Any] = {"train_loss": [], "test_loss": [], "test_acc": [], "epoch_time": []}
    sampler = resume.ResumableDistributedSampler(train_set, shuffle=True, seed=args.seed)
    start_epoch, step, total, count, rng = 0, 0, 0.0, 0, None
    latest = resume.latest_checkpoint(args.checkpoint_dir) if args.checkpoint_every else None
    if args.resume:
        state = load_checkpoint(args.resume, device)
        model.load_state_dict(state["model"])  # before DDP: its broadcast sees these weights
        optimizer.load_state_dict(state["optimizer"])  # momentum: every rank needs its own copy
        for group in optimizer.param_groups:
            group["lr"] = lr  # the world size (hence the global batch) may have changed
        start_epoch, history = state["epoch"], state["history"]
    elif latest is not None:  # a step checkpoint: continue exactly where it stopped
        state = resume.load(latest, device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        # The restored schedule carries the old run's base LR (``base_lrs``) and the
        # optimizer its current LR: rescale both to this world's LR (equal when unchanged).
        rescale_schedule(optimizer, scheduler, lr)
        sampler.load_state_dict(state["sampler"])
        step, history = state["step"], state["history"]
        start_epoch = sampler.epoch
        if len(state["ranks"]) == world:
            rng = state["ranks"][rank]["rng"]
            total, count = state["ranks"][rank]["total"], state["ranks"][rank]["count"]
        else:  # same data position, other random streams: exact no more
            sampler.start = state["sampler"]["start"]
            if rank == 0:
                print(
                    _t(
                        "the checkpoint was written by {old} ranks, this run has {new}: the data "
                        "position carries over, but not each rank's random state, so this run "
                        "will not match an uninterrupted one bit for bit",
                        old=len(state["ranks"]),
                        new=world,
                    ),
                    flush=True,
                )
        if rank == 0 and not args.quiet:
            print(
                _t(
                    "resumed from {path}: step {step}, epoch {epoch}, {start} samples of "
                    "this epoch already used",
                    path=latest,
                    step=step,
                    epoch=start_epoch + 1,
                    start=sampler.start,
                ),
                flush=True,
            )
    ddp = DDP(
        model, device_ids=[device.index] if device.type == "cuda" else None, **fixed_buckets()
    )

    # A generator of its own: a DataLoader iterator draws a seed from it at every epoch,
    # which would otherwise come from (and move) the global torch RNG the training uses.
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        sampler=sampler,
        pin_memory=device.type == "cuda",
        generator=torch.Generator(),
    )
    if rank == 0 and not args.quiet:
        print(
            f"world size {world}, {args.batch_size} per rank = global batch {global_batch}, "
            f"lr {optimizer.param_groups[0]['lr']:g} ({args.lr_scaling} scaling), "
            f"backend {dist.get_backend()}",
            flush=True,
        )
    if rng is not None:
        resume.set_rng_state(rng)  # last: nothing above may draw after this
    comm = comm_device(device)
    stop = resume.StopOnSignal(args.preempt_signal, comm) if args.preempt_signal else None
    if args.preempt_signal and rank == 0:
        (Path(args.checkpoint_dir) / "preempted").unlink(missing_ok=True)
    run_start = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        if epoch != start_epoch or latest is None or args.resume:
            sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
            total, count = 0.0, 0
        bar = Progress(
            len(loader), f"epoch {epoch + 1}/{args.epochs}", enabled=rank == 0 and not args.quiet
        )
        dist.barrier()  # time the epoch from a common start
        t0 = time.perf_counter()
        done_before = sampler.start  # this epoch's samples used before this run
        for i, (x, y) in enumerate(loader):
            if args.augment:
                x = augment(x)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()  # DDP averages the gradients over ranks here
            optimizer.step()
            scheduler.step()
            step += 1
            total += loss.item() * len(y)
            count += len(y)
            bar.update()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if args.fail_at_step == step and rank == world - 1:
                resume.fail_once(args.checkpoint_dir, step)
            due = bool(args.checkpoint_every) and step % args.checkpoint_every == 0
            preempted = stop.agreed() if stop is not None else 0
            if due or preempted:
                used = done_before + (i + 1) * args.batch_size * world
                sampler.start = min(len(train_set), used)
                resume.save_step(
                    args.checkpoint_dir,
                    step,
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "sampler": sampler.state_dict(),
                        "step": step,
                        "world_size": world,
                        "history": history,
                        "local": {"total": total, "count": count},
                    },
                )
            if preempted:
                if rank == 0:
                    (Path(args.checkpoint_dir) / "preempted").write_text(f"{step}\n")
                    print(
                        f"{signal.Signals(preempted).name} arrived: stopped after step {step}, "
                        "checkpoint written",
                        flush=True,
                    )
                history.update(preempted=step, world_size=world, rank=rank, steps=step)
                return history
        sampler.start = 0
        elapsed = torch.tensor([time.perf_counter() - t0], device=comm)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # an epoch lasts as long as its slowest rank
        history["train_loss"].append(mean_across_ranks(total, count, device))
        test_loss, test_acc = evaluate(ddp.module, test_set, 256, device)
        history["test_loss"].append(test_loss)
        history["test_acc"].append(test_acc)
        history["epoch_time"].append(elapsed.item())
        bar.close(
            f"loss {history['train_loss'][-1]:.4f} test acc {100 * test_acc:.2f}% "
            f"{elapsed.item():.2f}s"
        )
        if args.checkpoint_dir:
            save_checkpoint(
                Path(args.checkpoint_dir) / CHECKPOINT_NAME,
                ddp,
                optimizer,
                epoch + 1,
                history,
                args,
            )
    digest = resume.params_sha256(model)
    if rank == 0:
        if not args.quiet and history["test_acc"]:
            print(
                f"done: test accuracy {100 * history['test_acc'][-1]:.2f}% after "
                f"{len(history['test_acc'])} epochs, {time.perf_counter() - run_start:.1f}s "
                "in this run",
                flush=True,
            )
        print(f"final parameters sha256 {digest}", flush=True)
    history.update(
        world_size=world,
        global_batch=global_batch,
        lr=lr,
        rank=rank,
        final_weights_sum=sum(p.double().sum().item() for p in model.parameters()),
        sha256=digest,
        steps=step,
    )
    return history


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of every rank: parse, init the process group, train, shut down."""
    args = parse_args(argv)
    if args.deterministic:
        make_deterministic()
    _ensure_launcher_env()
    owns_group = not dist.is_initialized()
    if owns_group:  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the launcher
        timeout = datetime.timedelta(seconds=args.timeout) if args.timeout else None
        # Under torchrun's shared store, keys of this restart attempt only (attempt_store.py).
        attempt_store.init_process_group(pick_backend(args.backend), timeout)
    try:
        return train(args)
    finally:
        if owns_group:
            dist.destroy_process_group()  # clean shutdown, also after an error


def spawn_main(rank: int, argv: list[str]) -> dict[str, Any]:
    """``dl.spawn``'s entry: the same program, with ``rank`` from the launcher."""
    return main(argv)


def launch(argv: list[str], nprocs: int = 2, **spawn_kwargs: Any) -> list[dict[str, Any]]:
    """Check ``argv`` here, then run the program on ``nprocs`` ranks with ``dl.spawn``."""
    from ddp_lab.runtime.launcher import spawn

    try:
        check_args(make_parser().parse_args(argv))
    except SystemExit:
        raise ValueError(f"bad arguments: {argv}") from None
    return spawn(spawn_main, args=(list(argv),), nprocs=nprocs, **spawn_kwargs)


if __name__ == "__main__":
    main()
    exit_without_finalizing(0)
