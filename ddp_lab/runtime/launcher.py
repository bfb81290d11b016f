"""``spawn``: a notebook-safe, fast drop-in for ``torch.multiprocessing.spawn``.

How it differs from ``mp.spawn``:
- the function and its arguments travel with cloudpickle, so functions, lambdas and
  classes defined in notebook cells work (``mp.spawn`` pickles them by name and the
  children cannot find ``__main__.fn``);
- ranks are forked from a zygote that has already imported torch (fast, CUDA-safe);
- each rank's stdout/stderr is captured at the fd level and printed in rank order with
  a ``[rank N]`` prefix, so a cell's output is the same on every run;
- a failure on one rank stops the others and raises one ``DistributedError``; a timeout
  says where each rank is stuck, a deadlock is found before the timeout (``_hang``); an
  interrupt stops every rank.

The pieces live apart: ``_shipping`` (the zygote's handle, the job, pickling),
``_supervise`` (following the ranks to the end) and ``_failures`` (the errors raised); this
module is the entry point (``spawn``, the checks of its arguments, the zygote's life, the
launch request) and re-exports their names, so ``launcher.X`` keeps working.
"""

from __future__ import annotations

import atexit
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp_lab.i18n import _t
from ddp_lab.runtime import _trace, _workdirs, device
from ddp_lab.runtime._failures import (
    DistributedDeadlockError,
    DistributedError,
    DistributedTimeoutError,
    RankFailure,
    _describe_status,
    failure_from_error,
    print_stacks,
)
from ddp_lab.runtime._shipping import (
    IMPORT_TIME_ENV,
    FunctionJob,
    _env_key,
    _explain_pickle_error,
    _notebook_linecache,
    _Zygote,
    cell_names,
    dumps_job,
    dumps_named,
)
from ddp_lab.runtime._supervise import (
    _GRACE_S,
    _collect,
    _dump_stacks,
    _Output,
    _read_result,
    _stop_all,
    _supervise,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT",
    "IMPORT_TIME_ENV",
    "DistributedDeadlockError",
    "DistributedError",
    "DistributedTimeoutError",
    "FunctionJob",
    "RankFailure",
    "cell_names",
    "check_nprocs",
    "cuda_device_count",
    "dumps_job",
    "dumps_named",
    "failure_from_error",
    "free_port",
    "launch_message",
    "max_nprocs",
    "prestart",
    "print_stacks",
    "resolve_backend",
    "run_payload",
    "set_timeout",
    "shutdown",
    "shutdown_unlocked",
    "spawn",
    "traced",
    "wait_warm",
    # the internals other runtime modules and tests reach through the launcher
    "_GRACE_S",
    "_Output",
    "_Zygote",
    "_collect",
    "_describe_status",
    "_dump_stacks",
    "_env_key",
    "_explain_pickle_error",
    "_notebook_linecache",
    "_read_result",
    "_stop_all",
    "_supervise",
]

BACKENDS = ("gloo", "nccl", "mpi", "auto")
DEFAULT_TIMEOUT = float(os.environ.get("DDP_LAB_TIMEOUT", "120"))


def max_nprocs() -> int:
    """The largest nprocs accepted on this machine."""
    return max(16, 4 * (os.cpu_count() or 1))


def set_timeout(seconds: float | None) -> None:
    """Set the default timeout of ``spawn`` and ``%%ddp`` (None: wait forever)."""
    global DEFAULT_TIMEOUT
    DEFAULT_TIMEOUT = _check_timeout(seconds)


def _check_timeout(value: Any) -> float:
    if value is None:
        return float("inf")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            _t("timeout must be a positive number of seconds or None, got {value!r}.", value=value)
        )
    return float(value)


_zygote: _Zygote | None = None
_lock = threading.Lock()


def _get_zygote() -> _Zygote:
    global _zygote
    if _zygote is not None and (not _zygote.alive() or _zygote.env_key != _env_key()):
        _zygote.close()
        _zygote = None
    if _zygote is None:
        _zygote = _Zygote()
    return _zygote


def prestart() -> None:
    """Start the zygote in the background so that the first launch is fast too."""
    with _lock:
        _get_zygote()


def wait_warm(timeout: float = 300.0) -> bool:
    """Wait until the zygote has preloaded DDP's modules (its successor took over).

    Launches work before that too (the ranks then import those modules themselves); this is
    for benchmarks and tests that want the warm state. False if it did not happen in time.
    """
    deadline = time.monotonic() + timeout
    with _lock:
        zygote = _get_zygote()
        zygote.wait_ready()
        while True:
            zygote.send({"op": "ping"})
            pong = zygote.recv(max(0.0, deadline - time.monotonic()))
            if pong is None:
                return False
            if pong.get("pid") != zygote.proc.pid:  # answered by the successor
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def shutdown() -> None:
    """Stop the zygote (the next launch starts a new one)."""
    global _zygote
    with _lock:
        if _zygote is not None:
            _zygote.close()
            _zygote = None


atexit.register(shutdown)


def _ephemeral_range() -> tuple[int, int]:
    """The ports Linux hands to ``bind(0)`` and to outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port that is free right now on localhost, drawn at random (never fixed).

    The port is free when we look, and rank 0 binds it a moment later. A port from ``bind(0)``
    comes from the ephemeral range, where every outgoing connection on the machine also takes
    its local port (gloo opens one per pair of ranks): on a busy machine one of them now and then
    took the port in that moment, and rank 0 failed with EADDRINUSE. A port drawn below the
    range is never handed out that way; only a program that binds it by number could take it.
    """
    low, _ = _ephemeral_range()
    draw = random.SystemRandom()
    if low > 2048:
        for _ in range(64):
            port = draw.randrange(1024 if low <= 10000 else 10000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_device_count() -> int:
    """Number of CUDA devices, without initialising CUDA when torch has no CUDA."""
    return device.visible_gpus()


def resolve_backend(backend: str | None, nprocs: int) -> str | None:
    """Check ``backend`` for ``nprocs`` ranks on this machine; turn 'auto' into a name.

    'auto' becomes ``device.auto_backend``'s choice: ``"cpu:gloo,cuda:nccl"`` when every rank
    can have its own GPU, else ``"gloo"`` (``runtime/device.py`` holds the rule).
    """
    if backend is None:
        return None
    if backend not in BACKENDS:
        raise ValueError(
            _t(
                "Unknown backend {value!r}: choose one of {choices}.",
                value=backend,
                choices=", ".join(BACKENDS),
            )
        )
    import torch.distributed as dist

    gpus = cuda_device_count()
    if backend == "auto":
        return device.auto_backend(nprocs, gpus, dist.is_nccl_available())
    available = {
        "gloo": dist.is_gloo_available,
        "nccl": dist.is_nccl_available,
        "mpi": dist.is_mpi_available,
    }[backend]()
    if backend == "nccl":
        device.check_nccl(nprocs, gpus)
    if not available:
        raise ValueError(
            _t("The {backend} backend is not available in this PyTorch build.", backend=backend)
        )
    return backend


def check_nprocs(nprocs: Any) -> int:
    """Validate ``nprocs`` and return it as an int."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise ValueError(
            _t("nprocs must be a whole number of processes, got {value!r}.", value=nprocs)
        )
    if nprocs < 1:
        raise ValueError(_t("nprocs must be at least 1, got {value}.", value=nprocs))
    if nprocs > max_nprocs():
        raise ValueError(
            _t(
                "nprocs={value} is too many for this machine ({cpus} CPU cores): the "
                "limit is {limit}. Each rank is a full Python process; try 2 or 4.",
                value=nprocs,
                cpus=os.cpu_count(),
                limit=max_nprocs(),
            )
        )
    return nprocs


def spawn(
    fn: Callable,
    args: tuple = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str | None = None,
    *,
    backend: str | None = None,
    timeout: float | None = -1,
    stream: bool = False,
    quiet: bool = False,
    trace: str | os.PathLike | None = None,
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``nprocs`` processes and return their results in rank order.

    Call-compatible with ``torch.multiprocessing.spawn`` (``join``, ``daemon`` and
    ``start_method`` are accepted and ignored: ranks are always joined and always forked
    from the zygote).

    Args:
        backend: if given ("gloo", "nccl", "mpi" or "auto"), the default process group is
            initialised before ``fn`` is called; otherwise ``fn`` does it, as in tutorials.
        timeout: seconds before the ranks are stopped and their stacks shown; -1 means the
            global default (``set_timeout``), and then a deadlock (every rank waiting in
            communication, see ``_hang``) is reported after a few seconds already; None
            means no limit.
        stream: print output lines as they come instead of in rank order at the end.
        quiet: print nothing; the output is still attached to a ``DistributedError``.
        trace: a file name ("run.json"): every rank runs ``fn`` under ``torch.profiler``
            and the launcher writes one Chrome trace of all ranks there (also when a rank
            fails: what the ranks that finished recorded); ``dl.timeline`` draws it.
    """
    if not callable(fn):
        raise TypeError(
            _t(
                "The first argument must be a function to run on every rank, got {value!r}.",
                value=fn,
            )
        )
    if not join:
        raise ValueError(
            _t("ddp_lab.spawn always waits for the ranks (join=True); join=False is not supported.")
        )
    nprocs = check_nprocs(nprocs)
    limit = DEFAULT_TIMEOUT if timeout == -1 else _check_timeout(timeout)
    backend = resolve_backend(backend, nprocs)
    args = tuple(args)
    if trace is None:
        payload = dumps_job(FunctionJob(fn, args, nprocs, backend), fn, args)
        return run_payload(payload, nprocs, limit, stream, quiet, watch=timeout == -1)
    target = _trace.check_target(trace)
    folder = _workdirs.make("trace_")
    try:
        payload = dumps_job(FunctionJob(fn, args, nprocs, backend, folder), fn, args)
        return traced(
            folder,
            nprocs,
            target,
            run_payload,
            payload,
            nprocs,
            limit,
            stream,
            quiet,
            watch=timeout == -1,
        )
    finally:
        _workdirs.remove(folder)


def traced(folder: str, nprocs: int, target: str, run: Callable, *args: Any, **kw: Any) -> Any:
    """``run(*args, **kw)``, then merge the ranks' traces from ``folder`` into ``target``.

    The trace is merged after a failure too (the exception goes on); a launch whose ranks
    wrote no trace at all leaves ``target`` as it was.
    """
    try:
        result = run(*args, **kw)
    except BaseException:
        try:
            _trace.collect(folder, nprocs, target)
        except Exception:  # noqa: BLE001, S110  # the launch's own error matters more
            pass
        raise
    if not _trace.collect(folder, nprocs, target):
        raise RuntimeError(_t("No rank wrote a trace; {path} was not written.", path=target))
    return result


def run_payload(
    payload: bytes,
    nprocs: int,
    limit: float,
    stream: bool = False,
    quiet: bool = False,
    watch: bool = False,
) -> list[Any]:
    """Launch ``nprocs`` ranks of a pickled job and supervise them to the end.

    ``watch``: also stop the ranks at a deadlock, before ``limit`` (``_hang.DeadlockWatch``).
    """
    with _lock:
        zygote = _get_zygote()
        zygote.wait_ready()
        workdir = _workdirs.make()  # named after this process, removed if it is killed
        try:
            return _supervise(
                zygote,
                launch_message(payload, nprocs, workdir),
                nprocs,
                limit,
                stream and not quiet,
                workdir,
                quiet,
                watch,
            )
        except BaseException:
            if not zygote.alive():
                shutdown_unlocked()
            raise
        finally:
            _workdirs.remove(workdir)


def shutdown_unlocked() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


def launch_message(payload: bytes, nprocs: int, workdir: str, port: int | None = None) -> dict:
    """The zygote's 'launch' request: the job, where output goes, and the parent's context.

    ``port``: None (the default) lets the zygote bind a port for the launch's store and hand
    it to rank 0 (``_rank.host_store``); a number is used as MASTER_PORT as it is.
    """
    return {
        "op": "launch",
        "nprocs": nprocs,
        "payload": payload,
        "workdir": workdir,
        "port": port,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "sys_path": list(sys.path),
        "argv": list(sys.argv[:1]),
        "linecache": _notebook_linecache(),
        "cell_names": cell_names(),
    }
