"""The training program's process: how it starts and how it ends, around the training.

Deterministic GPU libraries (set before CUDA starts), a one-rank launcher environment on a
free port when it runs without a launcher, and an exit that skips Python's finalization
(which could abort a finished worker). ``tools/train.py`` re-exports these names.
"""

from __future__ import annotations

import os
import sys

import torch


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
