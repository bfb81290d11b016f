"""The zygote: a helper process that has imported torch once and forks ranks on request.

Why: ``torch.multiprocessing.spawn`` starts a fresh interpreter per rank and imports
torch in each (seconds), and forking the notebook kernel itself breaks once the kernel
has initialised CUDA. The zygote is a clean Python process started by the launcher
(``python -c "from ddp_lab.runtime._zygote import main; main()"``): it imports torch but
never touches CUDA, so a fork of it is as fast as a fork of the kernel and still safe for
CUDA in the children.

Protocol: length-prefixed pickles. The launcher writes to the zygote's stdin; the zygote
answers on the pipe that was its stdout (its fd 1 is then pointed at stderr so stray
prints cannot corrupt the protocol).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import struct
import sys

_HEADER = struct.Struct("!I")


def write_msg(fd: int, obj: object) -> None:
    """Write one framed message to a file descriptor."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_msg(fd: int) -> object | None:
    """Read one framed message; ``None`` at end of file."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no orphans)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(sig), 0, 0, 0)  # 1 == PR_SET_PDEATHSIG
        except OSError:
            pass


def _signal_ranks(alive: dict[int, int], sig: int, ranks: list[int] | None) -> None:
    for pid, rank in alive.items():
        if ranks is None or rank in ranks:
            try:
                os.killpg(pid, sig)  # each rank leads its own process group
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def _launch(msg: dict, in_fd: int, out_fd: int) -> bool:
    """Fork the ranks of one launch and report their exits. False when the parent is gone."""
    from ddp_lab.runtime import _rank

    alive: dict[int, int] = {}
    for rank in range(msg["nprocs"]):
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = _rank.main(rank, msg, close_fds=(in_fd, out_fd))
            finally:
                os._exit(code)
        alive[pid] = rank
    write_msg(out_fd, {"op": "started", "pids": {r: p for p, r in alive.items()}})
    parent_alive = True
    while alive:
        ready, _, _ = select.select([in_fd], [], [], 0.005)
        if ready:
            cmd = read_msg(in_fd)
            if cmd is None:  # the launcher died: take the ranks with us
                parent_alive = False
                _signal_ranks(alive, signal.SIGKILL, None)
            elif cmd.get("op") == "signal":
                _signal_ranks(alive, cmd["sig"], cmd.get("ranks"))
        while alive:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            rank = alive.pop(pid, None)
            if rank is not None and parent_alive:
                write_msg(out_fd, {"op": "exit", "rank": rank, "status": status})
        if not parent_alive and alive:
            os.waitpid(-1, 0)
    if parent_alive:
        write_msg(out_fd, {"op": "done"})
    return parent_alive


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Jupyter interrupts the whole group
    set_parent_death_signal(signal.SIGKILL)
    in_fd = 0
    out_fd = os.dup(1)
    os.dup2(2, 1)
    # Import what every rank needs once, here, so that forks start warm.
    import cloudpickle  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401

    from ddp_lab.runtime import _rank  # noqa: F401

    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    write_msg(out_fd, {"op": "ready", "pid": os.getpid(), "torch": torch.__version__})
    while True:
        msg = read_msg(in_fd)
        if msg is None:
            break
        if msg.get("op") == "launch":
            if not _launch(msg, in_fd, out_fd):
                break
        elif msg.get("op") == "ping":
            write_msg(out_fd, {"op": "pong"})
    os._exit(0)


if __name__ == "__main__":
    main()
