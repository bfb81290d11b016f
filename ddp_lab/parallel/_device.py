"""Simulated devices: CPU tensors tagged with the index of the "GPU" they live on.

The teaching versions of ``torch.nn.parallel`` run on a CPU-only machine, so a "device"
is an integer label: a copy to device ``i`` is a real copy (``clone``) whose result
carries ``_sim_device = i``. Untagged tensors live on the host ("cpu"), like a batch fresh
from a DataLoader. Every copy and every phase can be recorded by a ``trace()`` so a lesson
can draw which tensors moved where and how long each phase took.

How this differs from PyTorch: real devices are ``torch.device("cuda", i)`` and a copy
goes over PCIe or NVLink; here every "device" shares the same CPU memory and cores.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

HOST = -1  # like torch's get_device() for a CPU tensor

_local = threading.local()  # the "current device" of a replica's thread
_lock = threading.Lock()
_traces: list[Trace] = []


@dataclass
class Event:
    """One thing that happened during a traced step: a copy or a timed phase."""

    kind: str  # "copy" or "phase"
    name: str  # e.g. "scatter", "broadcast", "forward"
    src: int = HOST
    dst: int = HOST
    nbytes: int = 0
    start: float = 0.0
    end: float = 0.0
    thread: str = ""


@dataclass
class Trace:
    """The events recorded inside ``with trace() as tr:``; times in seconds from its start."""

    t0: float = field(default_factory=time.perf_counter)
    events: list[Event] = field(default_factory=list)

    def copies(self, name: str | None = None) -> list[Event]:
        """The copies between devices, optionally only those of one step (``name``)."""
        return [e for e in self.events if e.kind == "copy" and name in (None, e.name)]

    def phases(self) -> list[Event]:
        """The timed phases (scatter, replicate, forward of each replica, gather, ...)."""
        return [e for e in self.events if e.kind == "phase"]

    def bytes_moved(self) -> dict[tuple[str, int, int], int]:
        """Total bytes per (step name, source device, destination device)."""
        out: dict[tuple[str, int, int], int] = {}
        for e in self.copies():
            key = (e.name, e.src, e.dst)
            out[key] = out.get(key, 0) + e.nbytes
        return out


@contextmanager
def trace() -> Iterator[Trace]:
    """Record every simulated copy and phase that runs inside the block."""
    tr = Trace()
    with _lock:
        _traces.append(tr)
    try:
        yield tr
    finally:
        with _lock:
            _traces.remove(tr)


def _record(event: Event) -> None:
    if not _traces:
        return
    event.thread = threading.current_thread().name
    with _lock:
        for tr in _traces:
            shifted = Event(**{**event.__dict__})
            shifted.start -= tr.t0
            shifted.end -= tr.t0
            tr.events.append(shifted)


@contextmanager
def phase(name: str, device: int = HOST) -> Iterator[None]:
    """Time a block as one phase of a step (shown on the timeline)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _record(Event("phase", name, src=device, dst=device, start=start, end=time.perf_counter()))


def get_device(tensor: torch.Tensor) -> int:
    """The simulated device of ``tensor``: its index, or -1 (``HOST``) for the host.

    Mirrors ``Tensor.get_device()``, which returns -1 for CPU tensors.
    """
    return getattr(tensor, "_sim_device", HOST)


def tag(tensor: torch.Tensor, device: int) -> torch.Tensor:
    """Label ``tensor`` as living on simulated ``device`` (no copy) and return it."""
    tensor._sim_device = device  # type: ignore[attr-defined]
    return tensor


@contextmanager
def backward_step() -> Iterator[None]:
    """Name the copies made inside the block "<step>_grad" (they move gradients back)."""
    previous = getattr(_local, "backward", False)
    _local.backward = True
    try:
        yield
    finally:
        _local.backward = previous


def record_copy(tensor: torch.Tensor, device: int, step: str) -> None:
    """Record that ``tensor`` moves to ``device`` during ``step`` (the copy is made elsewhere)."""
    src = get_device(tensor)
    if src != device:
        if getattr(_local, "backward", False):
            step += "_grad"
        now = time.perf_counter()
        _record(
            Event(
                "copy",
                step,
                src=src,
                dst=device,
                nbytes=tensor.numel() * tensor.element_size(),
                start=now,
                end=now,
            )
        )


def copy_to(tensor: torch.Tensor, device: int, step: str) -> torch.Tensor:
    """A real copy of ``tensor`` on simulated ``device``, recorded as part of ``step``.

    A copy onto the device the tensor already lives on is skipped, as ``Tensor.to`` does.
    """
    src = get_device(tensor)
    if src == device:
        return tensor
    record_copy(tensor, device, step)
    return tag(tensor.detach().clone(), device)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def record_alloc(name: str, dev: int, obj: Any) -> None:
    """Record that the tensors in ``obj`` now occupy memory on ``dev`` (for memory plots)."""
    if _traces:
        nbytes = sum(t.numel() * t.element_size() for t in _tensors(obj))
        _record(Event("alloc", name, src=dev, dst=dev, nbytes=nbytes))


@contextmanager
def count_saved(
    dev: int, module: torch.nn.Module | None = None, name: str = "activations"
) -> Iterator[None]:
    """Record the bytes autograd saves for backward inside the block (the activations).

    Tensors that are the module's own parameters or buffers are not counted again.
    Only active inside ``trace()``: the hooks cost time.
    """
    if not _traces:
        yield
        return
    own: set[int] = set()
    if module is not None:
        for sub in module.modules():
            for t in [
                *getattr(sub, "_former_parameters", {}).values(),
                *sub._parameters.values(),
                *sub._buffers.values(),
            ]:
                if t is not None:
                    own.add(t.data_ptr())
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if t.data_ptr() not in own and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    _record(Event("alloc", name, src=dev, dst=dev, nbytes=total))


def current_device() -> int:
    """The simulated device of the calling thread (set by ``parallel_apply``), else -1."""
    return getattr(_local, "device", HOST)


@contextmanager
def device(index: int) -> Iterator[None]:
    """Make ``index`` the current simulated device of this thread (like torch.cuda.device)."""
    previous = current_device()
    _local.device = index
    try:
        yield
    finally:
        _local.device = previous


def device_index(obj: Any) -> int:
    """Accept 3, "sim:3", or a torch.device("cuda", 3) and return 3; "cpu" and -1 give -1."""
    if isinstance(obj, bool):
        raise TypeError(f"not a device: {obj!r}")
    if isinstance(obj, int):
        return obj
    if isinstance(obj, torch.device):
        return HOST if obj.type == "cpu" else (obj.index or 0)
    if isinstance(obj, str):
        if obj == "cpu":
            return HOST
        return int(obj.split(":")[-1])
    raise TypeError(f"not a device: {obj!r}")
