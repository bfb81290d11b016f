"""Traced launches: ``torch.profiler`` in every rank, one merged Chrome trace for the run.

Each rank runs the learner's function under ``torch.profiler.profile`` (CPU activity, and
CUDA where the rank uses it; ``record_shapes=True``, so communication calls carry their
tensor sizes) and exports its own Chrome trace into a private folder; the launcher then
merges the files into ONE trace (``merge``) that Perfetto and ``chrome://tracing`` open:

- every rank is a process named ``rank R`` (pid R), its threads named (main thread, gloo);
- one clock: the profiler writes each event's time in microseconds after the file's
  ``baseTimeNanoseconds``; base + ts is Unix time (Kineto converts its approximate clock
  with ``c10::ApproximateClockToUnixTimeConverter`` to ``CLOCK_REALTIME``, see
  ``c10/util/ApproximateClock.h``), which every process on one machine shares. The merge
  adds each file's base and subtracts the earliest event of the run, so the merged times
  are microseconds since the run's first event, comparable across ranks;
- every ``gloo:*`` / ``nccl:*`` event (the work of a ``torch.distributed`` call, recorded by
  the backend) gets ``args``: ``kind`` (``all_reduce``, ``send`` ...), ``bytes`` (the input
  tensors' size on this rank), ``seq`` (its number among this rank's calls of that kind,
  from 1) and, for point-to-point calls and rooted collectives, ``peer`` (taken from the
  matching ``c10d::`` call on the calling thread: the destination, source or root rank).

This is no profiler of its own: what the profiler does not record is not in the trace.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

COMM_PREFIXES = ("gloo:", "nccl:")
_TYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
# The c10d op whose arguments name the peer, per backend event kind, and where the peer is.
_PEER_OPS = {
    "send": ("c10d::send", 2),
    "recv": ("c10d::recv_", 2),
    "broadcast": ("c10d::broadcast_", 2),
    "reduce": ("c10d::reduce_", 2),
}


def rank_file(folder: str, rank: int) -> str:
    """Where rank ``rank`` writes its own trace."""
    return os.path.join(folder, f"{rank}.trace.json")


class Profiled:
    """Context manager: profile the block with ``torch.profiler`` and export the trace.

    The trace is exported even when the block raises (the run up to the failure is shown).
    ``key`` and ``count``: the store key the ranks count themselves on and how many ranks
    take part (``start_together``); the persistent ranks trace one cell at a time, possibly
    on some ranks only, so each cell has its own key.
    """

    def __init__(
        self, rank: int, folder: str, key: str | None = None, count: int | None = None
    ) -> None:
        self.rank, self.folder = rank, folder
        self.key, self.count = key or START_KEY, count
        self.prof: Any = None

    def __enter__(self) -> Profiled:
        # Kineto prints "USDT: ... profiler_start/stop" on stderr at every start and stop,
        # which would land in the rank's output; level 6 is above all of Kineto's levels.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        # Kernels are recorded only with the CUDA activity on from the start; the rank's
        # code usually initialises CUDA after this (so "is CUDA initialised" is no test:
        # traces on a GPU had runtime calls and no kernel). Asking is_available does not
        # initialise torch's CUDA.
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=activities, record_shapes=True)
        with warnings.catch_warnings():
            # torch.profiler warns "Profiler clears events at the end of each cycle" when
            # a profile object prepares a second trace (torch/profiler/profiler.py,
            # prepare_trace); each traced block here is one cycle, so it says nothing to
            # the learner and stays out of the rank's output.
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            self.prof.start()
        try:
            start_together(key=self.key, count=self.count)
        except BaseException:  # an interrupt while waiting: no profiler stays on
            self.prof.stop()
            self.prof = None
            raise
        return self

    def __exit__(self, *exc: object) -> bool:
        prof, self.prof = self.prof, None
        if prof is None:
            return False
        # Kernels run after their launch returns; the profiler records only those that
        # finished before it stops, so wait for them.
        synchronize_used_gpus()
        prof.stop()
        prof.export_chrome_trace(rank_file(self.folder, self.rank))
        return False


def synchronize_used_gpus() -> list[int]:
    """Wait for the kernels of every GPU this process has used; the GPUs waited for.

    ``torch.cuda.synchronize()`` waits for the current device only: a gloo rank that computes
    on ``cuda:(r % gpus)`` (``runtime/device.py``) without ``set_device`` would wait for
    GPU 0 (making a context there) and miss its own kernels. A GPU this process used holds
    memory of its caching allocator; asking for that creates no context.
    """
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    used = [d for d in range(torch.cuda.device_count()) if torch.cuda.memory_reserved(d)]
    for d in used or [torch.cuda.current_device()]:
        torch.cuda.synchronize(d)
    return used or [torch.cuda.current_device()]


START_KEY = "ddp_lab_trace_started"


def start_together(timeout: float = 60.0, key: str | None = None, count: int | None = None) -> None:
    """Wait until every rank's profiler runs, so that no rank's trace starts with a wait.

    Why: a rank's first profiler start can take a second or more (``torch.profiler``
    imports ``torch._dynamo`` the first time), and the ranks that started first would
    spend it in their first collective, waiting: a wait the program itself never had.
    The counter lives in the default group's store (a launch's own, fresh one), which is no
    collective: nothing appears in the trace and the program's collectives are untouched.
    Without a process group (the function starts it itself) nothing is waited for.
    """
    import time

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    store = dist.distributed_c10d._get_default_store()
    world = dist.get_world_size() if count is None else count
    key = key or START_KEY
    deadline = time.monotonic() + timeout
    started = store.add(key, 1)
    while started < world and time.monotonic() < deadline:
        time.sleep(0.001)
        started = store.add(key, 0)


def _bytes(args: dict) -> int:
    """Bytes of the tensors an event's ``record_shapes`` arguments describe (0 if none)."""
    total = 0
    for dims, kind in zip(args.get("Input Dims") or [], args.get("Input type") or [], strict=False):
        size = _TYPE_BYTES.get(kind)
        if size is None or not isinstance(dims, list):
            continue
        shapes = dims if dims and isinstance(dims[0], list) else [dims]
        for shape in shapes:
            n = 1
            for d in shape:
                n *= int(d)
            total += n * size
    return total


def _int_arg(args: dict, index: int) -> int | None:
    values = args.get("Concrete Inputs") or []
    try:
        return int(values[index])
    except (IndexError, TypeError, ValueError):
        return None


def annotate(events: list[dict]) -> None:
    """Add ``kind``, ``bytes``, ``seq`` and ``peer`` to one rank's communication events."""
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e.get("ts", 0.0))
    calls: dict[str, list[dict]] = {}
    for e in spans:
        if str(e.get("name", "")).startswith("c10d::"):
            calls.setdefault(e["name"], []).append(e)
    used: dict[str, int] = {}
    seq: dict[str, int] = {}
    for e in spans:
        name = str(e.get("name", ""))
        if not name.startswith(COMM_PREFIXES):
            continue
        kind = name.split(":", 1)[1]
        args = e.setdefault("args", {})
        seq[kind] = seq.get(kind, 0) + 1
        args.update(kind=kind, bytes=_bytes(args), seq=seq[kind])
        op = _PEER_OPS.get(kind)
        if op is not None:
            # The k-th backend send is the k-th c10d::send on this rank (calls are issued
            # in order); its arguments are (tensors, group, peer, tag, ...).
            index = used.get(op[0], 0)
            matches = calls.get(op[0], [])
            if index < len(matches):
                used[op[0]] = index + 1
                peer = _int_arg(matches[index].get("args", {}), op[1])
                if peer is not None:
                    args["peer"] = peer


def _stdlib_loads(data: bytes) -> Any:
    return json.loads(data)


def _stdlib_dumps(obj: Any) -> bytes:
    # json.dumps, not json.dump(obj, f): the latter streams through the pure-Python encoder.
    return json.dumps(obj).encode()


try:  # orjson parses and writes the ranks' traces several times faster than json
    import orjson

    _loads: Any = orjson.loads
    _dumps: Any = orjson.dumps
except ImportError:  # an environment set up before orjson was a dependency
    _loads, _dumps = _stdlib_loads, _stdlib_dumps


def merge(files: dict[int, str], target: str, extra: dict | None = None) -> dict:
    """Merge per-rank profiler exports ({rank: path}) into one Chrome trace at ``target``."""
    loaded: dict[int, dict] = {}
    for rank, path in sorted(files.items()):
        with open(path, "rb") as f:
            loaded[rank] = _loads(f.read())
    start_us = None
    for data in loaded.values():
        base = data.get("baseTimeNanoseconds", 0) / 1000.0
        for e in data.get("traceEvents", []):
            if e.get("ph") == "X" and isinstance(e.get("pid"), int):
                t = base + float(e["ts"])
                start_us = t if start_us is None else min(start_us, t)
    start_us = start_us or 0.0
    out: list[dict] = []
    threads: dict[int, dict[str, Any]] = {}
    for rank, data in loaded.items():
        base = data.get("baseTimeNanoseconds", 0) / 1000.0
        pids = {e["pid"] for e in data.get("traceEvents", []) if isinstance(e.get("pid"), int)}
        # The process's own pid: that of its operators. A GPU's events (kernels, the ends
        # of CPU-to-GPU flows) carry the device's number as pid (0, 1, ...): the smallest
        # pid is no answer on a GPU (the main thread was lost and compute read 0).
        own = [e["pid"] for e in data.get("traceEvents", []) if e.get("cat") == "cpu_op"]
        main_pid = (
            data.get("distributedInfo", {}).get("pid")
            or (max(set(own), key=own.count) if own else None)
            or (max(pids) if pids else 0)
        )
        mine = [
            e
            for e in data.get("traceEvents", [])
            if isinstance(e.get("pid"), int) and e.get("ph") != "M"
        ]
        annotate(mine)
        comm_tids: set[int] = set()
        for e in mine:  # the loaded events are this merge's own: changed in place
            e["pid"] = rank
            if "ts" in e:
                e["ts"] = round(base + float(e["ts"]) - start_us, 3)
            if e.get("ph") in ("s", "t", "f") and isinstance(e.get("id"), int):
                e["id"] = rank * 1_000_000_000 + e["id"]  # flow ids are global in a trace
            if str(e.get("name", "")).startswith(COMM_PREFIXES) and e.get("tid") != main_pid:
                comm_tids.add(e["tid"])
            out.append(e)
        tids = {e.get("tid") for e in mine if isinstance(e.get("tid"), int)}
        threads[rank] = {"main_tid": main_pid, "comm_tids": sorted(comm_tids)}
        out.append(_meta(rank, 0, "process_name", name=f"rank {rank}"))
        out.append(_meta(rank, 0, "process_sort_index", sort_index=rank))
        for tid in sorted(tids):
            if tid == main_pid:
                name, order = "main thread", 0
            elif tid in comm_tids:
                name, order = "communication (backend thread)", 1
            else:
                name, order = f"thread {tid}", 2
            out.append(_meta(rank, tid, "thread_name", name=name))
            out.append(_meta(rank, tid, "thread_sort_index", sort_index=order))
    merged = {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "ddp_lab": {
            "world_size": len(loaded),
            "ranks": {str(r): threads[r] for r in loaded},
            "start_unix_ns": int(start_us * 1000),
            **(extra or {}),
        },
    }
    tmp = target + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_dumps(merged))
    os.replace(tmp, target)
    return merged


def _meta(pid: int, tid: int, what: str, **args: Any) -> dict:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}


def check_target(path: Any) -> str:
    """The absolute path a merged trace will be written to; a clear error before anything runs."""
    from ddp_lab.i18n import _t

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(
            _t("trace must be a file name such as 'run.json', got {value!r}.", value=path)
        )
    target = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise ValueError(
            _t(
                "Cannot write the trace {path}: the folder {folder} does not exist.",
                path=target,
                folder=folder,
            )
        )
    if os.path.isdir(target):
        raise ValueError(_t("Cannot write the trace {path}: it is a folder.", path=target))
    return target


def collect(folder: str, nprocs: int, target: str, ranks: list[int] | None = None) -> bool:
    """Merge the rank traces found in ``folder`` into ``target``; False if none was written.

    A rank that was killed (timeout, crash) wrote no trace: the others are merged, and the
    merged trace lists the missing ranks under ``ddp_lab.missing_ranks``. ``ranks``: the
    ranks that were traced (default: all ``nprocs``).
    """
    traced = list(range(nprocs)) if ranks is None else list(ranks)
    files = {r: rank_file(folder, r) for r in traced if os.path.exists(rank_file(folder, r))}
    if not files:
        return False
    missing = [r for r in traced if r not in files]
    extra: dict[str, Any] = {"world_size": nprocs}
    if missing:
        extra["missing_ranks"] = missing
    merge(files, target, extra)
    return True
