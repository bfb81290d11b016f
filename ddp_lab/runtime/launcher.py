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
"""

from __future__ import annotations

import atexit
import inspect
import linecache
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from ddp_lab.i18n import _t, _tp
from ddp_lab.runtime import _calls, _hang, _pickle, _trace, device
from ddp_lab.runtime._hang import RanksInterrupted, format_stack
from ddp_lab.runtime._zygote import read_msg, write_msg

BACKENDS = ("gloo", "nccl", "mpi", "auto")
DEFAULT_TIMEOUT = float(os.environ.get("DDP_LAB_TIMEOUT", "120"))
# Environment variables that torch reads when it is imported: a zygote started under
# other values would silently ignore the new ones, so it is restarted instead.
IMPORT_TIME_ENV = (
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
)
_GRACE_S = 1.0  # between SIGTERM and SIGKILL


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


@dataclass
class RankFailure:
    """Why one rank failed: an exception, an exit code, a signal or a timeout."""

    rank: int
    reason: str
    traceback: str = ""
    exception: BaseException | None = None
    stack: str = ""
    call: str = ""  # a hung rank's torch.distributed call (``_calls.describe``)


class DistributedError(RuntimeError):
    """One or more ranks failed; ``failures`` lists them, the first to fail first."""

    def __init__(
        self,
        summary: str,
        failures: list[RankFailure] | None = None,
        outputs: dict[int, tuple[str, str]] | None = None,
        cells: dict[str, int | None] | None = None,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.failures = failures or []
        self.outputs = outputs or {}
        self.cells = cells if cells is not None else _hang.cell_numbers()

    def __str__(self) -> str:
        parts = [self.summary]
        for f in self.failures:
            if f.call:
                parts.append(f"  - {f.call}")
            elif not f.stack:  # a stack's header says the same
                parts.append(f"  - {f.reason}")
        for f in self.failures:
            if f.traceback:
                parts.append(
                    "\n--- "
                    + _t("traceback of rank {rank}", rank=f.rank)
                    + f" ---\n{f.traceback.rstrip()}"
                )
            if f.stack:
                stack = format_stack(f.stack, self.cells).rstrip()
                parts.append(
                    "\n--- "
                    + _t("where rank {rank} was stuck (Python stack)", rank=f.rank)
                    + f" ---\n{stack}"
                )
        return "\n".join(parts)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own (unhelpful) frames.
        return [f"{type(self).__name__}: {self}"]

    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.failures]


class DistributedTimeoutError(DistributedError, TimeoutError):
    """The launch ran past its timeout; ``failures`` hold each running rank's stack."""


class DistributedDeadlockError(DistributedTimeoutError):
    """Every running rank waited in communication at the same place, moving no data and using
    almost no CPU, for a few seconds (``_hang.DeadlockWatch``): stopped before the timeout, with each rank's stack."""


class FunctionJob:
    """Calls ``fn(rank, *args)``, after initialising the process group if asked to.

    ``trace_dir``: run ``fn`` under ``torch.profiler`` and export the rank's trace there.
    """

    def __init__(
        self,
        fn: Callable,
        args: tuple,
        nprocs: int,
        backend: str | None,
        trace_dir: str | None = None,
    ) -> None:
        self.fn, self.args, self.nprocs, self.backend = fn, args, nprocs, backend
        self.trace_dir = trace_dir

    def __call__(self, rank: int) -> Any:
        if self.backend:
            from ddp_lab.runtime._rank import init_group

            init_group(rank, self.nprocs, self.backend)
        if self.trace_dir is None:
            return self.fn(rank, *self.args)
        with _trace.Profiled(rank, self.trace_dir):
            return self.fn(rank, *self.args)


class _Zygote:
    """The parent's handle on the zygote process."""

    def __init__(self, eager: bool = False) -> None:
        """``eager``: preload DDP's modules before "ready" (see ``_zygote``), not after."""
        env = dict(os.environ)
        # The folder that holds the ddp_lab package (this file is ddp_lab/runtime/launcher.py).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.env_key = _env_key()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from ddp_lab.runtime._zygote import main; main({eager})"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            # Its own process group: Jupyter signals the kernel's group on interrupt and, at
            # shutdown, SIGTERMs the children in it and waits for them to vanish; the zygote
            # would linger as an unreaped zombie until the kernel is killed, before its atexit
            # clean-up could run. Parent-death signals still end it with the kernel.
            start_new_session=True,
        )
        self.in_fd = self.proc.stdin.fileno()
        self.out_fd = self.proc.stdout.fileno()
        self.ready = False

    def wait_ready(self, timeout: float = 300.0) -> None:
        if not self.ready:
            msg = self.recv(timeout)
            if not msg or msg.get("op") != "ready":
                raise RuntimeError(
                    _t(
                        "The launcher's helper process died unexpectedly; it will be restarted "
                        "on the next call."
                    )
                )
            self.ready = True

    def send(self, msg: dict) -> None:
        write_msg(self.in_fd, msg)

    def recv(self, timeout: float) -> dict | None:
        """Next message, ``None`` after ``timeout`` seconds; raises if the zygote died."""
        ready, _, _ = select.select([self.out_fd], [], [], max(0.0, timeout))
        if not ready:
            return None
        msg = read_msg(self.out_fd)
        if msg is None:
            raise RuntimeError(
                _t(
                    "The launcher's helper process died unexpectedly; it will be restarted "
                    "on the next call."
                )
            )
        return msg

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()  # EOF: the zygote kills any ranks and exits
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f and not f.closed:
                f.close()


_zygote: _Zygote | None = None
_lock = threading.Lock()


def _env_key() -> tuple:
    return tuple(os.environ.get(k) for k in IMPORT_TIME_ENV) + (sys.executable,)


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


def _explain_pickle_error(fn: Callable, args: tuple, error: Exception) -> str:
    """Find which captured name or argument cannot be pickled, for the error message."""
    candidates: list[tuple[str, Any]] = []
    for i, a in enumerate(args):
        candidates.append((_t("argument {index} of args", index=i), a))
    try:
        cv = inspect.getclosurevars(fn)
        for name, value in {**cv.globals, **cv.nonlocals}.items():
            candidates.append((_t("the name {name!r}", name=name), value))
    except TypeError:
        pass
    for what, value in candidates:
        try:
            _pickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            return _t(
                "Cannot send {what} to the child processes: {error}. Every rank is a "
                "separate process, so what the function uses must be picklable. Create "
                "it inside the function instead.",
                what=what,
                error=f"{type(exc).__name__}: {exc}",
            )
    name = getattr(fn, "__qualname__", repr(fn))
    return _t(
        "Cannot send {what} to the child processes: {error}. Every rank is a "
        "separate process, so what the function uses must be picklable. Create "
        "it inside the function instead.",
        what=_t("the function {name!r}", name=name),
        error=f"{type(error).__name__}: {error}",
    )


def dumps_job(job: Any, fn: Callable, args: tuple) -> bytes:
    """Pickle a job, or raise a ValueError that names what cannot be pickled."""
    try:
        return _pickle.dumps(job)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(_explain_pickle_error(fn, args, exc)) from None


def dumps_named(name: str, value: Any) -> bytes:
    """Pickle a notebook value that a cell sends to the ranks, or say which name cannot go."""
    try:
        return _pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
        raise ValueError(
            _t(
                "Cannot send {what} to the child processes: {error}. Every rank is a "
                "separate process, so what the function uses must be picklable. Create "
                "it inside the function instead.",
                what=_t("the name {name!r}", name=name),
                error=error,
            )
        ) from None


def _notebook_linecache() -> dict:
    # Cell sources, so that tracebacks inside ranks show the notebook's code lines.
    return {
        k: v
        for k, v in linecache.cache.items()
        if (k.startswith("<ipython-input") or "ipykernel_" in k) and len(v) == 4
    }


def cell_names() -> dict[str, str]:
    """How ranks name each notebook cell's file: {"/tmp/ipykernel_1/ab.py": "Cell, line {line}"}.

    A cell's file name changes with every kernel, and IPython's "Cell In[N]" with every
    run of the cell (and is In[1] for every cell under nbval, which runs cells without
    history); so the ranks say "Cell, line L" in warnings and tracebacks (the source line
    and function name come with it), and a notebook's rank output is the same after a
    restart and under nbval. ``{line}`` is left for the rank to fill in.
    """
    place = _t("Cell, line {line}", line="{line}")
    return dict.fromkeys(_notebook_linecache(), place)


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
    folder = tempfile.mkdtemp(prefix="ddp_lab_trace_")
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
        shutil.rmtree(folder, ignore_errors=True)


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


class _Output:
    """Reads the ranks' capture files and prints them with ``[rank N]`` prefixes."""

    def __init__(self, workdir: str, nprocs: int, quiet: bool = False) -> None:
        self.workdir, self.nprocs, self.quiet = workdir, nprocs, quiet
        self.offsets = {(r, s): 0 for r in range(nprocs) for s in ("out", "err")}
        self.partial = {key: "" for key in self.offsets}

    def _read_new(self, rank: int, stream: str) -> str:
        path = os.path.join(self.workdir, f"{rank}.{stream}")
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[rank, stream])
                data = f.read()
        except FileNotFoundError:
            return ""
        self.offsets[rank, stream] += len(data)
        return data.decode("utf-8", errors="backslashreplace")

    def _emit(self, rank: int, stream: str, final: bool) -> None:
        text = self.partial[rank, stream] + self._read_new(rank, stream)
        lines = text.split("\n")
        self.partial[rank, stream] = "" if final else lines.pop()
        if final and lines and lines[-1] == "":
            lines.pop()
        out = sys.stdout if stream == "out" else sys.stderr
        if lines and not self.quiet:
            out.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            out.flush()

    def stream_new(self) -> None:
        for r in range(self.nprocs):
            for s in ("out", "err"):
                self._emit(r, s, final=False)

    def finish(self) -> None:
        for s in ("out", "err"):
            for r in range(self.nprocs):
                self._emit(r, s, final=True)

    def text(self, rank: int) -> tuple[str, str]:
        result = []
        for s in ("out", "err"):
            try:
                with open(
                    os.path.join(self.workdir, f"{rank}.{s}"),
                    encoding="utf-8",
                    errors="backslashreplace",
                ) as f:
                    result.append(f.read())
            except FileNotFoundError:
                result.append("")
        return result[0], result[1]


def _describe_status(rank: int, status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return _t("rank {rank} was killed by signal {signal}", rank=rank, signal=name)
    return _t(
        "rank {rank} exited with code {code} without raising an exception (os._exit or sys.exit?)",
        rank=rank,
        code=os.WEXITSTATUS(status),
    )


def failure_from_error(rank: int, info: dict) -> RankFailure:
    """A rank's error record (type, message, traceback, pickled exception) -> RankFailure."""
    exc = None
    if info.get("exc"):
        try:
            exc = cloudpickle.loads(info["exc"])
        except Exception:  # noqa: BLE001  # e.g. a class only the ranks know
            exc = None
    error = f"{info['type']}: {info['message']}" if info["message"] else info["type"]
    return RankFailure(
        rank,
        _tp("rank_raised", "rank {rank} raised {error}", rank=rank, error=error),
        info["traceback"],
        exc,
    )


def print_stacks(ranks: list[int], stacks: dict[int, str]) -> None:
    """Print where each stuck rank is, under a header per rank (ranks without a stack skipped)."""
    cells = _hang.cell_numbers()
    for r in ranks:
        if stacks.get(r):
            sys.stderr.write(
                "--- "
                + _t("where rank {rank} was stuck (Python stack)", rank=r)
                + f" ---\n{format_stack(stacks[r], cells)}"
            )


def _read_result(workdir: str, rank: int) -> tuple[str, Any] | None:
    try:
        with open(os.path.join(workdir, f"{rank}.result"), "rb") as f:
            return cloudpickle.loads(f.read())
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001  # e.g. a class the parent cannot import
        return (
            "error",
            {"type": type(exc).__name__, "message": str(exc), "traceback": "", "exc": None},
        )


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
        workdir = tempfile.mkdtemp(prefix="ddp_lab_")
        try:
            return _supervise(
                zygote, payload, nprocs, limit, stream and not quiet, workdir, quiet, watch
            )
        except BaseException:
            if not zygote.alive():
                shutdown_unlocked()
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def shutdown_unlocked() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


def launch_message(payload: bytes, nprocs: int, workdir: str, port: int | None = None) -> dict:
    """The zygote's 'launch' request: the job, where output goes, and the parent's context."""
    return {
        "op": "launch",
        "nprocs": nprocs,
        "payload": payload,
        "workdir": workdir,
        "port": port or free_port(),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "sys_path": list(sys.path),
        "argv": list(sys.argv[:1]),
        "linecache": _notebook_linecache(),
        "cell_names": cell_names(),
    }


def _supervise(
    zygote: _Zygote,
    payload: bytes,
    nprocs: int,
    limit: float,
    stream: bool,
    workdir: str,
    quiet: bool,
    watch: bool = False,
) -> list[Any]:
    zygote.send(launch_message(payload, nprocs, workdir))
    output = _Output(workdir, nprocs, quiet)
    statuses: dict[int, int] = {}
    exit_order: list[int] = []
    stopping: set[int] = set()  # ranks the launcher itself is stopping
    started = time.monotonic()
    kill_at: float | None = None
    timed_out = False
    stacks: dict[int, str] = {}
    calls: dict[int, str] = {}  # each hung rank's torch.distributed call, read before the stop
    reader = _hang.StackReader(workdir, zygote.send)
    watcher: _hang.DeadlockWatch | None = None
    deadlock = 0.0  # seconds every rank waited, when a deadlock stopped them
    try:
        while True:
            msg = zygote.recv(0.05 if stream or kill_at else 0.2)
            now = time.monotonic()
            if msg is not None:
                if msg["op"] == "done":
                    break
                if msg["op"] == "started" and watch:
                    watcher = _hang.DeadlockWatch(dict(msg["pids"]), reader)
                if msg["op"] == "exit":
                    rank, status = msg["rank"], msg["status"]
                    statuses[rank] = status
                    exit_order.append(rank)
                    if status != 0 and kill_at is None:
                        # One rank failed: the others would wait forever in collectives.
                        stopping = set(range(nprocs)) - set(statuses)
                        zygote.send({"op": "signal", "sig": signal.SIGTERM})
                        kill_at = now + _GRACE_S
            if stream:
                output.stream_new()
            live = [r for r in range(nprocs) if r not in statuses]
            if kill_at is None and watcher is not None and watcher.check(live, now):
                timed_out, deadlock = True, watcher.seconds
                stopping, stacks = set(live), watcher.stacks
                calls = _calls.report(workdir, sorted(stopping))
                zygote.send({"op": "signal", "sig": signal.SIGTERM})
                kill_at = time.monotonic() + _GRACE_S
            elif kill_at is None and now - started > limit:
                timed_out = True
                stopping = set(range(nprocs)) - set(statuses)
                stacks = reader.request(sorted(stopping))
                calls = _calls.report(workdir, sorted(stopping))
                zygote.send({"op": "signal", "sig": signal.SIGTERM})
                kill_at = time.monotonic() + _GRACE_S
            elif kill_at is not None and now > kill_at:
                zygote.send({"op": "signal", "sig": signal.SIGKILL})
                kill_at = float("inf")
    except KeyboardInterrupt:
        _stop_all(zygote)
        output.finish()
        raise RanksInterrupted() from None
    output.finish()
    return _collect(
        workdir,
        nprocs,
        statuses,
        exit_order,
        stopping,
        timed_out,
        limit,
        stacks,
        output,
        deadlock,
        calls,
    )


def _stop_all(zygote: _Zygote) -> None:
    """SIGTERM every rank, SIGKILL after a grace period, and wait for the zygote's 'done'."""
    zygote.send({"op": "signal", "sig": signal.SIGTERM})
    deadline = time.monotonic() + _GRACE_S
    killed = False
    while True:
        try:
            msg = zygote.recv(0.05)
        except KeyboardInterrupt:
            msg = None
        if msg is not None and msg.get("op") == "done":
            return
        if not killed and time.monotonic() > deadline:
            zygote.send({"op": "signal", "sig": signal.SIGKILL})
            killed = True


def _dump_stacks(zygote: _Zygote, workdir: str, ranks: set[int]) -> dict[int, str]:
    """Ask hung ranks for their Python stacks (faulthandler on SIGUSR1) and read them."""
    return _hang.StackReader(workdir, zygote.send).request(sorted(ranks))


def _collect(
    workdir: str,
    nprocs: int,
    statuses: dict[int, int],
    exit_order: list[int],
    stopping: set[int],
    timed_out: bool,
    limit: float,
    stacks: dict[int, str],
    output: _Output,
    deadlock: float = 0.0,
    calls: dict[int, str] | None = None,
) -> list[Any]:
    results: list[Any] = [None] * nprocs
    failures: list[RankFailure] = []
    for rank in exit_order:
        record = _read_result(workdir, rank)
        if record is not None and record[0] == "ok" and statuses[rank] == 0:
            results[rank] = record[1]
        elif record is not None and record[0] == "error":
            failures.append(failure_from_error(rank, record[1]))
        elif rank not in stopping or timed_out:
            if not (timed_out and rank in stopping):
                failures.append(RankFailure(rank, _describe_status(rank, statuses[rank])))
    outputs = {r: output.text(r) for r in range(nprocs)}
    if timed_out:
        # The stacks go in the exception only: IPython shows it once, readably.
        ranks = sorted(stopping)
        hung = [
            RankFailure(
                r,
                _t("where rank {rank} was stuck (Python stack)", rank=r),
                stack=stacks.get(r, ""),
                call=(calls or {}).get(r, ""),
            )
            for r in ranks
        ]
        names = ", ".join(map(str, ranks))
        error = DistributedDeadlockError if deadlock else DistributedTimeoutError
        summary = (
            _t(
                "Deadlock: for {seconds:.0f} s every running rank ({ranks}) has been "
                "waiting in communication at the same place, moving no data and using "
                "almost no CPU; they were "
                "stopped. Usually the ranks wait for each other (e.g. every rank in a "
                "blocking recv, or in send with no receiver yet) or call different "
                "collectives. Where each rank waited:",
                seconds=deadlock,
                ranks=names,
            )
            if deadlock
            else _t(
                "Timed out after {timeout:g} s: ranks {ranks} were still running and "
                "were stopped. A hang usually means the ranks called different "
                "collectives, or one rank skipped one. Pass timeout=... (or %%ddp "
                "--timeout S) if the work is just slow.",
                timeout=limit,
                ranks=names,
            )
        )
        raise error(summary, [f for f in failures if f.rank not in stopping] + hung, outputs)
    if failures:
        own = [f for f in failures if f.rank not in stopping] or failures
        summary = _t(
            "{count} of {nprocs} ranks failed; the first to fail was rank {first}.",
            count=len(own),
            nprocs=nprocs,
            first=own[0].rank,
        )
        stopped = sorted(stopping - {f.rank for f in own})
        if stopped:
            summary += "\n" + _t(
                "ranks stopped by the launcher after the failure: {ranks}",
                ranks=", ".join(map(str, stopped)),
            )
        raise DistributedError(summary, own, outputs)
    return results
