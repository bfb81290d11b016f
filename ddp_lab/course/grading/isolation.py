"""Per-submission resources: a user id no running submission shares, and a cgroup each.

- ``Slots``: the sandbox of a submission runs as ``sandbox.BASE_UID + slot``; a slot is
  held (an ``flock`` on a file of the grader's temp folder, so two ``ddp-lab grade`` runs on
  one machine do not share one either) from the start of the grading to its end. Processes
  per user (``RLIMIT_NPROC``) are then counted per submission: one submission's fork bomb
  cannot make another's ``fork`` fail.
- ``Cgroup``: one control group per submission, holding the verdict process and everything
  it starts (the sandbox and its ranks): a pids limit, a memory limit (tmpfs pages written
  by the sandbox count too) and an equal CPU share (``cpu.shares`` in v1, ``cpu.weight`` in
  v2), so 300 busy processes in one submission get the CPU of one submission. cgroup v2 is
  used where its memory, pids and cpu controllers can be enabled, else v1's ``memory``,
  ``pids``, ``cpu`` and ``cpuacct`` hierarchies; the group is created below the grader's own
  and removed after its processes are killed; groups of a grader process that no longer runs
  (killed before it could remove them) are swept by the next one (``sweep_stale``). Without
  either (not root, a container that does not delegate cgroups, not Linux)
  ``unavailable_reason`` says why and grading goes on without these limits.
- ``Canary`` and ``starved``: whether a run's timeout may be blamed on the learner's code
  (it used the time, or slept) or on the machine (a small process of the grader's own,
  beside it, waited for a CPU that others had), sampled with the submission's CPU time so
  that a stretch of the run (the cell that stalled) can be judged alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.i18n import _t
from ddp_lab.runtime._process import pid_alive

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")


@dataclass(frozen=True)
class CgroupLimits:
    """What one submission (its verdict process, sandbox and ranks together) may use."""

    memory_gb: float = 8.0
    pids: int = 1024
    cpu_weight: int = 100  # v2 cpu.weight; v1 cpu.shares = 1024 * weight / 100


class Slots:
    """Numbers no other running grading (of this or another grader process) holds."""

    def __init__(self, size: int = 1000, folder: Path | None = None) -> None:
        self.size = size
        self.folder = folder or Path(tempfile.gettempdir()) / f"ddp-lab-slots-{os.geteuid()}"
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.held: dict[int, int] = {}
        self.lock = threading.Lock()

    def acquire(self) -> int:
        while True:
            with self.lock:
                for n in range(self.size):
                    if n in self.held:
                        continue
                    fd = os.open(self.folder / f"{n}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        os.close(fd)
                        continue
                    self.held[n] = fd
                    return n
            time.sleep(0.5)  # every slot in use (more than `size` gradings): wait for one

    def release(self, n: int) -> None:
        with self.lock:
            fd = self.held.pop(n, None)
        if fd is not None:
            os.close(fd)  # closing drops the flock


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup file system."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if rfields and rfields[0] in ("cgroup", "cgroup2"):
                found.append((fields[4], rfields[0], set(rfields[-1].split(","))))
    return found


def _own(hierarchy: str) -> str:
    """The grader's cgroup path in a v1 hierarchy (a controller's name) or v2 (``""``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (hierarchy == "" and ctrls == "") or hierarchy in ctrls.split(","):
            return path.lstrip("/")
    raise OSError(errno.ENOENT, f"not in a {hierarchy or 'v2'} cgroup")


@functools.cache
def _layout() -> tuple[str, dict[str, Path]] | str:
    """("v2", {"": parent}) or ("v1", {controller: parent}) where groups are made, or why not."""
    if os.environ.get("DDP_LAB_CGROUPS", "1") == "0":
        return "turned off with DDP_LAB_CGROUPS=0"
    if not Path("/proc/self/cgroup").exists():
        return "this system has no cgroups"
    mounts = _mounts()
    for point, kind, _ in mounts:
        if kind != "cgroup2":
            continue
        with contextlib.suppress(OSError):
            parent = Path(point) / _own("")
            have = set((Path(point) / "cgroup.controllers").read_text().split())
            if {"memory", "pids", "cpu"} <= have:
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                enabled = set((parent / "cgroup.subtree_control").read_text().split())
                if {"memory", "pids", "cpu"} <= enabled and _try({"": parent}):
                    return "v2", {"": parent}
    v1: dict[str, Path] = {}
    for point, kind, opts in mounts:
        if kind == "cgroup":
            for ctrl in V1_CONTROLLERS:
                if ctrl in opts and ctrl not in v1:
                    with contextlib.suppress(OSError):
                        v1[ctrl] = Path(point) / _own(ctrl)
    missing = [c for c in V1_CONTROLLERS if c not in v1]
    if missing:
        return f"no cgroup v2 with memory, pids and cpu, nor cgroup v1 {', '.join(missing)}"
    if not _try(v1):
        return "cannot create cgroups here (needs root, or a delegated cgroup)"
    return "v1", v1


def _try(parents: dict[str, Path]) -> bool:
    made = []
    try:
        for parent in parents.values():
            d = parent / f"ddp-lab-probe-{os.getpid()}-{threading.get_ident()}"
            if d not in made:
                d.mkdir()
                made.append(d)
        return True
    except OSError:
        return False
    finally:
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()


def unavailable_reason() -> str | None:
    """Why there is no cgroup per submission here, or None."""
    layout = _layout()
    return layout if isinstance(layout, str) else None


_warned = False


def warn_no_cgroups(lang: str = "en") -> None:
    """Say once, on stderr, that submissions share the machine's resources without cgroups."""
    global _warned
    why = unavailable_reason()
    if _warned or why is None:
        return
    _warned = True
    print(
        _t(
            "WARNING: no cgroup per submission on this machine ({why}): a "
            "submission's processes, memory and CPU are limited per process and per "
            "user id only.",
            lang,
            why=why,
        ),
        flush=True,
        file=__import__("sys").stderr,
    )


class Cgroup:
    """One submission's control group (``available()`` first); a context manager that
    kills what is left in it and removes it on exit."""

    def __init__(self, name: str, limits: CgroupLimits = CgroupLimits()) -> None:
        layout = _layout()
        assert not isinstance(layout, str), layout
        self.version, parents = layout
        self.dirs = {ctrl: parent / name for ctrl, parent in parents.items()}
        self.limits = limits

    def __enter__(self) -> Cgroup:
        sweep_stale(self.version, {d.parent for d in self.dirs.values()})
        for d in dict.fromkeys(self.dirs.values()):
            d.mkdir()
        try:
            memory = int(self.limits.memory_gb * 2**30)
            if self.version == "v2":
                d = self.dirs[""]
                (d / "memory.max").write_text(str(memory))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(self.limits.pids))
                (d / "cpu.weight").write_text(str(self.limits.cpu_weight))
            else:
                (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory))
                with contextlib.suppress(OSError):  # only where swap accounting is on
                    (self.dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory))
                (self.dirs["pids"] / "pids.max").write_text(str(self.limits.pids))
                shares = max(2, 1024 * self.limits.cpu_weight // 100)
                (self.dirs["cpu"] / "cpu.shares").write_text(str(shares))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values())]

    def enter_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into this group (then ``exec``):
        nothing it starts is ever outside the group."""
        writes = " && ".join(f"echo $$ > '{p}'" for p in self.procs_files())
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "ddp-lab-cgroup", *argv]

    def pids(self) -> list[int]:
        pids: set[int] = set()
        for f in self.procs_files():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in f.read_text().split())
        return sorted(pids)

    def cpu_seconds(self) -> float:
        """CPU time used by everything that ran in the group so far."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            if self.version == "v2":
                stat = dict(
                    line.split() for line in (self.dirs[""] / "cpu.stat").read_text().splitlines()
                )
                return int(stat["usage_usec"]) / 1e6
            return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
        return 0.0

    def kill(self) -> None:
        """SIGKILL everything in the group until it is empty (a fork races the kill)."""
        if self.version == "v2":
            with contextlib.suppress(OSError):
                (self.dirs[""] / "cgroup.kill").write_text("1")
        end = time.monotonic() + KILL_PATIENCE_S
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def remove(self) -> None:
        """Kill what is left, then remove the group from every hierarchy."""
        self.kill()
        for d in dict.fromkeys(self.dirs.values()):
            end = time.monotonic() + KILL_PATIENCE_S
            while True:  # the kernel frees a group shortly after its last process
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > end:
                        break  # left for sweep_stale once this process has ended
                    time.sleep(0.05)


# How long kill and remove keep at it. On a loaded machine (a fork bomb in the group, load 150)
# 5 s of kills and 2.5 s of rmdir were not always enough: groups of graders long gone were found
# in the pids and cpu hierarchies (their memory group removed, the others busy until then).
KILL_PATIENCE_S = 20.0
_STALE = re.compile(r"ddp-lab-(?:test-)?(\d+)-")
# Stale groups this process tried and failed to remove: not tried again at every submission's
# Cgroup (each try may take KILL_PATIENCE_S).
_UNREMOVABLE: set[Path] = set()


def sweep_stale(version: str, parents: set[Path]) -> list[Path]:
    """Kill what is left in, and remove, the groups of grader processes that no longer run.

    A group is named after the grader process that made it (``ddp-lab-<pid>-<token>``,
    execute.py); one whose process is gone was left by a grader that was killed (SIGKILL gives
    no time for ``remove``) or that gave up on a busy group. A pid the system reused for another
    process keeps its groups until that process ends too. ``version``: the layout's ("v1",
    "v2"), as ``Cgroup.version``.
    """
    removed = []
    for parent in parents:
        with contextlib.suppress(OSError):
            for d in parent.iterdir():
                m = _STALE.match(d.name)
                if not (m and d.is_dir()) or d in _UNREMOVABLE or pid_alive(int(m.group(1))):
                    continue
                group = Cgroup.__new__(Cgroup)  # an existing group: no limits to write
                group.version, group.dirs = version, {"": d}
                group.remove()
                if d.exists():
                    _UNREMOVABLE.add(d)
                else:
                    removed.append(d)
    return removed


# The canary: a process that wants a few milliseconds of CPU every ``period`` s and sleeps
# otherwise (``-S``: nothing imported, it starts in milliseconds); it ends with its parent.
CANARY_CODE = (
    "import os, time\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "    time.sleep({period})\n"
    "    t = time.thread_time()\n"
    "    while time.thread_time() - t < {burst}:\n"
    "        pass\n"
)


class Canary:
    """How busy the machine was while a submission ran, judged from a process of the
    grader's own: it runs beside the submission's code, outside its cgroup, and every
    ``period`` s it wants ``burst`` s of CPU; its run-queue delay (the kernel's
    ``schedstat``) says what share of the time it wanted a CPU it spent waiting for one.

    The learner's tasks cannot move it: their own waits (hundreds of sleepers waking on one
    clock tick) are not counted, and their CPU use is held to the cgroup's share, beside
    which the canary is a sibling of its own.

    ``usage``: the submission's CPU seconds so far (``Cgroup.cpu_seconds``). A thread samples
    it with the canary's counters every ``every`` s, so that ``since`` can judge the stretch
    a timeout is about (the cell that stalled), not the whole run: the start-up's CPU, taken
    slowly on a busy machine, is no sign that a cell which then slept wanted the CPU."""

    def __init__(
        self,
        period: float = 0.5,
        burst: float = 0.005,
        usage: Callable[[], float] | None = None,
        every: float = 1.0,
    ) -> None:
        import subprocess
        import sys

        code = CANARY_CODE.format(period=period, burst=burst)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.usage = usage or (lambda: 0.0)
        self.samples: list[tuple[float, float, float, float]] = []  # (t, ran, waited, used)
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._watch, args=(every,), daemon=True)
        self._thread.start()

    def _schedstat(self) -> tuple[float, float]:
        """The canary's CPU time and run-queue wait so far, in seconds."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{self.proc.pid}/schedstat").read_text().split()
            return int(fields[0]) / 1e9, int(fields[1]) / 1e9
        return 0.0, 0.0

    def _sample(self) -> None:
        ran, waited = self._schedstat()
        self.samples.append((time.monotonic(), ran, waited, self.usage()))

    def _watch(self, every: float) -> None:
        while not self._stop.wait(every):
            self._sample()

    def stop(self) -> float:
        """Stop the canary; the share (0..1) of its wanted CPU time it spent waiting."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._sample()
            self.proc.kill()
            self.proc.wait()
        return self.since(self.samples[0][0])[0]

    def since(self, t: float, until: float | None = None) -> tuple[float, float, float]:
        """``(busy, used, wall)`` from the first sample at or after monotonic time ``t`` (the
        last if none) to the last at or before ``until`` (the last sample without it): the
        canary's waiting share, the submission's CPU seconds and the wall seconds of that
        stretch, for ``starved``. Inside, not around: a sample before ``t`` would count up to
        ``every`` seconds of what ran before it (the start-up's CPU, against a stalled cell
        that only slept), one after ``until`` what ran after (the sandbox's teardown)."""
        first = min((s for s in self.samples if s[0] >= t), default=self.samples[-1])
        inside = [s for s in self.samples if s[0] >= first[0] and (until is None or s[0] <= until)]
        last = max(inside, default=first)
        ran, waited = last[1] - first[1], last[2] - first[2]
        busy = waited / (ran + waited) if ran + waited > 0 else 0.0
        return busy, last[3] - first[3], last[0] - first[0]


def starved(busy: float, used: float, wall: float) -> bool:
    """Whether a submission that ran out of time was starved by the machine.

    ``busy``: the share of the time the grader's canary (``Canary``) wanted a CPU that it
    spent waiting for one; ``1 - busy`` is then the share of a core a task that wants one got
    on this machine. Starved: that share was under a quarter, and the submission took at
    least half of what such a task got (it wanted the CPU, as far as anyone could tell) yet
    under a quarter of a core. A submission that slept, stalled or deadlocked used far less
    than the machine would have given it (hundreds of sleepers waking on one clock tick
    included: their own waits are not asked), and one that kept a CPU busy used more than a
    quarter. Either way it gets no points: a starved one is an ``error`` to grade again, not
    a ``timeout``."""
    share = 1.0 - busy
    return wall > 0 and share < 0.25 and 0.5 * share * wall <= used < 0.25 * wall
