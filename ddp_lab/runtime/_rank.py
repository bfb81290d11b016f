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
import signal
import sys
import traceback
from typing import Any

import cloudpickle


def _open_capture(path: str, fd: int) -> io.TextIOWrapper:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, fd)
    os.close(target)
    raw = io.FileIO(fd, "w", closefd=False)
    # write_through: every print reaches the file at once, even if the rank dies by os._exit.
    return io.TextIOWrapper(
        raw, encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True
    )


# Process groups that destroy_process_group() dropped, kept alive until the process ends.
KEPT_GROUPS: list[Any] = []


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
        if group is None:
            KEPT_GROUPS.extend(c10d._world.pg_map)
        else:
            KEPT_GROUPS.append(group)
        original(group)

    destroy_process_group._ddp_lab_keeps = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def release_kept_groups() -> None:
    """Free the groups kept by ``keep_process_groups`` (call when no collective just ended)."""
    KEPT_GROUPS.clear()


def _setup_process(rank: int, msg: dict, close_fds: tuple[int, ...]) -> None:
    from ddp_lab.runtime._zygote import set_parent_death_signal

    os.setpgid(0, 0)
    set_parent_death_signal(signal.SIGKILL)
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
    stack = open(os.path.join(workdir, f"{rank}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
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

    # A fork shares the zygote's random states; a fresh process would not.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    import torch

    keep_process_groups()
    if "OMP_NUM_THREADS" not in os.environ:
        # Like torchrun: do not let N ranks each use every core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))


def init_group(rank: int, nprocs: int, backend: str) -> Any:
    """Initialise the default process group for a launch that asked for a backend."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=nprocs)
    return device


def error_record(exc: BaseException, own_file: str = __file__) -> dict:
    """What the notebook learns of an exception: type, message, traceback, the exception.

    The traceback leaves out the frames of ``own_file`` at the top (the code that called the
    learner's), so it starts in the learner's code.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == own_file:
        tb = tb.tb_next
    try:
        pickled = cloudpickle.dumps(exc)
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
        f.write(cloudpickle.dumps(obj))
    os.replace(path + ".tmp", path)


def main(rank: int, msg: dict, close_fds: tuple[int, ...] = ()) -> int:
    """Run one rank of a launch; return the process exit code."""
    _setup_process(rank, msg, close_fds)
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
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()  # the user's function left it initialised
        except Exception as exc:  # noqa: BLE001
            print(f"destroy_process_group failed: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return code
