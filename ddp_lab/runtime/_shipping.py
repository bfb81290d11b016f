"""Shipping a job to the zygote: the parent's handle on it and what a launch sends.

``_Zygote`` starts the fork server (``runtime/_zygote.py``) and talks to it over its pipes;
``FunctionJob`` is what each rank calls (``fn(rank, *args)``, the process group first if
asked); ``dumps_job``/``dumps_named`` pickle with cloudpickle and name what cannot travel;
the notebook's cell sources and names go along so that rank tracebacks show the cell's code.
``runtime/launcher.py`` re-exports them.
"""

from __future__ import annotations

import inspect
import linecache
import os
import select
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ddp_lab.i18n import _t
from ddp_lab.runtime import _pickle, _trace
from ddp_lab.runtime._zygote import read_msg, write_msg

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


def _env_key() -> tuple:
    return tuple(os.environ.get(k) for k in IMPORT_TIME_ENV) + (sys.executable,)


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
        # The folder that holds the ddp_lab package (this file is ddp_lab/runtime/_shipping.py).
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
