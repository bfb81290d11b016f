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

CHECKPOINT_NAME = "last.pt"
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM")


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


def make_parser() -> argparse.ArgumentParser:
    """The command line of the training program."""
    p = argparse.ArgumentParser(
        prog="python -m ddp_lab.tools.train",
        description="Train a small CNN on scikit-learn's 8x8 digits with DDP. Launch with "
        "torchrun --nproc_per_node=N -m ddp_lab.tools.train [options].",
    )
    p.add_argument("--epochs", type=int, default=10, help="total epochs (default 10)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="samples per rank per step; global batch = this x world size",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=0.05,
        help="learning rate for a global batch of --base-batch (default 0.05)",
    )
    p.add_argument(
        "--base-batch",
        type=int,
        default=32,
        help="global batch that --lr was tuned for (default 32)",
    )
    p.add_argument(
        "--lr-scaling",
        choices=("linear", "sqrt", "none"),
        default="linear",
        help="how the LR grows with the global batch (default linear)",
    )
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0, help="model init and shuffling seed")
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: cpu:gloo,cuda:nccl when every local rank has a GPU of its own, else gloo",
    )
    p.add_argument("--data-dir", default=None, help="where the prepared digits file goes")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help=f"rank 0 writes {CHECKPOINT_NAME} here after every epoch",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="last",
        default=None,
        metavar="PATH",
        help=f"continue from PATH (default: <checkpoint-dir>/{CHECKPOINT_NAME})",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads per rank (default: leave torch's / the launcher's choice)",
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=0,
        help="LR warmup: grow the LR linearly over this many steps (default 0: none)",
    )
    p.add_argument(
        "--augment",
        action="store_true",
        help="shift each training image by a random pixel (draws from each rank's RNG)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="every K steps write a resumable checkpoint (ddp_lab.tools.resume) to "
        "--checkpoint-dir; on start, resume from the latest complete one",
    )
    p.add_argument(
        "--fail-at-step",
        type=int,
        default=0,
        metavar="S",
        help="the last rank kills itself (SIGKILL) after step S, once (for demonstrations)",
    )
    p.add_argument(
        "--preempt-signal",
        default=None,
        metavar="SIG[,SIG]",
        help="on one of these signals (USR1, USR2, TERM; TERM is always added: a preempted "
        "or cancelled Slurm job and torchrun's shutdown send it), every rank finishes its "
        "step, a checkpoint is written to --checkpoint-dir with a file 'preempted', and the "
        "run exits",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=0,
        metavar="SECONDS",
        help="process group timeout: a collective that waits longer fails (default: "
        "torch's, 30 minutes for gloo)",
    )
    p.add_argument(
        "--step-sleep",
        type=float,
        default=0,
        metavar="SECONDS",
        help="sleep after every step, as if the model were bigger (for demonstrations)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic kernels on a GPU (cuDNN, cuBLAS, torch's own): two runs, or a run "
        "and its resumed twin, end with the same parameters; slower (chapter 11)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    # torch.distributed.launch (deprecated) passes --local-rank=N; torchrun sets LOCAL_RANK.
    p.add_argument("--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Raise ValueError with a clear message for arguments that cannot work."""
    for name in ("epochs", "batch_size", "base_batch", "lr"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(
                _t(
                    "{name} must be a positive number, got {value}.",
                    name="--" + name.replace("_", "-"),
                    value=value,
                )
            )
    for name in ("threads", "warmup_steps", "checkpoint_every", "fail_at_step", "timeout",
                 "step_sleep"):  # fmt: skip
        if not (getattr(args, name) >= 0 and math.isfinite(getattr(args, name))):
            raise ValueError(
                _t(
                    "{name} must be a positive number, got {value}.",
                    name="--" + name.replace("_", "-"),
                    value=getattr(args, name),
                )
            )
    if (args.checkpoint_every or args.fail_at_step) and not args.checkpoint_dir:
        raise ValueError(_t("--checkpoint-every and --fail-at-step need --checkpoint-dir."))
    if args.preempt_signal is not None:
        names = [n.strip().upper().removeprefix("SIG") for n in args.preempt_signal.split(",")]
        if not names or any(n not in PREEMPT_SIGNALS for n in names):
            raise ValueError(
                _t(
                    "--preempt-signal takes signals from {choices}, separated by commas; "
                    "got {value}.",
                    choices=", ".join(PREEMPT_SIGNALS),
                    value=args.preempt_signal,
                )
            )
        args.preempt_signal = ",".join(dict.fromkeys([*names, "TERM"]))
    if args.preempt_signal and not (args.checkpoint_dir and args.checkpoint_every):
        raise ValueError(_t("--preempt-signal needs --checkpoint-dir and --checkpoint-every."))
    if (
        args.checkpoint_dir
        and Path(args.checkpoint_dir).exists()
        and not Path(args.checkpoint_dir).is_dir()
    ):
        raise ValueError(
            _t("--checkpoint-dir {path} exists and is not a folder.", path=args.checkpoint_dir)
        )
    if args.resume == "last":
        if not args.checkpoint_dir:
            raise ValueError(_t("--resume without a path needs --checkpoint-dir."))
        args.resume = str(Path(args.checkpoint_dir) / CHECKPOINT_NAME)
    if args.resume and not Path(args.resume).is_file():
        raise ValueError(
            _t(
                "--resume: no checkpoint at {path}. Train once with --checkpoint-dir "
                "first, or leave out --resume.",
                path=args.resume,
            )
        )
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(_t("--backend nccl needs CUDA GPUs; this machine has none. Use gloo."))
    if args.backend == "nccl":  # one GPU per rank on this node (runtime/device.py)
        device_rule.check_nccl(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line; a bad argument exits with usage and a message."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return check_args(args)
    except ValueError as exc:
        parser.error(str(exc))  # exits with code 2, like argparse's own errors
        raise  # unreachable


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


def comm_device() -> torch.device:
    """Where tensors for collectives must live: nccl only reduces CUDA tensors."""
    if device_rule.uses_nccl(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def mean_across_ranks(total: float, count: int) -> float:
    """The mean over every rank's samples, from each rank's local sum and count.

    Each rank's loss is its own; this is the number to log. Weighting by ``count`` keeps
    it right when ranks saw different numbers of samples.
    """
    t = torch.tensor([float(total), float(count)], dtype=torch.float64, device=comm_device())
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


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The training run on this rank (the process group is already initialised)."""
    from ddp_lab.tools import resume  # chapter 11: step checkpoints that resume bit for bit

    rank, world = dist.get_rank(), dist.get_world_size()
    # The one device rule (runtime/device.py): nccl -> this local rank's own GPU; gloo: CPU.
    uses_gpu = device_rule.uses_nccl(dist.get_backend())
    device = device_rule.this_rank_device(dist.get_backend(), use_gpu=uses_gpu)
    if device.type == "cuda":
        torch.cuda.set_device(device)
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
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

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
    stop = resume.StopOnSignal(args.preempt_signal, comm_device()) if args.preempt_signal else None
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
        elapsed = torch.tensor([time.perf_counter() - t0], device=comm_device())
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # an epoch lasts as long as its slowest rank
        history["train_loss"].append(mean_across_ranks(total, count))
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


def make_deterministic() -> None:
    """Ask every GPU library for its deterministic algorithms (before CUDA starts).

    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` makes cuBLAS use fixed workspaces (read when a
    cuBLAS handle is created, so it is set before any CUDA call); cuDNN's ``deterministic``
    and no ``benchmark`` (which times candidate algorithms and may pick another each run);
    ``torch.use_deterministic_algorithms(True)`` makes torch's own kernels deterministic and
    raises on an operation that has no deterministic version (``torch/__init__.py``).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def _ensure_launcher_env() -> None:
    """Plain ``python -m ddp_lab.tools.train``: behave as a one-rank launch on a free port."""
    if "RANK" not in os.environ:
        from ddp_lab.runtime.launcher import free_port

        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )


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


def exit_without_finalizing(code: int = 0) -> None:
    """End a launched worker after ``main`` returned, skipping Python's finalization.

    Why: ``destroy_process_group`` does not free a gloo group a DDP model used; its worker
    threads live on (pytorch/pytorch#107298; ``tests/test_train.py`` shows it). Such a thread
    may still be dropping the work of the last collective while the interpreter finalizes.
    Dropping it releases tensors Python also saw, which needs the GIL, and Python 3.11 ends a
    thread that asks for the GIL during finalization with ``pthread_exit``: its unwinding
    through the work's destructor calls ``std::terminate``, and the worker dies with SIGABRT
    ("terminate called without an active exception") after training finished. Seen here in 6
    of 20 four-rank runs of a small loop, and as a FAILED Slurm job; the core dump shows that
    stack. ``os._exit`` ends the process without finalizing: nothing asks for the GIL any more.
    Output is flushed first, since ``os._exit`` does not.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
    exit_without_finalizing(0)
