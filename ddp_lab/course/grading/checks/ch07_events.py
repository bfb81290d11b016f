"""07.bucketed's record of the last backward: each all-reduce as it starts and each wait on a
``Work`` or ``Future`` (a loop polling one until it completes counts as one), in order (see ``ch07``, whose probe adds the gradients' readiness).

It runs in the learner's rank with the probe (``ch07.probe_bucketed``); what it records is
the rank's own account, which the checker in ``ch07`` judges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ddp_lab.comm_debug import tensors_of, watch_c10d


def _launched(events: list, name: str, args: tuple) -> None:
    if name == "all_reduce":  # c10d.allreduce_ and funcol's all_reduce: args[0] holds them
        events.append(["all_reduce", sum(t.numel() for t in tensors_of(args[0]))])
    elif name == "wait":  # funcol's wait_tensor (also when its result is first used)
        events.append(["wait", 0])


# Every way to block on a collective from Python ends in one of these: dist.all_reduce without
# async_op waits with Work.wait inside torch, work.get_future().wait() and
# torch.futures.wait_all with Future.wait.
_WAITS = [
    (torch._C._distributed_c10d.Work, "wait"),
    (torch._C._distributed_c10d.Work, "synchronize"),
    (torch._C.Future, "wait"),
]
# Asking whether it is done blocks nothing; asking again and again until it is (a loop of
# ``while not work.is_completed(): pass``) is a wait written by hand.
_POLLS = [
    (torch._C._distributed_c10d.Work, "is_completed"),
    (torch._C.Future, "done"),
]


@contextlib.contextmanager
def _watching(events: list) -> Iterator[None]:
    """While inside: each all-reduce started and each wait on a Work or a Future, in
    ``events``."""
    saved = [(cls, name, getattr(cls, name)) for cls, name in _WAITS]
    polls = [(cls, name, getattr(cls, name)) for cls, name in _POLLS]
    # Each work's last poll: after how many events (the work is kept, so its id is not reused).
    polled: dict[int, tuple[Any, int, bool]] = {}

    def noting(real: Callable) -> Callable:
        def wait(*args: Any, **kwargs: Any) -> Any:
            events.append(["wait", 0])
            return real(*args, **kwargs)

        return wait

    def polling(real: Callable) -> Callable:
        def poll(work: Any, *args: Any, **kwargs: Any) -> Any:
            # A work polled again with nothing recorded since its last poll (no gradient
            # ready, no launch): a loop that spins until it completes, noted once as a wait.
            # Per work, so that polls of other objects in between do not hide the loop. A poll
            # of each pending bucket once per hook has readiness events in between.
            _, at, noted = polled.get(id(work), (None, -1, False))
            if at == len(events):
                if not noted:
                    events.append(["wait", 0])
                polled[id(work)] = (work, len(events), True)
            else:
                polled[id(work)] = (work, len(events), False)
            return real(work, *args, **kwargs)

        return poll

    try:
        for cls, name, real in saved:
            setattr(cls, name, noting(real))
        for cls, name, real in polls:
            setattr(cls, name, polling(real))
        # each all-reduce as it starts, whatever Python name reached it (comm_debug.watch_c10d)
        with watch_c10d(lambda name, args: _launched(events, name, args)):
            yield
    finally:
        for cls, name, real in saved + polls:
            setattr(cls, name, real)
