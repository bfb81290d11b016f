"""The one rule for which device a rank computes on, and which backend ``auto`` means.

Every place that picks a device (``dl.spawn``'s ranks, ``%%ddp``, ``train``, the checkers)
asks this module, so that a lesson runs the same on CPU, on one GPU and on many:

- nccl needs one GPU per rank on the node (NCCL refuses two ranks on one GPU): rank with
  local rank ``r`` uses ``cuda:r``; with fewer visible GPUs than local ranks it is an error,
  raised before any process starts;
- gloo ranks may share GPUs: local rank ``r`` uses ``cuda:(r % gpus)``; with no GPU, CPU;
- ``auto``: ``"cpu:gloo,cuda:nccl"`` when every local rank can have its own GPU (CUDA
  tensors go through nccl, CPU tensors through gloo: ``torch/distributed/distributed_c10d.py``,
  ``BackendConfig``), else ``"gloo"``.

Local ranks are not every rank on this machine: the lab's two "hosts" (network namespaces,
a Slurm cluster of namespaces) or ``torchrun --nnodes=2`` twice on one machine each have one
local rank, and on a one-GPU machine both would take ``cuda:0``, where NCCL refuses them
("Duplicate GPU detected"). ``settle_gpu`` checks that across the group once it exists:
``auto`` (a group made without ``device_id`` starts nccl at its first CUDA collective) then
computes on CPU, through gloo; ``nccl`` alone is a clear error.

``cuda:LOCAL_RANK`` alone (what many scripts do, and what torch's ``DeviceMesh`` does when
``LOCAL_RANK`` is set: ``torch/distributed/device_mesh.py``, ``_setup_world_group_and_device``)
asks for a GPU that a one-GPU machine does not have once there are two ranks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ddp_lab.i18n import _t

MIXED = "cpu:gloo,cuda:nccl"


class DeviceError(ValueError):
    """A backend and a number of ranks this machine's GPUs cannot serve."""


def visible_gpus() -> int:
    """CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applied); 0 without CUDA.

    Neither call initialises torch's CUDA (``torch.cuda.is_initialized()`` stays False), but
    ``is_available`` runs ``cudaGetDeviceCount`` (the driver's ``cuInit``: from then on this
    process keeps the ``CUDA_VISIBLE_DEVICES`` it had), and that call marks the process for
    fork (``poison_fork`` in ``torch/csrc/cuda/Module.cpp``): a child forked after it cannot
    use CUDA. Only ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` makes it ask NVML instead
    (``torch/cuda/__init__.py``). So the launcher may call this in the notebook, and ranks are
    forked from the zygote, which never does.
    """
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def uses_nccl(backend: Any) -> bool:
    """Whether a backend name (``"nccl"``, ``"cpu:gloo,cuda:nccl"``, ...) includes nccl."""
    return backend is not None and "nccl" in str(backend).lower()


def check_nccl(local_ranks: int, gpus: int | None = None) -> None:
    """Raise DeviceError unless every one of ``local_ranks`` ranks can have its own GPU."""
    gpus = visible_gpus() if gpus is None else gpus
    if local_ranks > gpus:
        raise DeviceError(
            _t(
                "The nccl backend needs one CUDA GPU per rank: you asked for {nprocs} "
                "ranks, this machine has {gpus} GPU(s). Use backend='gloo' (runs on CPU) "
                "or 'auto'.",
                nprocs=local_ranks,
                gpus=gpus,
            )
        )


def auto_backend(local_ranks: int, gpus: int | None = None, nccl: bool | None = None) -> str:
    """What ``backend="auto"`` means for ``local_ranks`` ranks on this node.

    ``"cpu:gloo,cuda:nccl"`` when nccl is built in and each rank can have its own GPU (then
    a collective on a CPU tensor goes to gloo, one on a CUDA tensor to nccl); else ``"gloo"``
    (which also moves CUDA tensors, through host memory, for the collectives it implements).
    """
    gpus = visible_gpus() if gpus is None else gpus
    if nccl is None:
        import torch.distributed as dist

        nccl = dist.is_nccl_available()
    return MIXED if nccl and gpus >= local_ranks and gpus > 0 else "gloo"


def rank_device(
    local_rank: int,
    local_ranks: int,
    backend: Any = "gloo",
    gpus: int | None = None,
    use_gpu: bool = True,
) -> Any:
    """The ``torch.device`` of the rank with local rank ``local_rank`` of ``local_ranks``.

    Args:
        backend: with nccl (alone or in a device-typed string) each rank gets its own GPU,
            ``cuda:local_rank``, and too few GPUs raise DeviceError; otherwise GPUs are
            shared round-robin, ``cuda:(local_rank % gpus)``.
        gpus: the visible GPUs (default: ``visible_gpus()``; tests pass a number).
        use_gpu: False keeps a gloo rank on CPU even where GPUs exist (the lessons' CPU ranks).
    """
    import torch

    if not use_gpu and not uses_nccl(backend):
        return torch.device("cpu")  # without asking CUDA anything
    gpus = visible_gpus() if gpus is None else gpus
    if uses_nccl(backend):
        check_nccl(local_ranks, gpus)
        return torch.device("cuda", local_rank)
    if gpus == 0:
        return torch.device("cpu")
    return torch.device("cuda", local_rank % gpus)


def this_rank_device(backend: Any = None, use_gpu: bool = True) -> Any:
    """``rank_device`` for this process, from the launcher's ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE`` (0 and 1 without a launcher) and the process group's backend."""
    if backend is None:
        import torch.distributed as dist

        backend = dist.get_backend() if dist.is_initialized() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1)))
    return rank_device(local_rank, local_ranks, backend, use_gpu=use_gpu)


def shared_gpu(uuids: list[str | None]) -> tuple[int, int] | None:
    """The first two ranks whose devices are the same physical GPU (same UUID), or None."""
    first: dict[str, int] = {}
    for rank, uuid in enumerate(uuids):
        if uuid is None:
            continue
        if uuid in first:
            return first[uuid], rank
        first[uuid] = rank
    return None


def decide_shared(device: Any, backend: Any, uuids: list[str | None]) -> Any:
    """``device`` if no two ranks' GPUs are one physical GPU; else CPU for ``auto``'s mixed
    backend, and a DeviceError for nccl alone."""
    import torch

    pair = shared_gpu(uuids)
    if pair is None:
        return device
    if str(backend) == MIXED:
        return torch.device("cpu")
    raise DeviceError(
        _t(
            "Ranks {a} and {b} would use the same GPU ({uuid}): NCCL needs a GPU of its own "
            "for every rank (several nodes on one machine share its GPUs). Use "
            "backend='gloo' or 'auto'.",
            a=pair[0],
            b=pair[1],
            uuid=uuids[pair[0]],
        )
    )


_UUID_KEY = "ddp_lab_gpu_uuid_"  # + the rank, in the default group's store


def settle_gpu(device: Any, backend: Any = None) -> Any:
    """This rank's device once the process group exists, checked across every rank.

    Every rank must call it: each writes its GPU's UUID to the default group's store and
    reads the others'. Ranks of other nodes on this same machine see its GPUs too: where two
    ranks would share a GPU, ``decide_shared`` says what to do. The store, not a collective:
    with nccl alone an object collective runs on the ranks' GPUs, and the first NCCL call of
    two ranks on one GPU fails inside NCCL ("Duplicate GPU detected") before the clear error
    could be raised.
    """
    import torch
    import torch.distributed as dist

    backend = dist.get_backend() if backend is None else backend
    if not uses_nccl(backend):
        return device
    uuid = ""
    if getattr(device, "type", None) == "cuda":
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    store = dist.distributed_c10d._get_default_store()
    store.set(f"{_UUID_KEY}{dist.get_rank()}", uuid)
    got = [store.get(f"{_UUID_KEY}{r}").decode() for r in range(dist.get_world_size())]
    return decide_shared(device, backend, [u or None for u in got])


@contextmanager
def gpus_hidden() -> Iterator[None]:
    """Ranks launched inside the ``with`` see no GPU (``CUDA_VISIBLE_DEVICES=""``).

    For CPU-only code that torch runs differently when CUDA is available (chapter 10:
    ``powerSGD_hook``'s ``decompress`` calls ``torch.cuda.synchronize(device)`` whenever
    ``torch.cuda.is_available()``, and that raises for a CPU bucket). This process asks
    for its GPUs first: the driver reads the variable once, at ``cuInit``, so its own GPUs
    stay; only ``torch.cuda.device_count()`` inside the ``with``, before torch has
    initialised CUDA here, reads it again (it counts through NVML: ``torch/cuda/__init__.py``)
    and says 0.
    """
    visible_gpus()
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
