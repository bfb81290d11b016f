"""Count the collectives this process hands to ``torch.distributed`` (no exercise's answer here).

``count_collectives`` wraps ``torch.distributed``'s collective functions in this process for
the duration of a ``with`` block and logs each call's name, dtype and payload bytes. Chapter 10
counts what DDP's comm hooks send with it (``ddp_lab.comm_hooks`` re-exports it), and the
graders of chapter 10 watch the learner's hook and ``reduce_grad`` with it inside each rank.

How this differs from PyTorch: torch's ``CommDebugMode``
(``torch/distributed/tensor/debug/_comm_mode.py``) counts the functional collectives that
DTensor dispatches, through ``TorchDispatchMode``; this counts calls of the eager
``torch.distributed`` functions (``all_reduce``, ``broadcast``...) by replacing them in the
module, which is what comm hooks and the course's exercises call. What is counted is the
payload handed to each collective (``numel * element_size``), not the bytes on the wire: a
ring all-reduce moves about ``2 (N-1)/N`` times its payload per rank (chapter 05).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

COUNTED = ("all_reduce", "all_gather", "all_gather_single", "reduce_scatter_single", "broadcast")


@dataclass
class CollectiveLog:
    """What went through ``torch.distributed`` collectives: (name, dtype, bytes) per call."""

    calls: list[tuple[str, torch.dtype, int]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(b for _, _, b in self.calls)

    def dtypes(self) -> set[torch.dtype]:
        return {d for _, d, _ in self.calls}


@contextmanager
def count_collectives(names: tuple[str, ...] = COUNTED) -> Iterator[CollectiveLog]:
    """Wrap ``torch.distributed``'s collectives in this process and log every call."""
    log = CollectiveLog()
    originals = {n: getattr(dist, n) for n in names if hasattr(dist, n)}

    def wrap(name: str, real: Callable) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            t = args[0] if name in ("all_reduce", "broadcast") else args[1]
            tensors = t if isinstance(t, (list, tuple)) else [t]
            for x in tensors:
                log.calls.append((name, x.dtype, x.numel() * x.element_size()))
            return real(*args, **kwargs)

        return counted

    for n, real in originals.items():
        setattr(dist, n, wrap(n, real))
    try:
        yield log
    finally:
        for n, real in originals.items():
            setattr(dist, n, real)
