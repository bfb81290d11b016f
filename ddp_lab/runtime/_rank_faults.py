"""A persistent group's faults: a hang, a deadlock, an interrupt, a rank that is gone.

``GroupFaults`` is the part of ``_rank_group.RankGroup`` that turns a fault during a
request into one clear error: each stuck rank's stack and ``torch.distributed`` call, then
a restart that says the group's state is lost (a timeout, a deadlock, ranks that ignore an
interrupt), or a clean one-line interrupt when every rank stopped and the group keeps its
variables. ``errors`` reads the failures among the ranks' replies. ``_rank_group``
re-exports these names.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from ddp_lab.i18n import _t
from ddp_lab.runtime import _calls, _hang, launcher
from ddp_lab.runtime._failures import deadlock_summary
from ddp_lab.runtime._rank_loop import note_interrupt
from ddp_lab.runtime.launcher import (
    DistributedDeadlockError,
    DistributedTimeoutError,
    RankFailure,
)

_AFTER_FAILURE_S = 5.0  # once a rank failed, how long the others may still run
_INTERRUPT_GRACE_S = 3.0  # how long ranks get to stop after SIGINT


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """An interrupt (SIGINT) inside the block is raised at its end, not in the middle.

    Why: the notebook writes a request to each rank in turn. An interrupt between two writes
    left the later ranks without the request, yet waited for (and signalled): they never
    answered, "did not stop", and the group was restarted with its state lost. Only in the
    main thread, where Python runs signal handlers (elsewhere the block runs as it is)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is None  # a handler not set from Python: kept
    ):
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came and callable(previous):
        previous(signal.SIGINT, None)  # the kernel's handler: KeyboardInterrupt, as it would


class _Lost(Exception):
    """Some rank processes ended: ``failures`` says how."""

    def __init__(self, failures: list[RankFailure]) -> None:
        super().__init__()
        self.failures = failures


class GroupFaults:
    """``RankGroup``'s fault handling (a mixin: it uses the group's processes, output,
    ``_wait`` and ``_restart``)."""

    zygote: Any
    workdir: str
    output: Any
    nprocs: int

    def _hang(
        self, pending: set[int], replies: dict, limit: float, failed_at: float | None
    ) -> None:
        stuck = sorted(pending)
        stacks = launcher._dump_stacks(self.zygote, self.workdir, set(stuck))
        calls = _calls.report(self.workdir, stuck)
        self.output.finish()  # the stacks go in the exception only: shown once
        failures = errors(replies) + [
            RankFailure(
                r,
                _t("where rank {rank} was stuck (Python stack)", rank=r),
                stack=stacks.get(r, ""),
                call=calls[r],
            )
            for r in stuck
        ]
        ranks = ", ".join(map(str, stuck))
        if failed_at is not None:
            first = errors(replies)[0].rank
            summary = _t(
                "Ranks {ranks} were still running {grace:g} s after rank {first} failed: "
                "they are probably waiting in a collective that rank {first} never "
                "reached.",
                ranks=ranks,
                first=first,
                grace=_AFTER_FAILURE_S,
            )
        else:
            summary = _t(
                "Timed out after {timeout:g} s: ranks {ranks} were still running this "
                "cell. A hang usually means the ranks called different collectives, or "
                "one rank skipped one. Use %%ranks --timeout S if the work is just slow.",
                ranks=ranks,
                timeout=limit,
            )
        self._restart_and_raise(DistributedTimeoutError, summary, failures)

    def _deadlock(self, pending: set[int], replies: dict, watcher: _hang.DeadlockWatch) -> None:
        """Every rank of the request deadlocked: their stacks, a restart, one clear error."""
        stuck = sorted(pending)
        calls = _calls.report(self.workdir, stuck)
        self.output.finish()  # the stacks go in the exception only: shown once
        failures = errors(replies) + [
            RankFailure(
                r,
                _t("where rank {rank} was stuck (Python stack)", rank=r),
                stack=watcher.stacks.get(r, ""),
                call=calls[r],
            )
            for r in stuck
        ]
        # The same words as dl.spawn's deadlock, then what happened to the group.
        summary = deadlock_summary(watcher.seconds, stuck)
        self._restart_and_raise(DistributedDeadlockError, summary, failures)

    def _restart_and_raise(
        self, error: type[DistributedTimeoutError], summary: str, failures: list
    ) -> NoReturn:
        """Restart the group, then raise ``error`` saying that its state is lost."""
        self._restart()
        summary += "\n" + _t(
            "The group was restarted and ITS STATE IS LOST: {nprocs} new rank "
            "processes hold none of the variables made so far. Run the cells that "
            "create them again.",
            nprocs=self.nprocs,
        )
        raise error(summary, failures)

    def _interrupt(self, pending: set[int], replies: dict) -> None:
        interrupted = sorted(pending)
        # Which request: a rank that has not yet read it, when the signal comes, stops it as
        # soon as it does (_rank_loop.arm), and one that already answered it ignores the signal.
        deadline = time.monotonic() + _INTERRUPT_GRACE_S
        try:
            # Noted and signalled whole: a second interrupt in between would leave the ranks
            # running the cell unsignalled; it is raised after, and ends the wait below.
            with sigint_deferred():
                note_interrupt(self.workdir, self.seq)
                self.zygote.send({"op": "signal", "sig": signal.SIGINT, "ranks": interrupted})
            while pending and time.monotonic() < deadline:
                self._wait(pending, replies, 0.05)
        except (KeyboardInterrupt, _Lost):
            pass  # a second interrupt, or a rank died: restart without waiting
        self.output.finish()
        ranks = ", ".join(map(str, interrupted))
        # The outcome is the exception's one clean line (no traceback through the runtime,
        # as for dl.spawn); DDP_LAB_TRACEBACK=1 shows the details.
        if not pending:
            raise _hang.RanksInterrupted(
                _t(
                    "Interrupted: the cell was stopped on ranks {ranks}. The group is still "
                    "running and keeps its variables.",
                    ranks=ranks,
                )
            ) from None
        stuck = sorted(pending)
        launcher.print_stacks(stuck, launcher._dump_stacks(self.zygote, self.workdir, set(stuck)))
        self._restart()
        stuck_text = ", ".join(map(str, stuck))
        raise _hang.RanksInterrupted(
            _t(
                "Interrupted, but ranks {ranks} did not stop within {grace:g} s (a rank "
                "waiting inside a collective cannot be interrupted).",
                ranks=stuck_text,
                grace=_INTERRUPT_GRACE_S,
            )
            + "\n"
            + _t(
                "The group was restarted and ITS STATE IS LOST: {nprocs} new rank "
                "processes hold none of the variables made so far. Run the cells that "
                "create them again.",
                nprocs=self.nprocs,
            )
        ) from None


def errors(replies: dict[int, dict]) -> list[RankFailure]:
    """The failures among ``replies``, in rank order, with tracebacks and exceptions."""
    return [
        launcher.failure_from_error(r, replies[r]["error"])
        for r in sorted(replies)
        if replies[r]["status"] == "error"
    ]
