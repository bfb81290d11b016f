"""Supervising a launch's ranks to the end: output, failures, timeouts and deadlocks.

``_supervise`` follows the zygote's messages while the ranks run: it streams their output
(``_Output``, ``[rank N]`` prefixes, rank order), stops every rank when one fails, at the
timeout or at a deadlock (``_hang.DeadlockWatch``), reads each hung rank's stack and
``torch.distributed`` call, and ``_collect`` turns the ranks' records into results or one
``DistributedError``. ``runtime/launcher.py`` re-exports these names.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import cloudpickle

from ddp_lab.i18n import _t
from ddp_lab.runtime import _calls, _hang
from ddp_lab.runtime._failures import (
    DistributedDeadlockError,
    DistributedError,
    DistributedTimeoutError,
    RankFailure,
    _describe_status,
    deadlock_summary,
    failure_from_error,
)
from ddp_lab.runtime._hang import RanksInterrupted
from ddp_lab.runtime._shipping import _Zygote

_GRACE_S = 1.0  # between SIGTERM and SIGKILL


class _Output:
    """Reads the ranks' capture files and prints them with ``[rank N]`` prefixes."""

    def __init__(self, workdir: str, nprocs: int, quiet: bool = False) -> None:
        self.workdir, self.nprocs, self.quiet = workdir, nprocs, quiet
        self.offsets = {(r, s): 0 for r in range(nprocs) for s in ("out", "err")}
        self.partial = {key: "" for key in self.offsets}

    def _read_new(self, rank: int, stream: str) -> str:
        path = os.path.join(self.workdir, f"{rank}.{stream}")
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[rank, stream])
                data = f.read()
        except FileNotFoundError:
            return ""
        self.offsets[rank, stream] += len(data)
        return data.decode("utf-8", errors="backslashreplace")

    def _emit(self, rank: int, stream: str, final: bool) -> None:
        text = self.partial[rank, stream] + self._read_new(rank, stream)
        lines = text.split("\n")
        self.partial[rank, stream] = "" if final else lines.pop()
        if final and lines and lines[-1] == "":
            lines.pop()
        out = sys.stdout if stream == "out" else sys.stderr
        if lines and not self.quiet:
            out.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            out.flush()

    def stream_new(self) -> None:
        for r in range(self.nprocs):
            for s in ("out", "err"):
                self._emit(r, s, final=False)

    def finish(self) -> None:
        for s in ("out", "err"):
            for r in range(self.nprocs):
                self._emit(r, s, final=True)

    def text(self, rank: int) -> tuple[str, str]:
        result = []
        for s in ("out", "err"):
            try:
                with open(
                    os.path.join(self.workdir, f"{rank}.{s}"),
                    encoding="utf-8",
                    errors="backslashreplace",
                ) as f:
                    result.append(f.read())
            except FileNotFoundError:
                result.append("")
        return result[0], result[1]


def _read_result(workdir: str, rank: int) -> tuple[str, Any] | None:
    try:
        with open(os.path.join(workdir, f"{rank}.result"), "rb") as f:
            return cloudpickle.loads(f.read())
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001  # e.g. a class the parent cannot import
        return (
            "error",
            {"type": type(exc).__name__, "message": str(exc), "traceback": "", "exc": None},
        )


def _supervise(
    zygote: _Zygote,
    message: dict,
    nprocs: int,
    limit: float,
    stream: bool,
    workdir: str,
    quiet: bool,
    watch: bool = False,
) -> list[Any]:
    zygote.send(message)  # the launch request (``launcher.launch_message``)
    output = _Output(workdir, nprocs, quiet)
    statuses: dict[int, int] = {}
    exit_order: list[int] = []
    stopping: set[int] = set()  # ranks the launcher itself is stopping
    started = time.monotonic()
    kill_at: float | None = None
    timed_out = False
    stacks: dict[int, str] = {}
    calls: dict[int, str] = {}  # each hung rank's torch.distributed call, read before the stop
    reader = _hang.StackReader(workdir, zygote.send)
    watcher: _hang.DeadlockWatch | None = None
    deadlock = 0.0  # seconds every rank waited, when a deadlock stopped them
    try:
        while True:
            msg = zygote.recv(0.05 if stream or kill_at else 0.2)
            now = time.monotonic()
            if msg is not None:
                if msg["op"] == "done":
                    break
                if msg["op"] == "started" and watch:
                    watcher = _hang.DeadlockWatch(dict(msg["pids"]), reader)
                if msg["op"] == "exit":
                    rank, status = msg["rank"], msg["status"]
                    statuses[rank] = status
                    exit_order.append(rank)
                    if status != 0 and kill_at is None:
                        # One rank failed: the others would wait forever in collectives.
                        stopping = set(range(nprocs)) - set(statuses)
                        zygote.send({"op": "signal", "sig": signal.SIGTERM})
                        kill_at = now + _GRACE_S
            if stream:
                output.stream_new()
            live = [r for r in range(nprocs) if r not in statuses]
            if kill_at is None and watcher is not None and watcher.check(live, now):
                timed_out, deadlock = True, watcher.seconds
                stopping, stacks = set(live), watcher.stacks
                calls = _calls.report(workdir, sorted(stopping))
                zygote.send({"op": "signal", "sig": signal.SIGTERM})
                kill_at = time.monotonic() + _GRACE_S
            elif kill_at is None and now - started > limit:
                timed_out = True
                stopping = set(range(nprocs)) - set(statuses)
                stacks = reader.request(sorted(stopping))
                calls = _calls.report(workdir, sorted(stopping))
                zygote.send({"op": "signal", "sig": signal.SIGTERM})
                kill_at = time.monotonic() + _GRACE_S
            elif kill_at is not None and now > kill_at:
                zygote.send({"op": "signal", "sig": signal.SIGKILL})
                kill_at = float("inf")
    except KeyboardInterrupt:
        _stop_all(zygote)
        output.finish()
        raise RanksInterrupted() from None
    output.finish()
    return _collect(
        workdir,
        nprocs,
        statuses,
        exit_order,
        stopping,
        timed_out,
        limit,
        stacks,
        output,
        deadlock,
        calls,
    )


def _stop_all(zygote: _Zygote) -> None:
    """SIGTERM every rank, SIGKILL after a grace period, and wait for the zygote's 'done'."""
    zygote.send({"op": "signal", "sig": signal.SIGTERM})
    deadline = time.monotonic() + _GRACE_S
    killed = False
    while True:
        try:
            msg = zygote.recv(0.05)
        except KeyboardInterrupt:
            msg = None
        if msg is not None and msg.get("op") == "done":
            return
        if not killed and time.monotonic() > deadline:
            zygote.send({"op": "signal", "sig": signal.SIGKILL})
            killed = True


def _dump_stacks(zygote: _Zygote, workdir: str, ranks: set[int]) -> dict[int, str]:
    """Ask hung ranks for their Python stacks (faulthandler on SIGUSR1) and read them."""
    return _hang.StackReader(workdir, zygote.send).request(sorted(ranks))


def _collect(
    workdir: str,
    nprocs: int,
    statuses: dict[int, int],
    exit_order: list[int],
    stopping: set[int],
    timed_out: bool,
    limit: float,
    stacks: dict[int, str],
    output: _Output,
    deadlock: float = 0.0,
    calls: dict[int, str] | None = None,
) -> list[Any]:
    results: list[Any] = [None] * nprocs
    failures: list[RankFailure] = []
    for rank in exit_order:
        record = _read_result(workdir, rank)
        if record is not None and record[0] == "ok" and statuses[rank] == 0:
            results[rank] = record[1]
        elif record is not None and record[0] == "error":
            failures.append(failure_from_error(rank, record[1]))
        elif rank not in stopping or timed_out:
            if not (timed_out and rank in stopping):
                failures.append(RankFailure(rank, _describe_status(rank, statuses[rank])))
    outputs = {r: output.text(r) for r in range(nprocs)}
    if timed_out:
        # The stacks go in the exception only: IPython shows it once, readably.
        ranks = sorted(stopping)
        hung = [
            RankFailure(
                r,
                _t("where rank {rank} was stuck (Python stack)", rank=r),
                stack=stacks.get(r, ""),
                call=(calls or {}).get(r, ""),
            )
            for r in ranks
        ]
        names = ", ".join(map(str, ranks))
        error = DistributedDeadlockError if deadlock else DistributedTimeoutError
        summary = (
            deadlock_summary(deadlock, ranks)
            if deadlock
            else _t(
                "Timed out after {timeout:g} s: ranks {ranks} were still running and "
                "were stopped. A hang usually means the ranks called different "
                "collectives, or one rank skipped one. Pass timeout=... (or %%ddp "
                "--timeout S) if the work is just slow.",
                timeout=limit,
                ranks=names,
            )
        )
        raise error(summary, [f for f in failures if f.rank not in stopping] + hung, outputs)
    if failures:
        own = [f for f in failures if f.rank not in stopping] or failures
        summary = _t(
            "{count} of {nprocs} ranks failed; the first to fail was rank {first}.",
            count=len(own),
            nprocs=nprocs,
            first=own[0].rank,
        )
        stopped = sorted(stopping - {f.rank for f in own})
        if stopped:
            summary += "\n" + _t(
                "ranks stopped by the launcher after the failure: {ranks}",
                ranks=", ".join(map(str, stopped)),
            )
        raise DistributedError(summary, own, outputs)
    return results
