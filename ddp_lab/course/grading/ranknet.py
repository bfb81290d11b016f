"""The network the ranks of a graded exercise share, and nothing else (``course.grading.rankhost``).

A *network holder* is a bubblewrap sandbox with a network namespace of its own (only a
loopback) that runs nothing; each rank's sandbox enters that network with ``nsenter``, so the
ranks can reach each other and nothing on the host. Split from ``rankhost`` to keep each
module readable whole; ``rankhost.RankPool`` is the only user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ddp_lab.course.grading import view, wire


def start_holder(base: Path) -> tuple[subprocess.Popen, int]:
    """A sandbox that holds a network namespace with only a loopback; (process, its pid)."""
    from ddp_lab.course.grading import sandbox

    bwrap = sandbox.bwrap_path()
    assert bwrap is not None
    read, write = os.pipe()
    cmd = [bwrap, "--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"]
    if os.geteuid() != 0:
        cmd.append("--unshare-user")
    cmd += ["--ro-bind", "/", "/", "--info-fd", str(write), "--", "sleep", "infinity"]
    holder = subprocess.Popen(
        cmd,
        pass_fds=[write],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(write)
    reader = wire.LineReader(read, 4096)
    info = b""
    try:
        while not info.rstrip().endswith(b"}"):  # bwrap writes one small JSON object
            line = reader.readline(20)
            if line is None:
                raise RuntimeError("bubblewrap did not start the network holder")
            info += line + b"\n"
    finally:
        os.close(read)
    return holder, int(json.loads(info)["child-pid"])


def join_network(cmd: list[str], holder_pid: int, masks: list[str]) -> list[str]:
    """``sandbox.wrap``'s command, joined to the holder's network instead of a new one."""
    cmd = view.insert([a for a in cmd if a != "--unshare-net"], masks)
    enter = ["nsenter", f"--net=/proc/{holder_pid}/ns/net"]
    if os.geteuid() != 0:  # the holder's network belongs to its user namespace
        enter += [f"--user=/proc/{holder_pid}/ns/user", "--preserve-credentials"]
    return [*enter, "--", *cmd]


def remove_folder(base: Path) -> None:
    """Remove a pool's folder. A rank's sandboxed Python is killed with its bwrap
    (``--die-with-parent``), a moment after the process we wait for: it may still write a
    file while the folder goes, and the first try then leaves the folder behind."""
    for _ in range(20):
        shutil.rmtree(base, ignore_errors=True)
        if not base.exists():
            return
        time.sleep(0.05)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a sandbox: bwrap's death takes its PID namespace (everything in it) along."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def sandbox_init(pid: int) -> int | None:
    """The first process under ``pid`` (a rank's bwrap) that lives in another mount namespace:
    the sandbox's own init, bwrap's code, not the learner's; None if there is none (yet)."""
    try:
        mine = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None
    todo = [pid]
    while todo:
        q = todo.pop(0)
        try:
            if os.readlink(f"/proc/{q}/ns/mnt") != mine:
                return q
            for task in os.listdir(f"/proc/{q}/task"):
                with open(f"/proc/{q}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return None


def gone(pid: int, patience: float = 10.0) -> bool:
    """Wait until process ``pid`` has exited (a zombie or reaped). For a sandbox's init (the
    first process of its PID namespace) that means every process in the namespace has ended:
    the kernel kills them and waits for them before the init's exit completes."""
    until = time.monotonic() + patience
    while time.monotonic() < until:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def make_share(name: str, job: int) -> Path:
    """A host folder that rank 0 may write and the other ranks only read (``RankPool.run``'s
    ``share``): on /dev/shm where there is one (memory, charged to the writer's cgroup, as the
    sandbox's own tmpfs are; not the host's disk), owned by the ranks' user (``sandbox.wrap``)."""
    import re
    import tempfile

    from ddp_lab.course.grading import sandbox

    if not re.fullmatch(r"[\w.-]{1,100}", name) or name in (".", ".."):
        raise ValueError(f"not a folder name: {name!r}")

    uid = sandbox.BASE_UID + job if os.geteuid() == 0 else None

    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="ddp-lab-share-", dir=shm if shm.is_dir() else None))
    if uid is not None:
        os.chown(folder, uid, uid)
    return folder


def list_share(folder: Path) -> dict[str, dict[str, object]]:
    """What is in ``folder``, as the host sees it: each name's kind, size and ctime (seconds of
    the wall clock: ``utime`` cannot set it, and any write or rename moves it forward)."""
    found: dict[str, dict[str, object]] = {}
    for entry in os.scandir(folder):
        st = entry.stat(follow_symlinks=False)
        kind = "link" if entry.is_symlink() else "dir" if entry.is_dir() else "file"
        found[entry.name] = {"kind": kind, "size": st.st_size, "ctime": st.st_ctime_ns / 1e9}
    return found


def ended_why(proc: subprocess.Popen, rank: int) -> str:
    """Why rank ``rank`` (its sandbox ``proc``) ended without an answer, for the learner: how
    its process ended (bwrap passes on its exit status, 128 + the signal for a killed one).
    What it printed stays in its sandbox's private folder, out of the grader's reach."""
    from ddp_lab.i18n import _t

    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        code = None
    if code is not None and code > 128 and code - 128 in signal.valid_signals():
        return _t(
            "rank {rank} ended without an answer: its process was killed by {signal}",
            rank=rank,
            signal=signal.Signals(code - 128).name,
        )
    if code is not None:
        return _t(
            "rank {rank} ended without an answer: its process exited with status {code}",
            rank=rank,
            code=code,
        )
    return _t("rank {rank} ended without an answer", rank=rank)
