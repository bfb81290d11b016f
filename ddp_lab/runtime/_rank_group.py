"""The notebook's side of a group of persistent ranks: processes, requests, faults.

``ddp_lab.runtime.persistent`` is the public face (``dl.start``, ``%%ranks``, ``dl.pull``...);
this module keeps the processes. The ranks are forked by a zygote of their own (the
launcher's zygote stays free for ``dl.spawn``) and run ``ddp_lab.runtime._rank_loop``; each
connects back over a Unix socket in the launch's private directory. Output capture, stack
dumps, errors and messages are the launcher's.

Faults: an exception on some ranks is reported with each rank's traceback and the group
stays. A timeout, a deadlock, a rank that dies, or ranks that ignore an interrupt (one
waiting inside a collective cannot be interrupted) restart the group: every variable on the
ranks is lost. A deadlock (every rank of the cell waiting in communication at the same place,
moving no data, using almost no CPU) is found after a few seconds, as for ``dl.spawn`` (``_hang.DeadlockWatch``),
unless a timeout was given.

The fault handling (hang, deadlock, interrupt) is ``_rank_faults.GroupFaults``, a base of
``RankGroup``.
"""

from __future__ import annotations

import os
import select
import socket
import time
from typing import Any

from ddp_lab.i18n import _t
from ddp_lab.runtime import _hang, _pickle, _workdirs, launcher
from ddp_lab.runtime._rank_faults import (
    _AFTER_FAILURE_S,
    _INTERRUPT_GRACE_S,
    GroupFaults,
    _Lost,
    errors,
    sigint_deferred,
)
from ddp_lab.runtime._rank_loop import LoopJob
from ddp_lab.runtime._zygote import read_msg, write_msg
from ddp_lab.runtime.launcher import (
    DistributedError,
    DistributedTimeoutError,
    RankFailure,
)

__all__ = [
    "RANK_NAMES",
    "GroupFaults",
    "RankGroup",
    "alive",
    "errors",
    "_AFTER_FAILURE_S",
    "_INTERRUPT_GRACE_S",
    "_Lost",
]

_START_TIMEOUT_S = 120.0
RANK_NAMES = {"rank", "world_size", "device", "torch", "dist"}


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return False
    return pid is not None and text[text.rindex(")") + 2] != "Z"


class RankGroup(GroupFaults):
    """The notebook's handle on one group of persistent ranks."""

    def __init__(self, nprocs: int, backend: str, timeout: float, watch: bool = True) -> None:
        """``watch``: report a deadlock early when a request uses the group's timeout."""
        self.nprocs, self.backend, self.timeout, self.watch = nprocs, backend, timeout, watch
        self.zygote: launcher._Zygote | None = None
        self.started = time.monotonic()
        self.cells = 0
        self.seq = 0  # requests sent; an interrupt names the one it stops (_rank_loop.arm)
        self._launch()

    # -- processes -------------------------------------------------------------------
    def _launch(self) -> None:
        if self.zygote is not None and not self.zygote.alive():
            self.zygote.close()
            self.zygote = None
        if self.zygote is None:
            # Preloaded before "ready": the group's one launch comes at once and lasts.
            self.zygote = launcher._Zygote(eager=True)
        self.zygote.wait_ready()
        self.conns: dict[int, socket.socket] = {}
        self.pids: dict[int, int] = {}
        self.devices: dict[int, str] = {}
        self.running: dict[int, str | None] = dict.fromkeys(range(self.nprocs))
        self.last: dict[int, str] = {}
        self.defined: dict[int, set[str]] = {r: set(RANK_NAMES) for r in range(self.nprocs)}
        self.sent_lines: set[str] = set()
        self.done = False
        self.workdir = _workdirs.make("ranks_")  # removed by the next launch if we are killed
        self.output = launcher._Output(self.workdir, self.nprocs)
        self.stacks = _hang.StackReader(self.workdir, self.zygote.send)
        path = os.path.join(self.workdir, "ctl")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(self.nprocs)
            self.port: int | None = None  # the zygote's "started" message says which
            payload = _pickle.dumps(LoopJob(path, self.nprocs, self.backend))
            self.zygote.send(launcher.launch_message(payload, self.nprocs, self.workdir))
            self._accept(listener)
        except BaseException:
            self._kill()
            if self.zygote is not None:  # a group that cannot start leaves nothing either
                self.zygote.close()
                self.zygote = None
            raise
        finally:
            listener.close()
        self.output.finish()  # warnings printed while the group started

    def _accept(self, listener: socket.socket) -> None:
        """Wait until every rank has connected back and joined the process group."""
        socks: dict[int, socket.socket] = {}
        deadline = time.monotonic() + _START_TIMEOUT_S
        while len(self.devices) < self.nprocs:
            fds = [listener.fileno(), self.zygote.out_fd, *socks]
            ready, _, _ = select.select(fds, [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise DistributedTimeoutError(
                    _t(
                        "The persistent ranks did not all start within {timeout:g} s.",
                        timeout=_START_TIMEOUT_S,
                    )
                )
            for fd in ready:
                if fd == listener.fileno():
                    conn, _ = listener.accept()
                    socks[conn.fileno()] = conn
                elif fd == self.zygote.out_fd:
                    lost = self._poll_zygote()
                    if lost:
                        raise DistributedError(_t("The persistent ranks could not start:"), lost)
                else:
                    msg = read_msg(fd)
                    if msg is None:
                        socks.pop(fd).close()  # its exit status follows from the zygote
                        continue
                    rank = msg["rank"]
                    self.conns[rank] = socks[fd]
                    if msg["op"] == "hello":
                        self.pids[rank] = msg["pid"]
                    else:
                        self.devices[rank] = msg["device"]

    def _poll_zygote(self) -> list[RankFailure]:
        """Read the zygote's pending messages; return how the ranks that exited ended."""
        lost = []
        while True:
            try:
                msg = self.zygote.recv(0)
            except RuntimeError:  # the zygote died, and its ranks with it
                self.done = True
                return lost + [
                    RankFailure(
                        r,
                        _t(
                            "The launcher's helper process died unexpectedly; it will be restarted "
                            "on the next call."
                        ),
                    )
                    for r in range(self.nprocs)
                ]
            if msg is None:
                return lost
            if msg["op"] == "done":
                self.done = True
            elif msg["op"] == "started":
                self.port = msg.get("port")
            elif msg["op"] == "exit":
                rank, status = msg["rank"], msg["status"]
                record = launcher._read_result(self.workdir, rank)
                if record is not None and record[0] == "error":
                    lost.append(launcher.failure_from_error(rank, record[1]))
                else:
                    lost.append(RankFailure(rank, launcher._describe_status(rank, status)))

    def _kill(self) -> None:
        """End every rank at once (SIGTERM, then SIGKILL) and remove the launch's files."""
        try:
            if self.zygote is not None and self.zygote.alive() and not self.done:
                launcher._stop_all(self.zygote)
        except RuntimeError:  # the zygote itself died
            self.zygote.close()
            self.zygote = None
        for conn in self.conns.values():
            conn.close()
        self.conns = {}
        _workdirs.remove(self.workdir)

    def _restart(self) -> None:
        self._kill()
        self._launch()

    def stop(self) -> None:
        """Let every rank leave the process group and exit, then end the zygote."""
        for conn in self.conns.values():
            try:
                write_msg(conn.fileno(), {"op": "exit"})
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        try:
            while not self.done and time.monotonic() < deadline and self.zygote is not None:
                if select.select([self.zygote.out_fd], [], [], 0.1)[0]:
                    self._poll_zygote()
        except RuntimeError:
            pass
        self._kill()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    # -- requests --------------------------------------------------------------------
    def check_ranks(self, ranks: Any) -> list[int]:
        """``None`` (every rank), one rank, or a list of ranks -> a sorted list."""
        if ranks is None:
            return list(range(self.nprocs))
        items = [ranks] if isinstance(ranks, int) else list(ranks)
        if not items or any(
            isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.nprocs for r in items
        ):
            raise ValueError(
                _t(
                    "ranks must be rank numbers from 0 to {last} (e.g. [0, 1]), got {value!r}.",
                    value=ranks,
                    last=self.nprocs - 1,
                )
            )
        return sorted(set(items))

    def _wait(self, pending: set[int], replies: dict[int, dict], timeout: float) -> None:
        """Move the replies that arrive within ``timeout`` from ``pending`` to ``replies``."""
        fds = {self.conns[r].fileno(): r for r in pending}
        ready, _, _ = select.select([self.zygote.out_fd, *fds], [], [], max(0.0, timeout))
        lost = self._poll_zygote() if self.zygote.out_fd in ready else []
        for fd in ready:
            if fd in fds:
                msg = read_msg(fd)
                if msg is None:  # the rank died; wait for its exit status
                    deadline = time.monotonic() + 2.0
                    while not lost and time.monotonic() < deadline:
                        select.select([self.zygote.out_fd], [], [], 0.1)
                        lost = self._poll_zygote()
                    lost = lost or [
                        RankFailure(fds[fd], _t("rank {rank} closed its connection", rank=fds[fd]))
                    ]
                    continue
                if msg.get("seq") != self.seq:  # an earlier request's, left unread: not ours
                    continue
                replies[fds[fd]] = msg
                pending.discard(fds[fd])
                self.running[fds[fd]] = None
        if lost:
            raise _Lost(lost)

    def request(
        self,
        ranks: list[int],
        msg: dict,
        what: str,
        timeout: float | None = -1,
        stream: bool = False,
    ) -> dict[int, dict]:
        """Send ``msg`` to ``ranks`` and return their replies; handle every fault on the way."""
        limit = self.timeout if timeout == -1 else launcher._check_timeout(timeout)
        self.seq += 1
        msg = {**msg, "seq": self.seq}
        # Only the ranks that have the request are waited for (and interrupted): an interrupt
        # waits until every rank has it, and one before any has it is a plain interrupt.
        pending: set[int] = set()
        replies: dict[int, dict] = {}
        watcher = None
        if self.watch and timeout == -1:  # as dl.spawn: an explicit timeout means no watch
            watcher = _hang.DeadlockWatch({r: self.pids[r] for r in ranks}, self.stacks)
        try:
            lost = self._poll_zygote()
            if lost:
                raise _Lost(lost)
            with sigint_deferred():
                for r in ranks:
                    self.running[r] = what
                    try:
                        write_msg(self.conns[r].fileno(), msg)
                    except OSError:
                        raise _Lost(
                            [RankFailure(r, _t("rank {rank} closed its connection", rank=r))]
                        ) from None
                    pending.add(r)
            deadline = time.monotonic() + limit
            failed_at = None
            while pending:
                now = time.monotonic()
                if now >= deadline:
                    self._hang(pending, replies, limit, failed_at)
                if failed_at is None and watcher is not None:
                    if watcher.check(sorted(pending), now):
                        self._deadlock(pending, replies, watcher)
                    step = 0.05 if stream else 0.25  # the watch samples /proc every 0.25 s
                else:
                    step = 0.05 if stream else 1.0
                self._wait(pending, replies, min(deadline - now, step))
                if stream:
                    self.output.stream_new()
                if failed_at is None and any(m["status"] == "error" for m in replies.values()):
                    failed_at = time.monotonic()
                    deadline = min(deadline, failed_at + _AFTER_FAILURE_S)
        except KeyboardInterrupt:
            if not pending and not replies:
                raise  # no rank had the request yet: nothing ran
            self._interrupt(pending, replies)
        except _Lost as lost:
            self.output.finish()
            self._restart()
            summary = (
                _t(
                    "The group was restarted and ITS STATE IS LOST: {nprocs} new rank "
                    "processes hold none of the variables made so far. Run the cells that "
                    "create them again.",
                    nprocs=self.nprocs,
                )
                + "\n"
                + _t("A rank process ended while the group was running:")
            )
            raise DistributedError(summary, lost.failures) from None
        self.output.finish()
        for r, reply in replies.items():
            self.defined[r] = set(reply.get("names", ()))
            self.last[r] = what + (" (!)" if reply["status"] == "error" else "")
        return replies

    def new_lines(self) -> dict:
        """Notebook cell sources not yet sent to the ranks (for their tracebacks)."""
        lines = {
            k: v for k, v in launcher._notebook_linecache().items() if k not in self.sent_lines
        }
        self.sent_lines.update(lines)
        return lines

    def rows(self) -> list[tuple]:
        """(rank, pid, alive, device, running now, last request) for every rank."""
        return [
            (
                r,
                self.pids.get(r),
                alive(self.pids.get(r)),
                self.devices.get(r, "?"),
                self.running.get(r),
                self.last.get(r),
            )
            for r in range(self.nprocs)
        ]
