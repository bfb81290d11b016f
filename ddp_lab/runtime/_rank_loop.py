"""What a persistent rank runs: wait for a request, run it in this rank's namespace, answer.

``ddp_lab.runtime.persistent`` launches the ranks through the launcher's zygote, so each one is set
up exactly like a ``dl.spawn`` rank (own process group, fd-level output capture,
faulthandler on SIGUSR1, torchrun-like environment). Then, instead of returning, it
connects back to the notebook over a Unix socket in the launch's private directory and
serves requests until it is told to exit or the socket closes:

- ``exec``: run a cell in the namespace (notebook names it lacks are added first); a last
  expression's value is printed, as a notebook would show it;
- ``pull``: evaluate an expression and send the value back (tensors detached, on CPU);
- ``push``: set names.

An ``exec`` request may ask for a trace (``%%ranks --trace``): the cell alone runs under
``torch.profiler`` on this rank, which exports its trace for the notebook to merge.

SIGINT becomes KeyboardInterrupt only while user code runs, so a kernel interrupt stops the
current cell but never the loop itself. While the rank waits a SIGINT is only noted: one that
came before the rank had armed for the request it was meant for (the notebook sends the
request, then the signal, and the rank may not have read the request yet) still stops that
request's cell at once (``arm``); a late one, meant for a request already answered, does not
stop the next.
"""

from __future__ import annotations

import ast
import ctypes
import linecache
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ddp_lab.runtime import _pickle, _trace
from ddp_lab.runtime._rank import CELL_NAMES, error_record, release_kept_groups
from ddp_lab.runtime._zygote import read_msg, write_msg

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None)
except OSError:
    _LIBC = None


@dataclass
class LoopJob:
    """The job each persistent rank runs (pickled by reference: this module is importable)."""

    socket_path: str
    nprocs: int
    backend: str

    def __call__(self, rank: int) -> None:
        serve(rank, self.socket_path, self.nprocs, self.backend)


INTERRUPTED = "interrupted"  # in the group's folder: the number of the request interrupted
_NOTED: list[int] = []  # SIGINTs that came while no user code ran


def _note_sigint(signum: int, frame: Any) -> None:
    _NOTED.append(signum)


def _ignore_sigint() -> None:
    """SIGINT noted, not raised, from now on (``arm`` decides what a noted one meant)."""
    # signal.signal() first runs pending handlers, so a late SIGINT may raise right here.
    while True:
        try:
            signal.signal(signal.SIGINT, _note_sigint)
            return
        except KeyboardInterrupt:
            continue


def note_interrupt(folder: str, seq: int) -> None:
    """The notebook's side, before it sends SIGINT: which request it interrupts."""
    tmp = os.path.join(folder, f"{INTERRUPTED}.tmp")
    with open(tmp, "w") as f:
        f.write(str(seq))
    os.replace(tmp, os.path.join(folder, INTERRUPTED))


def _interrupted(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, INTERRUPTED)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def arm(folder: str, seq: int | None) -> None:
    """SIGINT raises KeyboardInterrupt from here on; raise it now if one already came for
    request ``seq`` while the rank was not yet armed (it was only noted then).

    Why: the notebook writes a request, then sends SIGINT through the zygote; a rank not yet
    scheduled reads the request after the signal came. Ignored then, the interrupt was lost:
    the cell ran on, the rank "did not stop", and the group was restarted with its state
    lost (an interrupt 1 ms after a cell started, one time in five). A noted SIGINT is this
    request's if the notebook wrote this request's number before it signalled; one meant for
    an earlier request (its reply was on its way) is dropped. The handler goes first, so a
    SIGINT that comes during the check raises by itself."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    noted = bool(_NOTED)
    _NOTED.clear()
    if noted and seq is not None and _interrupted(folder) == seq:
        raise KeyboardInterrupt


def portable(value: Any) -> Any:
    """A copy of ``value`` that can cross to the notebook: tensors detached and on CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()  # autograd graphs cannot cross processes; a plain copy can
        return value if value.device.type == "cpu" else value.cpu()
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(portable(v) for v in value)
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    return value


def _from_notebook(ns: dict, name: str) -> bool:
    """Whether ``ns[name]`` is still the copy of a notebook value (not reassigned on the rank)."""
    shipped = ns["__shipped__"]
    return name in shipped and ns.get(name) is shipped[name]


def _exec_cell(msg: dict, ns: dict) -> None:
    for name, blob in msg.get("names", {}).items():
        # What the ranks made themselves wins; a notebook copy is refreshed (the learner
        # may have fixed the function in the notebook since).
        if name not in ns or _from_notebook(ns, name):
            ns[name] = ns["__shipped__"][name] = cloudpickle.loads(blob)
    tree = ast.parse(msg["source"], msg["filename"])
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, msg["filename"], "exec"), ns)  # noqa: S102
    if last is not None:
        value = eval(compile(last, msg["filename"], "eval"), ns)  # noqa: S307
        if value is not None:
            print(repr(value))  # like the value a notebook shows under a cell


def _start_trace(trace: dict | None, rank: int) -> tuple[_trace.Profiled | None, str | None]:
    """Start this cell's profiler (SIGINT only noted): (the running profiler, or why not)."""
    if trace is None:
        return None, None
    profiled = _trace.Profiled(rank, trace["folder"], key=trace["key"], count=trace["count"])
    try:
        profiled.__enter__()
    except Exception as exc:  # noqa: BLE001  # the cell still runs, untraced
        return None, f"{type(exc).__name__}: {exc}"
    return profiled, None


def _stop_trace(profiled: _trace.Profiled | None) -> str | None:
    """Stop the cell's profiler and export its trace; why not, if that failed."""
    if profiled is None:
        return None
    try:
        profiled.__exit__(None, None, None)
    except Exception as exc:  # noqa: BLE001  # reported by the notebook, the rank goes on
        return f"{type(exc).__name__}: {exc}"
    return None


def _handle(msg: dict, ns: dict, rank: int = 0, folder: str = "") -> dict:
    """Run one request with SIGINT armed; return the reply.

    A traced cell (``msg["trace"]``) runs under ``torch.profiler``, started before SIGINT is
    armed and stopped after it is only noted again: an interrupt stops the cell, never the
    profiler's start or stop, so no profiler stays on in a rank that lives on.
    """
    release_kept_groups()  # a cell destroyed them; their workers have been idle since
    linecache.cache.update(msg.get("linecache", {}))
    CELL_NAMES.update(msg.get("cell_names", {}))
    # The request's number comes back with its reply: the notebook takes no other request's
    # reply for it (_rank_group._wait).
    reply: dict[str, Any] = {"op": "reply", "status": "ok", "seq": msg.get("seq")}
    profiled, trace_error = _start_trace(msg.get("trace"), rank)
    try:
        arm(folder, msg.get("seq"))
        if msg["op"] == "exec":
            _exec_cell(msg, ns)
        elif msg["op"] == "pull":
            value = eval(compile(msg["expr"], "<pull>", "eval"), ns)  # noqa: S307
            reply["value"] = _pickle.dumps(portable(value))
        elif msg["op"] == "push":
            values = cloudpickle.loads(msg["values"])
            ns.update(values)
            for name in values:  # pushed on purpose: the ranks own them now
                ns["__shipped__"].pop(name, None)
    except BaseException as exc:  # noqa: BLE001  # KeyboardInterrupt and SystemExit too
        error = error_record(exc, __file__)
        reply = {"op": "reply", "status": "error", "error": error, "seq": msg.get("seq")}
    finally:
        _ignore_sigint()
    trace_error = trace_error or _stop_trace(profiled)
    if trace_error is not None:
        reply["trace_error"] = trace_error
    sys.stdout.flush()
    sys.stderr.flush()
    if _LIBC is not None:
        _LIBC.fflush(None)  # C-level prints of this cell land before the reply
    # Names the notebook need not send again: the ranks' own ones.
    reply["names"] = sorted(k for k in ns if not k.startswith("__") and not _from_notebook(ns, k))
    return reply


def serve(rank: int, socket_path: str, nprocs: int, backend: str) -> None:
    """Connect to the notebook, join the process group, and serve requests until 'exit'."""
    import torch
    import torch.distributed as dist

    from ddp_lab.runtime._rank import init_group

    _ignore_sigint()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    fd = sock.fileno()
    write_msg(fd, {"op": "hello", "rank": rank, "pid": os.getpid()})
    device = init_group(rank, nprocs, backend)
    ns: dict[str, Any] = {"__name__": "__main__", "__shipped__": {}, "torch": torch, "dist": dist}
    ns.update(rank=rank, world_size=nprocs, device=device)
    write_msg(fd, {"op": "ready", "rank": rank, "device": str(device)})
    while True:
        msg = read_msg(fd)
        if msg is None or msg.get("op") == "exit":  # EOF: the notebook is gone
            break
        write_msg(fd, _handle(msg, ns, rank, os.path.dirname(socket_path)))
    sock.close()
