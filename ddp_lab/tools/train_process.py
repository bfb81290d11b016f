"""The training program's process: how it starts and how it ends, around the training.

This rank's device (``pick_device``: the one rule, checked across nodes), deterministic GPU
libraries (set before CUDA starts), a DDP bucket layout that stays the
same at every step (``fixed_buckets``: bit-for-bit resume on 3 ranks or more), a one-rank
launcher environment on a free port when it runs without a launcher, and an exit that skips Python's finalization
(which could abort a finished worker). ``tools/train.py`` re-exports these names.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def pick_device(rank: int, quiet: bool) -> torch.device:
    """This rank's device by the one rule (``runtime/device.py``), made current on a GPU.

    nccl (alone or in auto's mixed group): this local rank's own GPU, unless ranks of other
    nodes on this same machine would share it (``settle_gpu``); gloo: CPU.
    """
    import torch.distributed as dist

    from ddp_lab.i18n import _t
    from ddp_lab.runtime import device as rule

    backend = dist.get_backend()
    wanted = rule.this_rank_device(backend, use_gpu=rule.uses_nccl(backend))
    device = rule.settle_gpu(wanted, backend)
    if wanted != device and rank == 0 and not quiet:
        print(
            _t(
                "some ranks of this job would share a GPU (several nodes on one machine): "
                "every rank computes on CPU, through gloo"
            ),
            flush=True,
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


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


ONE_BYTE_MB = 1 / 2**20  # a bucket limit of one byte, in MiB (exact: a power of two)


def fixed_buckets() -> dict[str, Any]:
    """DDP arguments under which its bucket layout is the same at every step.

    Why: a resumed run must all-reduce every gradient the way the uninterrupted run did, or
    on 3 ranks or more its parameters differ in the last bit. DDP's first step puts every
    parameter into one bucket (``compute_bucket_size_limits`` in
    ``torch/nn/parallel/distributed.py``: ``[sys.maxsize]``) and rebuilds the buckets after it
    in the order the gradients arrived (``Reducer::should_rebuild_buckets``,
    ``torch/csrc/distributed/c10d/reducer.hpp``); a resumed process starts with a new DDP, so
    its first step uses the first layout where the uninterrupted run used the rebuilt one,
    and a ring all-reduce adds an element's values in an order set by its place in the bucket.

    ``bucket_cap_mb_list=[ONE_BYTE_MB]``: given a list, DDP uses the same limits for the
    first layout and for the rebuild (torch 2.13: ``compute_bucket_size_limits``, "Case 1";
    torch 2.11: ``bucket_bytes_cap_list`` in ``_ddp_init_helper``), and a limit of one byte
    closes each bucket after one parameter. Not 0: torch 2.11 takes the list's largest value
    as ``bucket_cap_mb`` and raises "bucket_cap_mb should be set by now" when it is 0
    (``DistributedDataParallel.__init__``; torch 2.13 accepts 0). Every gradient is then
    all-reduced alone in both layouts; the rebuild only changes which bucket goes first.
    Cost: one all-reduce per parameter tensor (6 for ``SmallCNN``) instead of one for the
    whole model.
    A torch whose DDP lacks ``bucket_cap_mb_list``: ``find_unused_parameters=True``, with
    which DDP never rebuilds (``should_rebuild_buckets`` is false), at the cost of a walk over
    the autograd graph and an all-reduce of the used-parameter map per step. torch then
    prints once on stderr that it found no unused parameter, which is true and expected
    here. Python's ``warnings`` cannot hide it: it is ``TORCH_WARN_ONCE`` in ``reducer.cpp``,
    written by the C++ warning handler (seen with torch 2.11 and 2.13).
    """
    if "bucket_cap_mb_list" in inspect.signature(DDP).parameters:
        return {"bucket_cap_mb_list": [ONE_BYTE_MB]}
    return {"find_unused_parameters": True}
