"""08.fit's record of writes: how many times each rank wrote into the checkpoint's folder, by
any road, and when rank 0's last write could have ended at the earliest (see ``ch08``).

It runs in the learner's process with the probe (``ch08.probe_fit``); what it records is the
rank's own account, which the checker in ``ch08`` judges.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

SLOW_SAVE_S = 1.5
"""How long rank 0's every write into the checkpoint's folder is held back. A rank whose fit
returns without waiting for rank 0's save returns this much before the write can end; being
delayed that long by chance after its last collective is out of reach even on a busy machine.
A rank that waits at the barrier returns after the write whatever the load: no margin there."""

_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@contextlib.contextmanager
def _writes(folder: Path, slow: bool) -> Iterator[dict[str, Any]]:
    """While inside: ``count``, the writes into ``folder`` by this process, and ``until``, the
    time (``time.monotonic``) before which the last of them had not ended.

    A write is an open for writing (the audit hook's "open" event: ``open``, ``io.FileIO``,
    ``os.open``, ``pathlib``, ``torch.save`` of a file object or a non-ASCII path), a rename
    or link onto a name in ``folder``, or ``torch.save`` of an ASCII path, which C++ opens
    (``torch._C.PyTorchFileWriter``, looked up by ``torch.serialization`` at each save). So
    any road counts, ``torch.serialization.save`` as much as ``torch.save``, where counting
    calls of ``torch.save`` missed every other name. ``slow``: each write waits
    ``SLOW_SAVE_S`` before it starts."""
    where = os.path.realpath(folder)
    seen: dict[str, Any] = {"count": 0, "until": None}
    # An audit hook cannot be removed: this one stops counting on exit ("on"), and does not
    # count realpath's own calls while it looks at a path ("busy").
    state = {"on": True, "busy": False}

    def note(target: Any) -> None:
        if isinstance(target, int):  # an fd: its opening was seen
            return
        try:
            place = os.path.dirname(os.path.realpath(os.fsdecode(target)))
        except (TypeError, ValueError):
            return
        if place == where:
            seen["count"] += 1
            if slow:
                time.sleep(SLOW_SAVE_S)
            seen["until"] = time.monotonic()  # the write starts after this

    def hook(event: str, args: tuple) -> None:
        if event not in ("open", "os.rename", "os.link") or not state["on"] or state["busy"]:
            return
        state["busy"] = True
        try:
            if event == "open":
                if isinstance(args[2], int) and args[2] & _WRITING:
                    note(args[0])
            else:
                note(args[1])
        finally:
            state["busy"] = False

    real_writer = torch._C.PyTorchFileWriter

    class Writer(real_writer):  # type: ignore[misc, valid-type]
        def __init__(self, target: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(target, str):  # a file object's open was an "open" event
                note(target)
            super().__init__(target, *args, **kwargs)

    sys.addaudithook(hook)
    torch._C.PyTorchFileWriter = Writer
    try:
        yield seen
    finally:
        state["on"] = False
        torch._C.PyTorchFileWriter = real_writer
