"""Hangs and interrupts of a launch: where each rank waits, said readably, and found early.

- ``StackReader`` asks ranks for their Python stacks (``faulthandler`` on SIGUSR1, registered
  by ``_rank``) and reads what each rank wrote since the last request.
- ``format_stack`` turns one such dump into a few lines: the rank's main thread only, the
  learner's frames first (``Cell In[7], line 4, in ring`` with the source line), the
  runtime's, torch's and the standard library's frames folded into one line.
- ``DeadlockWatch`` finds a deadlock before the timeout: for a few seconds no live rank has
  read or written a byte and each has used almost no CPU (read from ``/proc``, no signal),
  and then two stack samples taken apart show each rank at the same place, inside a
  communication call (a frame of ``torch/distributed``, or a line that calls ``.wait()``,
  ``dist.…``, ``send`` or ``recv``). A slow but working program fails one of these: a
  computing rank uses CPU, a sleeping one is not in communication, a rank that moves data
  reads or writes its sockets. "Almost no CPU", not none: a waiting gloo rank is never
  still, its transport thread wakes from ``epoll_wait`` every 10 ms
  (gloo/transport/tcp/loop.cc, ``Loop::run``), and on a busy machine it is often seen
  runnable, waiting for a core.
- ``RanksInterrupted``: what an interrupt raises; IPython shows its one clean line only.
"""

from __future__ import annotations

import linecache
import os
import re
import signal
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ddp_lab.i18n import _t

# Seconds of quiet (no byte read or written, almost no CPU) on every rank before the first
# stack sample, and again between the two samples: a deadlock is reported about 2 x this after
# it begins.
QUIET_S = float(os.environ.get("DDP_LAB_DEADLOCK_S", "2"))
_PROC_EVERY_S = 0.25
# CPU a quiet rank may use: a waiting gloo rank's transport thread costs about 0.5 % of a core
# (measured: a tick every 2-3 s); a computing rank uses a whole core, or its share of one.
_QUIET_CPU = 0.02
_QUIET_TICKS = 2  # and rounding: ticks are counted in 1/CLK_TCK s; a stack dump costs one
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_COMM_LINE = re.compile(r"\.wait\(|\bdist\.\w+\(|\b(i?send|i?recv|barrier|all_reduce)\(")
_RUNTIME = os.path.dirname(os.path.abspath(__file__))
_COURSE = os.path.join(os.path.dirname(_RUNTIME), "course")


def show_everything() -> bool:
    """Whether the learner asked for the full, unfolded details (``DDP_LAB_TRACEBACK=1``)."""
    return os.environ.get("DDP_LAB_TRACEBACK", "") not in ("", "0")


@dataclass
class Frame:
    file: str
    line: int
    func: str


def parse_threads(dump: str) -> list[list[Frame]]:
    """The threads of one faulthandler dump, each as frames, innermost first."""
    threads: list[list[Frame]] = []
    for text in dump.splitlines():
        if _THREAD.match(text):
            threads.append([])
            continue
        m = _FRAME.match(text)
        if m and threads:
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    return threads


def main_thread(dump: str) -> list[Frame]:
    """The rank's main thread: the one that started at the zygote's ``-c`` command (its
    outermost frame is ``<string>``), else the first thread of the (last) dump."""
    threads = parse_threads(dump)
    for frames in reversed(threads):
        if frames and frames[-1].file == "<string>":
            return frames
    return threads[0] if threads else []


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({paths["stdlib"], paths["platstdlib"]})


_STDLIB = _stdlib_dirs()


def _where(file: str) -> str | None:
    """None for the learner's own code; else the short name of the internals it belongs to."""
    if file == "<string>" or file.startswith(_RUNTIME) or file.startswith(_COURSE):
        return "ddp_lab"
    if f"{os.sep}torch{os.sep}" in file:
        return "torch"
    if "site-packages" in file or file.startswith(_STDLIB):
        return "Python"
    return None


def _is_cell(file: str, cells: dict[str, int | None]) -> bool:
    return file in cells


def place(frame: Frame, cells: dict[str, int | None]) -> str:
    """Where a frame is, as a learner names it: ``Cell In[7], line 4`` or a file and line."""
    if _is_cell(frame.file, cells):
        count = cells[frame.file]
        if count:
            return _t("Cell In[{count}], line {line}", count=count, line=frame.line)
        return _t("Cell, line {line}", line=frame.line)
    return f'File "{frame.file}", line {frame.line}'


def in_communication(frames: list[Frame]) -> bool:
    """Whether the innermost frame waits in communication (see the module docstring)."""
    if not frames:
        return False
    inner = frames[0]
    if f"{os.sep}torch{os.sep}distributed{os.sep}" in inner.file:
        return True
    if inner.file.startswith(_RUNTIME):
        return False
    return bool(_COMM_LINE.search(linecache.getline(inner.file, inner.line)))


def format_stack(dump: str, cells: dict[str, int | None]) -> str:
    """One rank's stack, readable: the learner's frames, innermost first, internals folded."""
    frames = main_thread(dump)
    if not frames:
        return "  " + _t("(no Python stack: the rank did not answer)") + "\n"
    if show_everything():
        return dump if dump.endswith("\n") else dump + "\n"
    lines: list[str] = []
    folded: list[str] = []
    for frame in frames:
        where = None if _is_cell(frame.file, cells) else _where(frame.file)
        if where is not None:
            folded.append(where)
            continue
        source = linecache.getline(frame.file, frame.line).strip()
        lines.append(f"  {place(frame, cells)}, in {frame.func}")
        if source:
            lines.append(f"      {source}")
    if folded:
        names = ", ".join(dict.fromkeys(folded))
        lines.append(
            "  "
            + _t(
                "({count} more frames of {where}; DDP_LAB_TRACEBACK=1 shows them)",
                count=len(folded),
                where=names,
            )
        )
    return "\n".join(lines) + "\n"


def cell_numbers() -> dict[str, int | None]:
    """Each notebook cell's file -> its execution count (IPython's ``In[N]``), where known."""
    cells: dict[str, int | None] = {}
    for name, entry in linecache.cache.items():
        if (name.startswith("<ipython-input") or "ipykernel_" in name) and len(entry) == 4:
            cells[name] = None
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    numbers = getattr(getattr(shell, "compile", None), "_filename_map", {}) or {}
    for name, count in numbers.items():
        if name in cells and isinstance(count, int) and count > 0:
            cells[name] = count
    return cells


class StackReader:
    """Asks ranks for their stacks and returns what each wrote since the previous request."""

    def __init__(self, workdir: str, send: Callable[[dict], None]) -> None:
        self.workdir, self.send = workdir, send
        self.offsets: dict[int, int] = {}

    def ready(self, rank: int) -> bool:
        """Whether the rank has registered its handler (``_rank`` renames the file after)."""
        return os.path.exists(os.path.join(self.workdir, f"{rank}.stack"))

    def _size(self, rank: int) -> int:
        try:
            return os.path.getsize(os.path.join(self.workdir, f"{rank}.stack"))
        except OSError:
            return 0

    def request(self, ranks: list[int], wait_s: float = 2.0) -> dict[int, str]:
        ranks = [r for r in ranks if self.ready(r)]
        if not ranks:
            return {}
        self.send({"op": "signal", "sig": signal.SIGUSR1, "ranks": ranks})
        deadline = time.monotonic() + wait_s
        sizes = {r: self.offsets.get(r, 0) for r in ranks}
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = {r: self._size(r) for r in ranks}
            grown = all(now[r] > self.offsets.get(r, 0) for r in ranks)
            if grown and now == sizes:  # every rank wrote, and nothing more came in 50 ms
                break
            sizes = now
        stacks: dict[int, str] = {}
        for r in ranks:
            path = os.path.join(self.workdir, f"{r}.stack")
            try:
                with open(path, encoding="utf-8", errors="backslashreplace") as f:
                    f.seek(self.offsets.get(r, 0))
                    text = f.read()
            except OSError:
                continue
            self.offsets[r] = self.offsets.get(r, 0) + len(text.encode("utf-8", "backslashreplace"))
            if text:
                stacks[r] = text
        return stacks


def _proc_sample(pid: int) -> tuple[int, int | None] | None:
    """(CPU ticks used so far, bytes read and written so far) of a process; None if gone.

    The bytes (``rchar + wchar`` of ``/proc/PID/io``, sockets included) are None where that
    file cannot be read (another user's process): the CPU alone decides then."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None
    moved = None
    try:
        with open(f"/proc/{pid}/io") as f:
            counters = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        moved = int(counters["rchar"]) + int(counters["wchar"])
    except (OSError, KeyError, ValueError):
        pass
    return ticks, moved


@dataclass
class DeadlockWatch:
    """Decides, from ``/proc`` and two stack samples, that every live rank is deadlocked."""

    pids: dict[int, int]
    reader: StackReader
    quiet_s: float = QUIET_S
    since: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    since_at: float = 0.0
    quiet_since: float | None = None
    first: dict[int, str] | None = None
    first_at: float = 0.0
    checked_at: float = 0.0
    stacks: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def _samples(self, live: list[int]) -> dict[int, tuple[int, int | None]] | None:
        samples = {r: _proc_sample(self.pids[r]) for r in live}
        return None if any(s is None for s in samples.values()) else samples  # type: ignore[return-value]

    def _still_quiet(self, samples: dict[int, tuple[int, int | None]], now: float) -> bool:
        """Whether no rank moved a byte or used more than a trickle of CPU since ``since``."""
        allowed = _QUIET_TICKS + _QUIET_CPU * (now - self.since_at) * _CLK_TCK
        for r, (ticks, moved) in samples.items():
            was = self.since.get(r)
            if was is None or ticks - was[0] > allowed:
                return False
            if moved is not None and was[1] is not None and moved != was[1]:
                return False
        return True

    def _restart(self, samples: dict[int, tuple[int, int | None]], now: float) -> None:
        self.quiet_since, self.first = now, None
        self.since, self.since_at = samples, now

    def check(self, live: list[int], now: float) -> bool:
        """Call often while ranks run; True once every live rank is deadlocked."""
        if self.quiet_s <= 0 or not live or now - self.checked_at < _PROC_EVERY_S:
            return False
        self.checked_at = now
        samples = self._samples(live)
        if samples is None:  # a rank is gone: its launch sees that itself
            self.quiet_since, self.first, self.since = None, None, {}
            return False
        if self.quiet_since is None or not self._still_quiet(samples, now):
            self._restart(samples, now)
            return False
        if self.first is None:
            if now - self.quiet_since >= self.quiet_s:
                self.first, self.first_at = self.reader.request(live), time.monotonic()
                # The dump itself writes the stack file and costs CPU: count from after it.
                self.since, self.since_at = self._samples(live) or {}, self.first_at
            return False
        if now - self.first_at < self.quiet_s:
            return False
        second = self.reader.request(live)
        mains = {r: main_thread(second.get(r, "")) for r in live}
        same = all(
            mains[r]
            and [(f.file, f.line) for f in mains[r]]
            == [(f.file, f.line) for f in main_thread(self.first.get(r, ""))]
            for r in live
        )
        waiting = [r for r in live if in_communication(mains[r])]
        # Ranks inside init_process_group are still connecting, not deadlocked: 50 back-to-back
        # launches on a machine with ~700 loopback sockets in TIME-WAIT stalled there for over
        # 4 s with no CPU used about half the time, and then went on (likely the kernel's
        # connect retries, not confirmed); a rank that never comes is the timeout's to report.
        if any(f.func == "init_process_group" for r in live for f in mains[r] or ()):
            self._restart(self._samples(live) or {}, now)
            return False
        finishing = [r for r in live if mains[r] and mains[r][0].func == "finish_together"]
        if same and waiting and len(waiting) + len(finishing) == len(live):
            self.stacks = second
            self.seconds = now - self.quiet_since
            return True
        # moving after all: watch again from here (after this dump, which wrote and cost CPU)
        self._restart(self._samples(live) or {}, time.monotonic())
        return False


class RanksInterrupted(KeyboardInterrupt):
    """A kernel interrupt stopped a launch; IPython shows the clean line only (the full
    traceback with ``DDP_LAB_TRACEBACK=1``)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or _t("Interrupted: all ranks were stopped."))

    def _render_traceback_(self) -> list[str]:
        if show_everything():
            import traceback

            return traceback.format_exception(type(self), self, self.__traceback__)
        return [str(self)]
