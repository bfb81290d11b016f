"""The launches' private folders in /tmp, and the removal of those whose owner was killed.

A launch keeps its ranks' output, ledgers and stacks in a folder that the process that
launched it removes at the end. A process killed by SIGKILL (a kernel the OOM killer took, a
``kill -9``) never gets there: its ranks die with it (parent-death signal), its folder would
stay. So each folder is named after its owner (``ddp_lab_<pid>_...``, ``ddp_lab_trace_<pid>_...``,
``ddp_lab_ranks_<pid>_...``, and a test run's Jupyter sockets in ``ddp_lab_kernels_<pid>_...``:
``course/nbkernels.py``) and holds a file ``.owner`` that the owner keeps locked with
``flock``; the kernel drops that lock when the owner dies, however it dies. Every new
folder first removes the folders whose lock nobody holds. The lock, not the pid, decides:
a pid can be reused by another process, a lock cannot outlive its owner.

Why not ``tempfile.TemporaryDirectory``: its finalizer runs at exit and at garbage
collection, neither of which happens after a SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import time

from ddp_lab.runtime._process import pid_alive

_OWNER = ".owner"
# What this module names (and only that: other ddp_lab_* folders are not ours to remove).
_NAME = re.compile(r"^ddp_lab_(?:trace_|ranks_|kernels_)?(\d+)_[a-z0-9_]{8}$")
# Folders of launchers older than this module: no owner recorded; see ``_legacy_stale``.
_LEGACY = re.compile(r"^ddp_lab_[a-z0-9_]{8}$")
_RANK_FILE = re.compile(r"^\d+\.(out|err|calls|stack|result)(\.new|\.tmp)?$")
_locks: dict[str, int] = {}  # folder -> the open, locked .owner file


def make(kind: str = "") -> str:
    """A new private folder ``ddp_lab_<kind><pid>_XXXXXXXX``, owned (locked) by this process.

    Args:
        kind: "" for a launch's rank files, "trace_", "ranks_" or "kernels_".
    """
    remove_stale()
    path = tempfile.mkdtemp(prefix=f"ddp_lab_{kind}{os.getpid()}_")
    new = os.path.join(path, _OWNER + ".new")
    fd = os.open(new, os.O_CREAT | os.O_WRONLY, 0o600)  # not inherited by children (PEP 446)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # Locked before it has the name others look for: no cleaner can take it in between.
    os.rename(new, os.path.join(path, _OWNER))
    _locks[path] = fd
    return path


def remove(path: str) -> None:
    """Remove a folder made by ``make`` and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _locks.pop(path, None)
    if fd is not None:
        os.close(fd)


def _owner_gone(path: str, pid: int) -> bool:
    try:
        fd = os.open(os.path.join(path, _OWNER), os.O_RDONLY)
    except FileNotFoundError:
        # Not locked yet (made a moment ago), or its owner died before it locked it.
        return not pid_alive(pid)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: the owner lives
    finally:
        os.close(fd)
    return True


_LEGACY_AGE_S = 600.0


def _legacy_stale(path: str) -> bool:
    """A folder of an older launcher: stale when it holds only rank files, none written in the
    last ``_LEGACY_AGE_S`` (an older launcher reads its ranks' results just after they exit,
    when no rank has them open any more) and no process has one of them open (a live rank
    keeps its .out/.err open as its stdout/stderr)."""
    try:
        names = os.listdir(path)
        newest = max(os.stat(os.path.join(path, n)).st_mtime for n in [*names, "."])
    except (OSError, ValueError):
        return False
    if not names or not all(_RANK_FILE.match(n) for n in names):
        return False
    if time.time() - newest < _LEGACY_AGE_S:
        return False
    inside = os.path.realpath(path) + os.sep
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return False
            except OSError:
                continue
    return True


def remove_stale() -> list[str]:
    """Remove this user's launch folders whose owner is gone; return their paths."""
    root = tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        if not name.startswith("ddp_lab_"):
            continue
        path = os.path.join(root, name)
        if path in _locks:
            continue
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
        except OSError:
            continue
        match = _NAME.match(name)
        if match:
            stale = _owner_gone(path, int(match.group(1)))
        else:
            stale = bool(_LEGACY.match(name)) and _legacy_stale(path)
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
