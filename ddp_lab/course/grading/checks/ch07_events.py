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


# The probe runs in the learner's process after their code; ``guard.seal`` freezes the code
# and defaults of ddp_lab's functions there, not module attributes (review 10 wrapped
# ``ch07._watching`` from the learner's ``__init__`` and forged all-reduce events). So what
# these functions read while they record is bound as positional defaults (an immutable
# tuple) when this module loads, of immutable values, builtins included.
def _launched(events: list, name: str, args: tuple, _bound: tuple = (tensors_of, sum)) -> None:
    tensors_of_, sum_ = _bound
    if name == "all_reduce":  # c10d.allreduce_ and funcol's all_reduce: args[0] holds them
        events.append(["all_reduce", sum_(t.numel() for t in tensors_of_(args[0]))])
    elif name == "wait":  # funcol's wait_tensor (also when its result is first used)
        events.append(["wait", 0])


# Every way to block on a collective from Python ends in one of these: dist.all_reduce without
# async_op waits with Work.wait inside torch, work.get_future().wait() and
# torch.futures.wait_all with Future.wait.
_WAITS = (
    (torch._C._distributed_c10d.Work, "wait"),
    (torch._C._distributed_c10d.Work, "synchronize"),
    (torch._C.Future, "wait"),
)
# Asking whether it is done blocks nothing; asking again and again until it is (a loop of
# ``while not work.is_completed(): pass``) is a wait written by hand.
_POLLS = (
    (torch._C._distributed_c10d.Work, "is_completed"),
    (torch._C.Future, "done"),
)


@contextlib.contextmanager
def _watching(
    events: list,
    _bound: tuple = (watch_c10d, _launched, _WAITS, _POLLS),
    _builtins: tuple = (getattr, setattr, id, len),
) -> Iterator[None]:
    """While inside: each all-reduce started and each wait on a Work or a Future, in
    ``events``. (The last parameters: bound at import, see ``_launched``.)"""
    (watch, launched, waits, polls_), (getattr_, setattr_, id_, len_) = _bound, _builtins
    saved = [(cls, name, getattr_(cls, name)) for cls, name in waits]
    polls = [(cls, name, getattr_(cls, name)) for cls, name in polls_]
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
            _, at, noted = polled.get(id_(work), (None, -1, False))
            if at == len_(events):
                if not noted:
                    events.append(["wait", 0])
                polled[id_(work)] = (work, len_(events), True)
            else:
                polled[id_(work)] = (work, len_(events), False)
            return real(work, *args, **kwargs)

        return poll

    try:
        for cls, name, real in saved:
            setattr_(cls, name, noting(real))
        for cls, name, real in polls:
            setattr_(cls, name, polling(real))
        # each all-reduce as it starts, whatever Python name reached it (comm_debug.watch_c10d)
        with watch(lambda name, args: launched(events, name, args)):
            yield
    finally:
        for cls, name, real in saved + polls:
            setattr_(cls, name, real)
