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
