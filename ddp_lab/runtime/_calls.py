"""Each rank's ledger of ``torch.distributed`` calls: what a hung rank is in, read from outside.

At start-up (``_rank``) every rank wraps the ``torch.distributed`` collective and
point-to-point functions (``dist.all_reduce``, ``dist.send`` ...). Each call counts itself
(its number among this rank's calls of that kind, from 1, like ``seq`` in a trace, see
``_trace``), and writes into a small file of the launch's private folder, mapped into
memory: the function's name, that number, the bytes of its tensors, the peer rank, and
whether the rank is inside the call or returned from it. That is one ``struct.pack_into``
when a call starts and one byte when it returns; no profiler, so it works in untraced runs.

When a launch (``dl.spawn``, ``%%ddp``) or a ``%%ranks`` cell of the persistent ranks
times out or deadlocks, the parent reads each rank's slot (``read``) before stopping the
ranks, and says per rank the call it waits in, or the last one it completed
(``describe``). A persistent rank's numbers count from the group's start.

Only calls made through the ``torch.distributed`` module are counted (the learner's
``dist.…`` calls); what PyTorch calls internally (DDP's buckets, the object collectives'
own all_gather) is not. ``isend``/``irecv`` stay unwrapped: ``P2POp`` and
``batch_isend_irecv`` check an op by identity (``op not in [isend, irecv]`` in
``distributed_c10d._check_op``), and they return at once anyway, like ``async_op=True``
calls: the waiting happens later, in ``work.wait()``, which the ledger does not see.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

from ddp_lab.i18n import _t

# state (0 none yet, 1 inside, 2 returned, 3 raised), per-kind number, bytes, peer, name
_SLOT = struct.Struct("<BxxxIqi20s")
_NONE, _INSIDE, _RETURNED, _RAISED = 0, 1, 2, 3
_NO_PEER, _ANY_PEER = -2, -1

# The functions counted: name -> (index of the data argument, its keyword; the peer's
# index, its keywords, or None for a collective without a peer).
_FUNCTIONS: dict[str, tuple[int, str, int | None, tuple[str, ...]]] = {
    "all_reduce": (0, "tensor", None, ()),
    "broadcast": (0, "tensor", 1, ("src", "group_src")),
    "reduce": (0, "tensor", 1, ("dst", "group_dst")),
    "all_gather": (1, "tensor", None, ()),
    "all_gather_into_tensor": (1, "input_tensor", None, ()),
    "gather": (0, "tensor", 2, ("dst", "group_dst")),
    "scatter": (0, "tensor", 2, ("src", "group_src")),
    "reduce_scatter": (1, "input_list", None, ()),
    "reduce_scatter_tensor": (1, "input", None, ()),
    "all_to_all": (1, "input_tensor_list", None, ()),
    "all_to_all_single": (1, "input", None, ()),
    "barrier": (-1, "", None, ()),
    "send": (0, "tensor", 1, ("dst", "group_dst")),
    "recv": (0, "tensor", 1, ("src", "group_src")),
}
_P2P_FROM = {"recv", "broadcast", "scatter"}  # the peer sends to this rank


def path(workdir: str, rank: int) -> str:
    """Where rank ``rank`` keeps its slot."""
    return os.path.join(workdir, f"{rank}.calls")


def _nbytes(data: Any) -> int:
    if isinstance(data, (list, tuple)):
        return sum(_nbytes(t) for t in data)
    try:
        return data.numel() * data.element_size()
    except AttributeError:
        return 0


def _wrap(
    fn: Callable, name: str, spec: tuple, slot: mmap.mmap, counts: dict[str, int]
) -> Callable:
    index, keyword, peer_index, peer_keywords = spec
    label = name.encode()
    pack = _SLOT.pack_into

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        seq = counts[name] = counts[name] + 1
        if index < 0:
            nbytes = 0
        else:
            nbytes = _nbytes(args[index] if len(args) > index else kwargs.get(keyword))
        peer = _NO_PEER
        if peer_index is not None:
            value = args[peer_index] if len(args) > peer_index else None
            for key in peer_keywords:
                if value is None:
                    value = kwargs.get(key)
            peer = _ANY_PEER if value is None else int(value)
        pack(slot, 0, _INSIDE, seq, nbytes, peer, label)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            slot[0] = _RAISED
            raise
        slot[0] = _RETURNED
        return result

    counted.__ddp_lab_counted__ = fn  # type: ignore[attr-defined]
    return counted


def install(workdir: str, rank: int) -> None:
    """Count this rank's ``torch.distributed`` calls into its slot (call once, at start-up)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    fd = os.open(path(workdir, rank), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, _SLOT.size)
        slot = mmap.mmap(fd, _SLOT.size)
    finally:
        os.close(fd)
    counts = dict.fromkeys(_FUNCTIONS, 0)
    for name, spec in _FUNCTIONS.items():
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "__ddp_lab_counted__"):
            setattr(dist, name, _wrap(fn, name, spec, slot, counts))
    install.slot = slot  # type: ignore[attr-defined]  # keep it mapped


def read(workdir: str, rank: int) -> tuple[int, str, int, int, int] | None:
    """(state, name, number, bytes, peer) of a rank's latest call; None if it made none."""
    try:
        with open(path(workdir, rank), "rb") as f:
            data = f.read(_SLOT.size)
    except OSError:
        return None
    if len(data) < _SLOT.size:
        return None
    state, seq, nbytes, peer, label = _SLOT.unpack(data)
    if state == _NONE:
        return None
    return state, label.rstrip(b"\0").decode(errors="replace"), seq, nbytes, peer


def size(nbytes: int) -> str:
    """Bytes as a learner reads them: ``4 B``, ``16.0 KiB``, ``4.0 MiB``."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def describe(rank: int, record: tuple[int, str, int, int, int] | None) -> str:
    """One line: the call rank ``rank`` waits in, or the last one it completed."""
    if record is None:
        return _t("rank {rank}: has made no torch.distributed call", rank=rank)
    state, name, seq, nbytes, peer = record
    call = f"{name} #{seq} ({size(nbytes)})"
    if peer == _ANY_PEER:
        call += " " + _t("from any rank")
    elif peer >= 0 and name in _P2P_FROM:
        call += " " + _t("from rank {peer}", peer=peer)
    elif peer >= 0:
        call += " " + _t("to rank {peer}", peer=peer)
    if state == _INSIDE:
        return _t("rank {rank}: waits in {call}", rank=rank, call=call)
    if state == _RAISED:
        return _t("rank {rank}: its last call, {call}, raised an error", rank=rank, call=call)
    return _t(
        "rank {rank}: in no torch.distributed call; the last one it completed: {call}",
        rank=rank,
        call=call,
    )


def report(workdir: str, ranks: list[int]) -> dict[int, str]:
    """Each rank's line (``describe``), read now."""
    return {r: describe(r, read(workdir, r)) for r in ranks}
