"""The training program's command line: its options, their checks, and ``parse_args``.

What ``python -m ddp_lab.tools.train --help`` lists (chapter 08 prints it), and the checks
that turn a bad combination into a clear error before any process group exists.
``tools/train.py`` re-exports these names.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch

from ddp_lab.i18n import _t
from ddp_lab.runtime import device as device_rule
from ddp_lab.tools.train_checkpoint import CHECKPOINT_NAME

PREEMPT_SIGNALS = ("USR1", "USR2", "TERM")


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
