"""Ways around the ranks' lock (``course/grading/checks/lockdown.py``), as a learner writes them.

Shared by ``tests/course/test_lockdown.py`` (in a process of the test's own) and
``tests/course/test_grading_attacks_ranks.py`` (through the grader's ranks). Each was a full
04.all_reduce once (``ddp-lab check``, 3/3 points, no flag from the static scan: the names it
looks for are built from pieces).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

import torch
import torch.distributed as dist


def _registrations(read: Callable[[int, int], bytes] | None = None) -> list[int]:
    """The addresses of the ``torch._C._DispatchModule`` objects with one reference (the lock's
    registration among them), found by reading the process's writable memory: through
    ``/proc/self/mem``, or through ``read(address, n)`` (refused in a sealed rank since it holds
    the rank's token; ``/proc/self/maps``, which says where the memory is, stays open)."""
    pattern = struct.pack("<Q", id(torch._C._DispatchModule))
    base = "/pr" + "oc/self/"
    with open(base + "maps") as f:
        regions = [line.split() for line in f]
    found = []
    with contextlib.ExitStack() as stack:
        if read is None:
            mem = stack.enter_context(open(base + "me" + "m", "rb", buffering=0))

            def read(address: int, n: int) -> bytes:
                mem.seek(address)
                return mem.read(n)

        for region in regions:
            if not region[1].startswith("rw") or (len(region) > 5 and region[5][:2] == "[v"):
                continue
            lo, hi = (int(x, 16) for x in region[0].split("-"))
            if hi - lo > 1 << 30:
                continue
            try:
                data = read(lo, hi - lo)
            except OSError:
                continue
            i = data.find(pattern)
            while i != -1:
                # an object's header: its reference count (1: the lock's own), then its type
                if i >= 8 and i % 8 == 0 and struct.unpack_from("<q", data, i - 8)[0] == 1:
                    found.append(lo + i - 8)
                i = data.find(pattern, i + 1)
    return found


def reset_lock_registration() -> int:
    """Find the lock's registration (a ``torch._C._DispatchModule`` that no Python object
    holds) in the process's memory and reset it: the real ``c10d::`` kernels are back. The
    object is reached with ``ctypes``. Returns how many registrations were reset."""
    ct = getattr(torch, "ct" + "ypes")  # torch imports it: no import of it in the code
    reset = 0
    for address in _registrations():
        if ct.c_ssize_t.from_address(address).value != 1:
            continue
        obj = ct.cast(address, ct.py_object).value
        if type(obj) is torch._C._DispatchModule:
            obj.reset()
            reset += 1
    return reset


class AtUnpickle:
    """Runs ``reset_lock_registration`` where the rank loads the learner's objects: after
    the lock, before the exercise's own refusals of the call (``ch04.forbid``)."""

    def __reduce__(self) -> tuple:
        return (reset_lock_registration, ())


_AT_UNPICKLE = AtUnpickle()


def unlocked_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """04.all_reduce by gloo's own all-reduce, the lock reset as the blob was loaded."""
    _AT_UNPICKLE  # noqa: B018  # pickled with the function: it runs in the rank
    dist.group.WORLD.allreduce([tensor]).wait()
    return tensor


def sparse_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """04.all_reduce by gloo's own all-reduce of a sparse copy: ``c10d::allreduce_`` has
    kernels for ``SparseCPU`` / ``SparseCUDA``, which a lock of the devices only left alone."""
    work = dist.group.WORLD.allreduce([tensor.to_sparse()])
    work.wait()
    tensor.copy_(work.result()[0].to_dense())
    return tensor


def reset_by_array_interface() -> int:
    """``reset_lock_registration`` without ``ctypes``: numpy views any address given in an
    ``__array_interface__`` (no audit event), which reads and writes the process's memory;
    the registration's address is written into a list's slot. Still a way around the lock
    (``tests/course/test_lockdown.py``)."""
    import numpy as np

    class View:
        def __init__(self, address: int, n: int) -> None:
            data = (address, False)
            self.__array_interface__ = {"shape": (n,), "typestr": "|u1", "data": data, "version": 3}

    def mem(address: int, n: int) -> np.ndarray:
        return np.asarray(View(address, n))

    reset = 0
    for address in _registrations(lambda address, n: mem(address, n).tobytes()):
        if struct.unpack("<qQ", mem(address, 16).tobytes()) != (1, id(torch._C._DispatchModule)):
            continue
        holder: list = [None]
        items = struct.unpack("<Q", mem(id(holder) + 24, 8).tobytes())[0]  # PyListObject.ob_item
        mem(address, 8)[:] = np.frombuffer(struct.pack("<q", 2), dtype=np.uint8)  # a reference
        mem(items, 8)[:] = np.frombuffer(struct.pack("<Q", address), dtype=np.uint8)
        holder[0].reset()
        reset += 1
    return reset
