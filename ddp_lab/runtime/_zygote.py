"""The zygote: a helper process that has imported torch once and forks ranks on request.

Why: ``torch.multiprocessing.spawn`` starts a fresh interpreter per rank and imports
torch in each (seconds), and forking the notebook kernel itself breaks once the kernel
has initialised CUDA. The zygote is a clean Python process started by the launcher
(``python -c "from ddp_lab.runtime._zygote import main; main()"``): it imports torch but
never touches CUDA, so a fork of it is as fast as a fork of the kernel and still safe for
CUDA in the children.

Preload: the first ``DistributedDataParallel`` a process builds imports about 820 more
modules (``torch._dynamo``, sympy, ...: about a second), which every rank would pay at every
launch. So the zygote imports them too, but not before it says "ready" (that would add the
same second to the first launch): right after "ready" it forks a *successor* that imports
them while the zygote serves launches as before; when the successor is done, the zygote
hands the pipes over at the next idle moment and only waits for it. Ranks forked from the
successor start with DDP's modules loaded. Why a fork of such a process is safe, and the
torch deadlock that first looked like a fork hang: see ARCHITECTURE.md ("The preload").
The persistent ranks' zygote preloads before "ready" (``eager``): its only launch comes at
once and lasts the whole group.

Protocol: length-prefixed pickles. The launcher writes to the zygote's stdin; the zygote
answers on the pipe that was its stdout (its fd 1 is then pointed at stderr so stray
prints cannot corrupt the protocol).
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import signal
import socket
import struct

from ddp_lab.runtime._process import set_parent_death_signal

_HEADER = struct.Struct("!I")
# What the first DDP construction (and its first backward) imports beyond torch.distributed.
PRELOAD = ("torch._dynamo", "torch.nn.parallel.distributed")
_HANDOVER = b"H"
_ARMED = b"A"  # the successor will die with the zygote (see _fork_successor)


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


def _launch(msg: dict, in_fd: int, out_fd: int, close_fds: tuple[int, ...] = ()) -> bool:
    """Fork the ranks of one launch and report their exits. False when the parent is gone."""
    from ddp_lab.runtime import _rank

    store_socket = None
    if msg.get("port") is None:
        # The rendezvous port, bound here and handed to rank 0 (see ``_rank.host_store``).
        store_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        store_socket.bind(("127.0.0.1", 0))
        store_socket.listen(128)
        msg = {**msg, "port": store_socket.getsockname()[1], "store_fd": store_socket.fileno()}
    msg = {**msg, "zygote": os.getpid()}  # each rank's parent, for its parent-death signal
    alive: dict[int, int] = {}
    try:
        for rank in range(msg["nprocs"]):
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    code = _rank.main(rank, msg, close_fds=(in_fd, out_fd, *close_fds))
                finally:
                    os._exit(code)
            alive[pid] = rank
    finally:
        if store_socket is not None:
            store_socket.close()  # rank 0 holds its own copy
    started = {"op": "started", "pids": {r: p for p, r in alive.items()}, "port": msg["port"]}
    write_msg(out_fd, started)
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
        # Reap the ranks by pid: waitpid(-1) would also reap the preloading successor.
        for pid in list(alive):
            done, status = os.waitpid(pid, 0 if not parent_alive else os.WNOHANG)
            if done == 0:
                continue
            rank = alive.pop(pid)
            if parent_alive:
                write_msg(out_fd, {"op": "exit", "rank": rank, "status": status})
    if parent_alive:
        write_msg(out_fd, {"op": "done"})
    return parent_alive


def preload() -> None:
    """Import what the first DDP construction in a rank would (see the module docstring)."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  # a torch without it: the ranks import what they need
            pass


def _pause(successor: tuple[int, int, int] | None, stop: bool) -> None:
    if successor is not None:
        try:
            os.kill(successor[0], signal.SIGSTOP if stop else signal.SIGCONT)
        except ProcessLookupError:
            pass


def _serve(in_fd: int, out_fd: int, successor: tuple[int, int, int] | None = None) -> None:
    """Answer the launcher's requests until end of file, or until the successor takes over.

    ``successor`` is (pid, fd that says it has preloaded, fd to tell it to take over).
    """
    while True:
        watch = [in_fd] if successor is None else [successor[1], in_fd]
        ready, _, _ = select.select(watch, [], [])
        if successor is not None and successor[1] in ready:
            pid, ready_fd, go_fd = successor
            if os.read(ready_fd, 1) == _HANDOVER:
                # Idle here, between launches: whole messages only were read, so whatever
                # the launcher sends next is the successor's to read.
                os.write(go_fd, _HANDOVER)
                for fd in (in_fd, out_fd, ready_fd, go_fd):
                    os.close(fd)  # the launcher must see EOF when the successor ends
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            # The successor died before it was ready: carry on without a preload.
            os.waitpid(pid, 0)
            for fd in (ready_fd, go_fd):
                os.close(fd)
            successor = None
            continue
        msg = read_msg(in_fd)
        if msg is None:
            return
        if msg.get("op") == "launch":
            extra = () if successor is None else successor[1:]
            # A preload still under way would compete with these ranks for the cores (a cold
            # DDP launch took 1.4x as long on 2 cores): it waits, stopped, until they end.
            _pause(successor, True)
            try:
                if not _launch(msg, in_fd, out_fd, extra):
                    return
            finally:
                _pause(successor, False)
        elif msg.get("op") == "ping":
            write_msg(out_fd, {"op": "pong", "pid": os.getpid()})


def _fork_successor(in_fd: int, out_fd: int) -> tuple[int, int, int] | None:
    """Fork a copy of this zygote that preloads, then waits to be told to take over.

    Returns once the copy will die with this zygote (None if it died first). Why wait: the
    zygote stops its successor while ranks run (``_pause``), and a successor stopped before it
    had set its parent-death signal outlived a zygote killed during a launch, stopped for ever,
    holding the launcher's pipes open, so that the launcher waited for the launch's timeout.
    """
    zygote = os.getpid()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(ready_r)
            os.close(go_w)
            # Dies with the zygote, before a handover too.
            set_parent_death_signal(signal.SIGKILL, parent=zygote)
            os.write(ready_w, _ARMED)
            preload()
            os.write(ready_w, _HANDOVER)
            os.close(ready_w)
            if os.read(go_r, 1) == _HANDOVER:  # b"": the zygote ended first
                os.close(go_r)
                _serve(in_fd, out_fd)
        except BaseException:  # noqa: BLE001  # never run the zygote's code twice
            code = 70
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != _ARMED:  # b"": it died before it was armed
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(go_w)
        return None
    return pid, ready_r, go_w


def main(eager: bool = False) -> None:
    """Serve the launcher; ``eager``: preload before "ready" instead of in a successor."""
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
    if eager:
        preload()
    write_msg(out_fd, {"op": "ready", "pid": os.getpid(), "torch": torch.__version__})
    _serve(in_fd, out_fd, None if eager else _fork_successor(in_fd, out_fd))
    os._exit(0)


if __name__ == "__main__":
    main()
