"""What runs inside one rank process, right after the zygote forked it.

The rank makes itself look like a fresh process started by a launcher such as torchrun:
its own process group (so the launcher can signal it and its DataLoader workers),
stdout/stderr captured at the file-descriptor level (C++ warnings included), the
launcher's environment with RANK/WORLD_SIZE/... set, fresh random seeds, and a
``faulthandler`` hook so that a hang can be diagnosed from outside.
"""

from __future__ import annotations

import faulthandler
import functools
import io
import linecache
import os
import random
import re
import signal
import sys
import traceback
import warnings
from typing import Any

import cloudpickle

from ddp_lab.runtime import _calls, _pickle


def _open_capture(path: str, fd: int) -> io.TextIOWrapper:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, fd)
    os.close(target)
    raw = io.FileIO(fd, "w", closefd=False)
    # write_through: every print reaches the file at once, even if the rank dies by os._exit.
    return io.TextIOWrapper(
        raw, encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True
    )


# Notebook cell files -> how to name them ("Cell, line {line}"), sent with every launch.
CELL_NAMES: dict[str, str] = {}


def _format_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    label = CELL_NAMES.get(filename)
    if label is None:
        return _ORIGINAL_FORMATWARNING(message, category, filename, lineno, line)
    if line is None:
        line = linecache.getline(filename, lineno)
    text = f"{label.replace('{line}', str(lineno))}: {category.__name__}: {message}\n"
    return text + (f"  {line.strip()}\n" if line and line.strip() else "")


# A frame's place as every Python from 3.10 on prints it in a traceback.
_PLACE = re.compile(r'File "([^"\n]*)", line (\d+)')


def _name_place(match: re.Match[str]) -> str:
    label = CELL_NAMES.get(match.group(1))
    return match.group(0) if label is None else label.replace("{line}", match.group(2))


def _format_stack(self: traceback.StackSummary, *args: Any, **kwargs: Any) -> list[str]:
    # ``format``, not the per-frame ``format_frame_summary``: that one is new in 3.11 and takes
    # ``colorize=`` from 3.13 on, while ``format`` is what every version's traceback calls.
    lines = _ORIGINAL_FORMAT_STACK(self, *args, **kwargs)
    if not CELL_NAMES:
        return lines
    return [_PLACE.sub(_name_place, line) for line in lines]


_ORIGINAL_FORMATWARNING = warnings.formatwarning
_ORIGINAL_FORMAT_STACK = traceback.StackSummary.format


def use_cell_names() -> None:
    """Name notebook code by a stable place (``Cell, line 2``) in warnings and tracebacks.

    Why: the file of a cell is ``/tmp/ipykernel_<pid>/<hash>.py``, new in every kernel, so
    rank output that names it differs after each restart (and fails strict nbval). The
    patches only touch frames of notebook cells; everything else prints as before.
    """
    warnings.formatwarning = _format_warning
    traceback.StackSummary.format = _format_stack  # type: ignore[method-assign]


# Process groups that destroy_process_group() dropped, kept alive until the process ends.
KEPT_GROUPS: list[Any] = []
# The destroyed default group's store and size, for finish_together.
_DEFAULT_STORE: list[tuple[Any, int]] = []
_FINISHED_KEY = "ddp_lab_finished"
_ALL_FINISHED_KEY = "ddp_lab_all_finished"
_RELEASED_KEY = "ddp_lab_released_"  # + the rank: it has its answer, rank 0 may go
FINISH_WAIT_S = 10.0


def finish_together(rank: int, store: Any = None, world: int = 0) -> None:
    """Every rank waits (at most ``FINISH_WAIT_S``) until every rank has finished its function.

    Why rank 0: it hosts the store of an ``env://`` group (MASTER_ADDR/MASTER_PORT). A rank
    whose function returns right after ``init_process_group`` would otherwise exit, and take
    the store down, while a slower rank is still inside ``init_process_group`` using it
    ("Connection reset by peer").
    Why the others too: a rank that exits closes its gloo connections. A peer still inside
    ``init_process_group`` (or ``new_group``), in gloo's ``connectFullMesh``, then reads the
    end of the connection before it has finished connecting, and fails with "Gloo
    connectFullMesh failed with ... Connection closed by peer" (gloo/transport/tcp/pair.cc,
    ``Pair::read``; the wait in ``Pair::waitUntilConnected`` rethrows it). On a busy machine
    rank 1 of a function that does no collective after ``init_process_group`` finished before
    rank 0 had connected. A counter and a key in the store are no collective, so they cannot
    get mixed up with the program's own communication; ``store.wait`` blocks in the store's
    server instead of polling it.
    Why rank 0 leaves last: the store's server lives in rank 0. ``TCPStore.set`` only sends
    (no reply; torch/csrc/distributed/c10d/TCPStore.cpp), so a rank 0 that sets the last key
    and exits can take the server down before it has told the ranks waiting on that key: their
    ``wait`` fails, and torch's C++ prints "recvValueWithTimeout failed ... Connection reset
    by peer" with a stack into the rank's output (seen in a ``%%ddp`` cell under load). So each
    other rank says it has its answer, and rank 0 waits for all.
    Why that is a ``set``, not an ``add``: after it, the rank must expect nothing more from the
    server. The server wakes the clients waiting on a key before it answers the ``add`` that
    made the key (``LibUVStoreDaemon::add`` calls ``wakeupWaitingClients``, then
    ``parse_add_command`` writes the reply; torch/csrc/distributed/c10d/
    TCPStoreLibUvBackend.cpp), so a woken rank 0 could exit while the adder still waited for
    its reply: "recvValue failed ... Failed to recv, got 0 bytes" from ``PrefixStore::add``,
    about once in six 4-rank launches of chapter 12's ``torch_tp_and_2d`` on a busy machine.
    A ``set`` has no reply to lose, and rank 0 only wakes once the server has read it.
    ``store`` and ``world``: the default group's unless given (tests).
    """
    from datetime import timedelta

    import torch.distributed as dist

    if store is None:
        store, world = _DEFAULT_STORE[0] if _DEFAULT_STORE else (None, 0)
    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        world = dist.get_world_size()
    if store is None:
        return
    patience = timedelta(seconds=FINISH_WAIT_S)
    try:
        if store.add(_FINISHED_KEY, 1) >= world:
            store.set(_ALL_FINISHED_KEY, "1")
        else:
            store.wait([_ALL_FINISHED_KEY], patience)
        if rank != 0:
            store.set(f"{_RELEASED_KEY}{rank}", "1")
        elif world > 1:
            store.wait([f"{_RELEASED_KEY}{r}" for r in range(1, world)], patience)
    except Exception:  # noqa: BLE001, S110  # a store that is gone, or the wait ran out
        pass


def keep_process_groups() -> None:
    """Make ``destroy_process_group`` keep the group objects alive instead of freeing them.

    Why: freeing the last reference to a gloo group runs ``~ProcessGroupGloo`` with the GIL
    held, which joins its worker threads. A worker that has just finished an all-reduce
    started inside ``backward()`` still holds that work, whose saved thread-local state
    holds a Python object (``torch.autograd.graph`` stashes a contextvars context in it);
    dropping the work needs the GIL: deadlock. Seen here in a plain loop without any fork
    (init, DDP, backward, destroy, ``del ddp``: stuck within ~40 rounds), and it is what
    made preloaded (faster) ranks hang at exit. Ranks end with ``os._exit``, which frees
    the groups without running destructors; persistent ranks free them between requests
    (``release_kept_groups``), long after the workers went idle.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    original = c10d.destroy_process_group
    if getattr(original, "_ddp_lab_keeps", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        groups = list(c10d._world.pg_map) if group is None else [group]
        KEPT_GROUPS.extend(groups)
        default = c10d._world.default_pg
        if default is not None and default in groups:
            _DEFAULT_STORE[:] = [(c10d._world.pg_map[default][1], default.size())]
        original(group)

    destroy_process_group._ddp_lab_keeps = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def release_kept_groups() -> None:
    """Free the groups kept by ``keep_process_groups`` (call when no collective just ended)."""
    KEPT_GROUPS.clear()


def _setup_process(rank: int, msg: dict, close_fds: tuple[int, ...]) -> None:
    from ddp_lab.runtime._process import set_parent_death_signal

    os.setpgid(0, 0)
    set_parent_death_signal(signal.SIGKILL, parent=msg.get("zygote"))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in close_fds:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    workdir = msg["workdir"]
    sys.stdout = _open_capture(os.path.join(workdir, f"{rank}.out"), 1)
    sys.stderr = _open_capture(os.path.join(workdir, f"{rank}.err"), 2)
    sys.stdin = open(os.devnull)  # noqa: SIM115
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # SIGUSR1 kills a process without a handler: the launcher signals a rank only once its
    # "<rank>.stack" exists, so the file gets that name after the handler is registered.
    stack_path = os.path.join(workdir, f"{rank}.stack")
    stack = open(stack_path + ".new", "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    os.rename(stack_path + ".new", stack_path)
    _setup_process.stack_file = stack  # type: ignore[attr-defined]  # keep the fd open

    os.environ.clear()
    os.environ.update(msg["env"])
    nprocs = msg["nprocs"]
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(msg["port"]),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK="0",
    )
    sys.path[:] = msg["sys_path"]
    sys.argv[:] = msg.get("argv", [""])
    os.chdir(msg["cwd"])
    linecache.cache.update(msg.get("linecache", {}))
    CELL_NAMES.update(msg.get("cell_names", {}))
    use_cell_names()

    # A fork shares the zygote's random states; a fresh process would not.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    import torch

    _calls.install(workdir, rank)
    keep_process_groups()
    if "OMP_NUM_THREADS" not in os.environ:
        # Like torchrun: do not let N ranks each use every core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))


_HOSTED_STORE: list[Any] = []  # rank 0's store server, alive as long as the rank


def host_store(rank: int, msg: dict) -> None:
    """Rank 0 serves the launch's store from the socket the zygote bound for it.

    Why: a port that is only checked free and bound later (``launcher.free_port``) can be
    drawn by another launch in that moment; the ranks of two launches then meet on one
    store, under the same keys, and fail with gloo errors ("Connection reset by peer") or
    EADDRINUSE. The zygote binds 127.0.0.1:0 before it forks the ranks and rank 0 inherits
    the bound socket, so from before any rank exists until rank 0 exits no other program can
    bind that port. ``TCPStore(..., master_listen_fd=...)`` serves on it, and
    ``multi_tenant=True`` registers the server under its port: the ``TCPStore`` that
    ``init_process_group`` (``env://``, ``_create_c10d_store`` in
    ``torch/distributed/rendezvous.py``) makes on rank 0 for MASTER_PORT is this server
    (``TCPServer::start`` in ``torch/csrc/distributed/c10d/TCPStore.cpp``).
    """
    fd = msg.get("store_fd")
    if fd is None:
        return
    if rank != 0:
        os.close(fd)
        return
    from datetime import timedelta

    import torch.distributed as dist

    try:
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available")
        server = dist.TCPStore(
            "127.0.0.1",
            msg["port"],
            None,
            True,
            timedelta(minutes=30),
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=fd,
        )
    except (RuntimeError, TypeError):  # an older torch: init_process_group binds the port itself
        os.close(fd)
        return
    _HOSTED_STORE.append(server)


def init_group(rank: int, nprocs: int, backend: str) -> Any:
    """Initialise the default process group for a launch that asked for a backend."""
    import torch
    import torch.distributed as dist

    from ddp_lab.runtime.device import rank_device, uses_nccl

    # The one rule (runtime/device.py): nccl ranks get a GPU each; gloo ranks of a launch
    # compute on CPU (cells that want a GPU move their tensors there themselves).
    device = rank_device(rank, nprocs, backend, use_gpu=False)
    if uses_nccl(backend):
        torch.cuda.set_device(device)
        # device_id: nccl binds this rank to its GPU now, not by guessing from the rank.
        dist.init_process_group(backend, rank=rank, world_size=nprocs, device_id=device)
    else:
        dist.init_process_group(backend, rank=rank, world_size=nprocs)
    return device


# The jobs that call the learner's code (``FunctionJob``, ``CellJob``): their ``__call__``
# frames are left out of rank tracebacks like this module's (and they name this checkout).
_DISPATCHERS = {os.path.join(os.path.dirname(__file__), n) for n in ("_shipping.py", "magic.py")}


def error_record(exc: BaseException, own_file: str = __file__) -> dict:
    """What the notebook learns of an exception: type, message, traceback, the exception.

    The traceback leaves out the frames at the top that called the learner's code (those of
    ``own_file`` and the jobs' ``__call__``), so it starts in the learner's code.
    """
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename != own_file and not (
            code.co_filename in _DISPATCHERS and code.co_name == "__call__"
        ):
            break
        tb = tb.tb_next
    try:
        pickled = _pickle.dumps(exc)
    except Exception:  # noqa: BLE001  # e.g. an exception holding a lock
        pickled = None
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
        "exc": pickled,
    }


def _write(path: str, obj: object) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(_pickle.dumps(obj))
    os.replace(path + ".tmp", path)


def main(rank: int, msg: dict, close_fds: tuple[int, ...] = ()) -> int:
    """Run one rank of a launch; return the process exit code."""
    _setup_process(rank, msg, close_fds)
    host_store(rank, msg)
    result_path = os.path.join(msg["workdir"], f"{rank}.result")
    code = 0
    try:
        job = cloudpickle.loads(msg["payload"])
        value = job(rank)
        try:
            _write(result_path, ("ok", value))
        except Exception as exc:  # the return value cannot travel back
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}") from None
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code == 0:
            _write(result_path, ("ok", None))
    except BaseException as exc:  # noqa: BLE001  # report everything, KeyboardInterrupt too
        code = 1
        record = error_record(exc)
        try:
            _write(result_path, ("error", record))
        except Exception:
            print(record["traceback"], file=sys.stderr)
    if code == 0:
        finish_together(rank)
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()  # the user's function left it initialised
        except Exception as exc:  # noqa: BLE001
            print(f"destroy_process_group failed: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return code
