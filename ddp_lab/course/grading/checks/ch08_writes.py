"""08.fit's record of writes, and the judgement of who wrote the checkpoint and when.

``_writes`` runs in the learner's rank with the probe (``ch08.probe_fit``): how many times the
rank wrote into the checkpoint's folder, by any road, and when rank 0's last write could have
ended at the earliest. That is the rank's own account: ``judge_writes`` (in the grader) takes
it as a first, friendlier reason to fail, never as a reason to pass. Graded, the ranks run in
sandboxes of their own (``RankPool.run``'s ``share``): the checkpoint's folder is one folder
only rank 0 can write (the others see it read-only: a write of theirs fails in the kernel),
listed by the grader once the ranks are dead; each rank's reply is timed as it reaches the
grader, against the checkpoint's ctime as the grader sees it. Without a sandbox (self-study,
``DDP_LAB_SANDBOX=0``) the ranks' own account is all there is, and the verdict says so.
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

from ddp_lab.course.grading import fail, unobserved
from ddp_lab.i18n import N_, _t

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


TOLERANCE_S = 0.2
"""How far a rank's reply may reach the grader before the checkpoint's ctime and still count as
after it: the two are the same wall clock, read apart only if it is stepped back (NTP) in
between. A rank that did not wait answers about ``SLOW_SAVE_S`` before."""

READ_ONLY = N_(
    "rank {rank} wrote into the checkpoint's folder, which the grader shows read-only to every "
    "rank but 0: only rank 0 should write the checkpoint (if dist.get_rank() == 0), then every "
    "rank waits at dist.barrier()"
)


def outside(learner: Any, label: str) -> dict[str, Any] | None:
    """The grader's own evidence after ``learner.ranks(..., share=...)``: ``shared`` (the
    folder's listing) and ``answered`` (when each reply arrived); None where there is none."""
    shared, answered = getattr(learner, "shared", None), getattr(learner, "answered", None)
    if shared is not None and answered is not None:
        return {"shared": shared, "answered": answered}
    unobserved(
        learner,
        label,
        _t(
            "the grader could not list the checkpoint's folder after the ranks ended, so "
            "who wrote the checkpoint is not shown."
        ),
        _t(
            "08.fit: the grader could not observe the checkpoint's folder here (no "
            "sandbox): who wrote it and when the ranks returned were judged from the "
            "ranks' own report only."
        ),
    )
    return None


def judge_writes(results: list[dict], label: str, seen: dict[str, Any] | None) -> None:
    """Fail the case unless rank 0 alone wrote one file, ``model.pt``, and no rank returned
    before that write had ended. The ranks' own account first (it can only fail them), then
    ``seen``, the grader's (``outside``), which decides where there is one."""
    for rank, r in enumerate(results):
        if rank > 0 and r["saves"]:
            raise fail(
                _t(
                    "rank {rank} wrote into the checkpoint's folder {count} time(s): only rank "
                    "0 should write the checkpoint (if dist.get_rank() == 0), then every rank "
                    "waits at dist.barrier()",
                    rank=rank,
                    count=r["saves"],
                ),
                label,
            )
    saved_at = results[0].get("saved_at")
    if not results[0]["saves"] or saved_at is None:
        raise fail(
            _t("rank 0 never called torch.save: save the model's state_dict to checkpoint_path"),
            label,
        )
    # Rank 0's last write started after saved_at (held back SLOW_SAVE_S), so a rank that
    # waited for it at a barrier returned later, however slow the machine.
    early = [(r, saved_at - x["returned_at"], 0.0) for r, x in enumerate(results) if r > 0]
    files = results[0]["files"]
    if seen is not None:
        files = sorted(seen["shared"])
        entry = seen["shared"].get("model.pt")
        if entry is not None and entry["kind"] == "file":
            written = float(entry["ctime"])  # the write's end, or later: never earlier
            early += [(r, written - t, TOLERANCE_S) for r, t in enumerate(seen["answered"]) if r]
    for rank, ahead, allowed in early:
        if not ahead < allowed:  # NaN included
            raise fail(
                _t(
                    "rank {rank} returned from fit at least {early:.1f} s before rank 0 had "
                    "written the checkpoint: after rank 0's save, every rank waits at "
                    "dist.barrier(), so that no rank reads a checkpoint that is not complete",
                    rank=rank,
                    early=ahead,
                ),
                label,
            )
    if files != ["model.pt"]:
        raise fail(
            _t(
                "expected exactly one checkpoint file at checkpoint_path, found {files}",
                files=files,
            ),
            label,
        )
