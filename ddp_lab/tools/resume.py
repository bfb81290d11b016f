"""Checkpoints a run can resume from bit for bit: what they hold, and how they are written.

A resumed run continues *exactly* (the same final parameters, bit for bit) only if the
checkpoint holds everything that decides the next step:

* the model and the optimizer (SGD's momentum buffers, Adam's moments and step count),
* the LR schedule (``scheduler.state_dict()``: its step count and last LR),
* every rank's random number generators: torch's CPU (and CUDA) generator, numpy's and
  Python's ``random`` (dropout, augmentation, anything the loop draws),
* the sampler's epoch *and* position inside the epoch (which samples were already used),
* the step counter.

Checkpoints are written atomically: to a temporary file in the same folder, flushed and
``fsync``-ed, then renamed over the final name (``os.replace``, atomic on POSIX within one
file system), and the folder is ``fsync``-ed so that the rename itself survives a crash. A
reader sees a complete checkpoint or none, even when the writer is killed mid-write.

How this differs from PyTorch's own tools: ``torch.distributed.checkpoint`` (DCP, chapter
11's section on sharded checkpoints) writes each rank's shards in parallel with a
``.metadata`` file written last; torchdata's ``StatefulDataLoader`` keeps the loader
position. Here one file holds the full state (fine for a model that fits one process),
and :class:`ResumableDistributedSampler` keeps the position.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

STEP_FILE = re.compile(r"^step-(\d{8})\.pt$")


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start inside an epoch (``drop_last=False`` only).

    ``start`` counts the samples of this epoch's order that all ranks together have already
    used. Rank r of W gets positions r, r+W, r+2W, ... of the (shuffled, padded) order, so
    after p steps of B samples per rank exactly the first p*B*W positions are used, whatever
    the rank. ``__iter__`` drops them and deals the rest out as ``DistributedSampler``
    would: with ``start=0`` it yields the very same indices (tested), and resuming with
    another world size uses each remaining sample once (plus the usual padding).
    ``set_epoch`` starts the new epoch at position 0.
    """

    def __init__(self, dataset: Dataset, **kwargs: Any) -> None:
        if kwargs.get("drop_last"):
            raise ValueError("ResumableDistributedSampler supports drop_last=False only")
        super().__init__(dataset, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.start = 0

    def state_dict(self) -> dict[str, int]:
        """Epoch and position: enough to continue where this epoch stopped."""
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.start = int(state["epoch"]), int(state["start"])

    def advance(self, batches: int, batch_size: int) -> None:
        """Count ``batches`` steps of ``batch_size`` samples per rank as used."""
        self.start += batches * batch_size * self.num_replicas

    def _order(self) -> list[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:  # the same generator and seed as DistributedSampler
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(n, generator=g).tolist()
        return list(range(n))

    def __len__(self) -> int:
        left = max(0, len(self.dataset) - self.start)  # type: ignore[arg-type]
        return math.ceil(left / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        rest = order[self.start :]
        pad = (-len(rest)) % self.num_replicas
        if rest and pad:  # DistributedSampler pads with the head of the epoch's order
            rest += (order * math.ceil(pad / len(order)))[:pad]
        return iter(rest[self.rank :: self.num_replicas])


def rng_state() -> dict[str, Any]:
    """This process's random generators: torch (CPU and every CUDA device), numpy, Python."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` returned.

    A generator's state is a CPU ``ByteTensor`` whatever generator it belongs to
    (``torch/random.py`` ``set_rng_state``, ``torch/cuda/random.py`` ``set_rng_state``); a
    checkpoint loaded with ``map_location="cuda"`` brings it back on the GPU, so each state
    is moved to the CPU first.
    """
    torch.set_rng_state(_cpu_bytes(state["torch"]))
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        # One state per GPU the saving process saw; a resume that sees fewer (another
        # CUDA_VISIBLE_DEVICES, a smaller node) restores those it has: set_rng_state_all
        # would index a GPU that is not there.
        states = [_cpu_bytes(s) for s in state["cuda"]][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)


def _cpu_bytes(state: torch.Tensor) -> torch.Tensor:
    """A generator state as ``set_rng_state`` takes it: a uint8 tensor on the CPU."""
    return state.to(device="cpu", dtype=torch.uint8)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(state: dict[str, Any], path: str | Path) -> int:
    """Write ``state`` to ``path`` so that ``path`` holds all of it or does not change.

    Returns the file's size in bytes. A writer killed before ``os.replace`` leaves only a
    ``.tmp`` file, which :func:`latest_checkpoint` never picks.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)  # atomic within one file system
    _fsync_dir(path.parent)  # and the rename itself survives a power cut
    return path.stat().st_size


def step_path(folder: str | Path, step: int) -> Path:
    """The checkpoint file of ``step`` in ``folder``."""
    return Path(folder) / f"step-{step:08d}.pt"


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The complete checkpoint with the highest step in ``folder`` (temporary files skipped)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = [(int(m[1]), p) for p in folder.iterdir() if (m := STEP_FILE.match(p.name))]
    return max(found)[1] if found else None


def prune(folder: str | Path, keep: int = 2) -> None:
    """Keep the ``keep`` newest checkpoints and remove temporary files of dead writers."""
    folder = Path(folder)
    steps = sorted(p for p in folder.iterdir() if STEP_FILE.match(p.name))
    for p in steps[:-keep]:
        p.unlink(missing_ok=True)
    for p in folder.glob(".step-*.pt.tmp-*"):
        pid = int(p.name.rsplit("-", 1)[1])
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            p.unlink(missing_ok=True)


def save_step(folder: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> int:
    """Every rank calls it: gather each rank's RNG state, rank 0 writes, all wait.

    ``state`` holds what is the same on every rank (model, optimizer, schedule, counters);
    ``state["ranks"]`` is filled here with each rank's ``{"rng": ..., **state.pop("local")}``.
    Returns the bytes written (on rank 0; 0 elsewhere).
    """
    local = {"rng": rng_state(), **state.pop("local", {})}
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, local)
    size = 0
    if dist.get_rank() == 0:
        size = save_atomic({**state, "ranks": ranks}, step_path(folder, step))
        prune(folder, keep)
    dist.barrier()  # nobody goes on (or dies) before the checkpoint is complete
    return size


def load(path: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_step` (numpy/Python RNG states need pickle)."""
    return torch.load(path, map_location=device, weights_only=False)


def params_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the parameters and buffers (names, dtypes, shapes, bytes), in order."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class StopOnSignal:
    """Note that one of ``names`` (``USR1``, ``TERM``...) arrived; stop every rank after the
    same step.

    A scheduler's warning (Slurm's ``--signal=USR1@60``) or its SIGTERM (preemption, the time
    limit, ``scancel``; torchrun passes it on to its workers) reaches the ranks at different
    moments, or only some of them; a rank that stopped at once would leave the others waiting
    in a collective. So the handler only notes the signal, and after every step
    :meth:`agreed` all-reduces it (MAX): every rank learns in the same step that one got it.
    """

    def __init__(self, names: str | list[str], device: torch.device | str = "cpu") -> None:
        if isinstance(names, str):
            names = names.split(",")
        self.signums = [
            signal.Signals["SIG" + n.strip().upper().removeprefix("SIG")] for n in names
        ]
        self.device = device
        self.got = 0  # the number of the signal that arrived (0: none yet)
        for signum in self.signums:
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.got = max(self.got, signum)

    def agreed(self) -> int:
        """The signal some rank got (0: none). The same answer on every rank (a collective)."""
        flag = torch.tensor([float(self.got)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


def fail_once(folder: str | Path, step: int) -> None:
    """Die by SIGKILL, unless a marker in ``folder`` says this already happened at ``step``.

    The marker is written (and fsync-ed) first, so the restarted worker goes on.
    """
    marker = Path(folder) / f"failed-at-step-{step}"
    if marker.exists():
        return
    with open(marker, "w") as f:
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
