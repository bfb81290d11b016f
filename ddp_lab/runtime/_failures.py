"""Why a launch failed: one record per failed rank and the errors ``dl.spawn`` raises.

``RankFailure`` (an exception, an exit code, a signal or a timeout) and the
``DistributedError`` family (``DistributedTimeoutError``, ``DistributedDeadlockError``),
which IPython shows readably: the summary, each rank's traceback and, for a hang, where each
rank was stuck. ``runtime/launcher.py`` re-exports them.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

import cloudpickle

from ddp_lab.i18n import _t, _tp
from ddp_lab.runtime import _hang
from ddp_lab.runtime._hang import format_stack


@dataclass
class RankFailure:
    """Why one rank failed: an exception, an exit code, a signal or a timeout."""

    rank: int
    reason: str
    traceback: str = ""
    exception: BaseException | None = None
    stack: str = ""
    call: str = ""  # a hung rank's torch.distributed call (``_calls.describe``)


class DistributedError(RuntimeError):
    """One or more ranks failed; ``failures`` lists them, the first to fail first."""

    def __init__(
        self,
        summary: str,
        failures: list[RankFailure] | None = None,
        outputs: dict[int, tuple[str, str]] | None = None,
        cells: dict[str, int | None] | None = None,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.failures = failures or []
        self.outputs = outputs or {}
        self.cells = cells if cells is not None else _hang.cell_numbers()

    def __str__(self) -> str:
        parts = [self.summary]
        for f in self.failures:
            if f.call:
                parts.append(f"  - {f.call}")
            elif not f.stack:  # a stack's header says the same
                parts.append(f"  - {f.reason}")
        for f in self.failures:
            if f.traceback:
                parts.append(
                    "\n--- "
                    + _t("traceback of rank {rank}", rank=f.rank)
                    + f" ---\n{f.traceback.rstrip()}"
                )
            if f.stack:
                stack = format_stack(f.stack, self.cells).rstrip()
                parts.append(
                    "\n--- "
                    + _t("where rank {rank} was stuck (Python stack)", rank=f.rank)
                    + f" ---\n{stack}"
                )
        return "\n".join(parts)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own (unhelpful) frames.
        return [f"{type(self).__name__}: {self}"]

    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.failures]


class DistributedTimeoutError(DistributedError, TimeoutError):
    """The launch ran past its timeout; ``failures`` hold each running rank's stack."""


class DistributedDeadlockError(DistributedTimeoutError):
    """Every running rank waited in communication at the same place, moving no data and using
    almost no CPU, for a few seconds (``_hang.DeadlockWatch``): stopped before the timeout, with each rank's stack."""


def _describe_status(rank: int, status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return _t("rank {rank} was killed by signal {signal}", rank=rank, signal=name)
    return _t(
        "rank {rank} exited with code {code} without raising an exception (os._exit or sys.exit?)",
        rank=rank,
        code=os.WEXITSTATUS(status),
    )


def failure_from_error(rank: int, info: dict) -> RankFailure:
    """A rank's error record (type, message, traceback, pickled exception) -> RankFailure."""
    exc = None
    if info.get("exc"):
        try:
            exc = cloudpickle.loads(info["exc"])
        except Exception:  # noqa: BLE001  # e.g. a class only the ranks know
            exc = None
    error = f"{info['type']}: {info['message']}" if info["message"] else info["type"]
    return RankFailure(
        rank,
        _tp("rank_raised", "rank {rank} raised {error}", rank=rank, error=error),
        info["traceback"],
        exc,
    )


def print_stacks(ranks: list[int], stacks: dict[int, str]) -> None:
    """Print where each stuck rank is, under a header per rank (ranks without a stack skipped)."""
    cells = _hang.cell_numbers()
    for r in ranks:
        if stacks.get(r):
            sys.stderr.write(
                "--- "
                + _t("where rank {rank} was stuck (Python stack)", rank=r)
                + f" ---\n{format_stack(stacks[r], cells)}"
            )


def deadlock_summary(seconds: float, ranks: list[int]) -> str:
    """The first line of a deadlock's error, the same for ``dl.spawn`` and a persistent group."""
    return _t(
        "Deadlock: for {seconds:.0f} s every running rank ({ranks}) has been "
        "waiting in communication at the same place, moving no data and using "
        "almost no CPU; they were "
        "stopped. Usually the ranks wait for each other (e.g. every rank in a "
        "blocking recv, or in send with no receiver yet) or call different "
        "collectives. Where each rank waited:",
        seconds=seconds,
        ranks=", ".join(map(str, ranks)),
    )
