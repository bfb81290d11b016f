"""Process plumbing shared by the zygote, the ranks it forks and the grader's verdict process."""

from __future__ import annotations

import ctypes
import os
import sys


def set_parent_death_signal(sig: int, parent: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no orphans).

    ``parent``: the parent's pid, for a forked child. A parent that died between the fork and
    this call can no longer send the signal (the child already has another parent), so then
    the child sends it to itself.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(sig), 0, 0, 0)  # 1 == PR_SET_PDEATHSIG
        except OSError:
            pass
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts: EPERM)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
