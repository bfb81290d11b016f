"""The digits data set, prepared once per node with the zero-first barrier pattern.

scikit-learn ships the 8x8 handwritten digits (1797 images) inside the package, so the
course never downloads anything. ``prepare_digits`` turns them into a train/test split of
float tensors saved as one ``.pt`` file; ``zero_first`` makes local rank 0 of every node
do that work while the other ranks wait, then lets them read the result.

How this differs from real projects: a real data set is downloaded or decoded, which is
why the pattern exists; here the "expensive" step is a few milliseconds, but the order of
the barriers, and the atomic write that makes two nodes sharing a disk safe, are the same.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

DIGITS_FILE = "digits_v1.pt"
TEST_SIZE = 359  # odd on purpose: DistributedSampler must pad the test set for 2 or 4 ranks
SPLIT_SEED = 0


def local_rank() -> int:
    """This process's index on its node, from the launcher's ``LOCAL_RANK`` (0 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


@contextmanager
def zero_first(rank: int | None = None) -> Iterator[None]:
    """Let ``rank`` 0 (default: the local rank) run the body first, the others after it.

    Every rank calls ``dist.barrier()`` exactly once: the others before the body (they
    wait), rank 0 after it (releasing them). Without a process group it just runs the body.
    The usual key is the *local* rank, so that each node prepares its own copy of the data.
    """
    rank = local_rank() if rank is None else rank
    distributed = dist.is_available() and dist.is_initialized()
    if distributed and rank != 0:
        dist.barrier()
    try:
        yield
    finally:
        # In ``finally``: if rank 0 fails, the others are released (and then fail to load)
        # instead of waiting for the timeout.
        if distributed and rank == 0:
            dist.barrier()


def default_data_dir() -> Path:
    """Where prepared data goes: ``$DDP_LAB_DATA`` or a folder in the system temp dir."""
    return Path(os.environ.get("DDP_LAB_DATA", Path(tempfile.gettempdir()) / "ddp_lab_data"))


def build_digits() -> dict[str, torch.Tensor]:
    """Load scikit-learn's bundled digits, scale to [0, 1], split with a fixed permutation."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    test, train = order[:TEST_SIZE], order[TEST_SIZE:]
    return {
        "x_train": images[train],
        "y_train": labels[train],
        "x_test": images[test],
        "y_test": labels[test],
    }


def prepare_digits(data_dir: str | os.PathLike | None = None) -> Path:
    """Write the digits split to ``data_dir`` unless it is there already; return its path.

    The file is written to a temporary name and renamed: a reader never sees half a file,
    and two writers (two nodes sharing a disk) cannot corrupt it.
    """
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / DIGITS_FILE
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".digits_", suffix=".tmp")
        os.close(fd)
        torch.save(build_digits(), tmp)
        os.replace(tmp, path)
    return path


def load_digits_split(
    data_dir: str | os.PathLike | None = None,
) -> tuple[TensorDataset, TensorDataset]:
    """The prepared (train, test) data sets; prepare them once per node if needed.

    Inside a process group, local rank 0 prepares the file while the other ranks wait at
    a barrier (``zero_first``); then every rank reads it.
    """
    with zero_first():
        if local_rank() == 0:
            prepare_digits(data_dir)
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    tensors = torch.load(folder / DIGITS_FILE, map_location="cpu", weights_only=True)
    return (
        TensorDataset(tensors["x_train"], tensors["y_train"]),
        TensorDataset(tensors["x_test"], tensors["y_test"]),
    )
