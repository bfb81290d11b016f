"""07.bucketed's record of the last backward: each all-reduce as it starts and each wait on a
``Work`` or ``Future``, in order (see ``ch07``, whose probe adds the gradients' readiness).

It runs in the learner's rank with the probe (``ch07.probe_bucketed``); what it records is
the rank's own account, which the checker in ``ch07`` judges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Launches(TorchDispatchMode):
    """Notes each all-reduce as it starts: the dispatcher sees ``c10d.allreduce_`` whatever
    Python name reached it (``dist.all_reduce``, a name imported from ``torch.distributed``
    before the probe ran, the process group's own method), where a patched ``dist.all_reduce``
    saw only the first."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.c10d.allreduce_.default:
            tensors = args[0] if args else kwargs.get("tensors", [])
            self.events.append(["all_reduce", sum(t.numel() for t in tensors)])
        return func(*args, **(kwargs or {}))


# Every way to block on a collective from Python ends in one of these: dist.all_reduce without
# async_op waits with Work.wait inside torch, work.get_future().wait() and
# torch.futures.wait_all with Future.wait.
_WAITS = [
    (torch._C._distributed_c10d.Work, "wait"),
    (torch._C._distributed_c10d.Work, "synchronize"),
    (torch._C.Future, "wait"),
]


@contextlib.contextmanager
def _watching(events: list) -> Iterator[None]:
    """While inside: each all-reduce started and each wait on a Work or a Future, in
    ``events``."""
    saved = [(cls, name, getattr(cls, name)) for cls, name in _WAITS]

    def noting(real: Callable) -> Callable:
        def wait(*args: Any, **kwargs: Any) -> Any:
            events.append(["wait", 0])
            return real(*args, **kwargs)

        return wait

    try:
        for cls, name, real in saved:
            setattr(cls, name, noting(real))
        with _Launches(events):
            yield
    finally:
        for cls, name, real in saved:
            setattr(cls, name, real)
