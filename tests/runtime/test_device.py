"""The one device rule (ddp_lab/runtime/device.py): faked GPU counts on CPU, real GPUs under
``-m gpu``."""

from __future__ import annotations

import pytest
import torch

from ddp_lab.runtime import device, launcher


@pytest.mark.parametrize(
    ("gpus", "ranks", "want"),
    [
        (0, 2, ["cpu", "cpu"]),
        (1, 4, ["cuda:0", "cuda:0", "cuda:0", "cuda:0"]),
        (2, 3, ["cuda:0", "cuda:1", "cuda:0"]),
        (8, 2, ["cuda:0", "cuda:1"]),
    ],
)
def test_gloo_ranks_share_the_gpus_round_robin(gpus: int, ranks: int, want: list[str]) -> None:
    got = [str(device.rank_device(r, ranks, "gloo", gpus=gpus)) for r in range(ranks)]
    assert got == want


def test_gloo_ranks_stay_on_cpu_when_asked() -> None:
    assert str(device.rank_device(1, 2, "gloo", gpus=4, use_gpu=False)) == "cpu"


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_nccl_gives_each_rank_its_own_gpu(backend: str) -> None:
    assert [str(device.rank_device(r, 2, backend, gpus=2)) for r in range(2)] == [
        "cuda:0",
        "cuda:1",
    ]


@pytest.mark.parametrize("gpus", [0, 1])
def test_nccl_with_too_few_gpus_is_a_clear_error(gpus: int) -> None:
    with pytest.raises(device.DeviceError, match=f"2 ranks, this machine has {gpus} GPU"):
        device.rank_device(1, 2, "nccl", gpus=gpus)


def test_cuda_local_rank_would_ask_for_a_missing_gpu() -> None:
    """The bug the rule replaces: ``cuda:RANK`` on one GPU names cuda:1 for rank 1."""
    assert device.rank_device(1, 2, "gloo", gpus=1).index == 0


@pytest.mark.parametrize(
    ("gpus", "ranks", "nccl", "want"),
    [
        (0, 1, True, "gloo"),
        (1, 1, True, "cpu:gloo,cuda:nccl"),
        (1, 2, True, "gloo"),
        (2, 2, True, "cpu:gloo,cuda:nccl"),
        (2, 2, False, "gloo"),
    ],
)
def test_auto_backend(gpus: int, ranks: int, nccl: bool, want: str) -> None:
    assert device.auto_backend(ranks, gpus, nccl) == want


def test_mixed_backend_string_is_what_torch_parses() -> None:
    """torch's BackendConfig maps cpu to gloo and cuda to nccl for the 'auto' string."""
    from torch.distributed.distributed_c10d import BackendConfig

    config = BackendConfig(device.MIXED)
    assert config.get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}


def test_resolve_backend_uses_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(launcher, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert launcher.resolve_backend("auto", 1) == device.MIXED
    assert launcher.resolve_backend("auto", 2) == "gloo"
    with pytest.raises(ValueError, match="one CUDA GPU per rank"):
        launcher.resolve_backend("nccl", 2)


def test_uses_nccl() -> None:
    assert device.uses_nccl("nccl") and device.uses_nccl(device.MIXED)
    assert not device.uses_nccl("gloo") and not device.uses_nccl(None)


def test_this_rank_device_reads_the_launchers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(device, "visible_gpus", lambda: 2)
    assert str(device.this_rank_device("gloo")) == "cuda:1"
    with pytest.raises(device.DeviceError):
        device.this_rank_device("nccl")


def test_spawned_gloo_ranks_compute_on_cpu() -> None:
    import ddp_lab as dl

    assert dl.spawn(_device_of_rank, nprocs=2, backend="auto") == [
        ("cpu", "gloo"),
        ("cpu", "gloo"),
    ]


def _device_of_rank(rank: int) -> tuple[str, str]:
    import torch.distributed as dist

    return str(device.this_rank_device(dist.get_backend(), use_gpu=False)), dist.get_backend()


def test_shared_gpu_finds_the_first_pair() -> None:
    assert device.shared_gpu(["a", "b", None, None]) is None
    assert device.shared_gpu(["a", "b", "c", "b", "a"]) == (1, 3)


def test_two_nodes_on_one_gpu_compute_on_cpu_with_auto_and_fail_with_nccl() -> None:
    """torchrun --nnodes=2 --nproc-per-node=1 twice on a one-GPU machine (the lab's "hosts"):
    each node's one local rank takes cuda:0, where NCCL would refuse the second
    ("Duplicate GPU detected")."""
    gpu = torch.device("cuda", 0)
    assert device.decide_shared(gpu, device.MIXED, ["GPU-1", "GPU-1"]) == torch.device("cpu")
    assert device.decide_shared(gpu, device.MIXED, ["GPU-1", "GPU-2"]) == gpu
    with pytest.raises(device.DeviceError, match="Ranks 0 and 1 would use the same GPU"):
        device.decide_shared(gpu, "nccl", ["GPU-1", "GPU-1"])


@pytest.mark.parametrize(
    ("backend", "uuids", "want"),
    [
        (device.MIXED, ["GPU-0", "GPU-0"], ["cpu", "cpu"]),
        (device.MIXED, ["GPU-0", "GPU-1"], ["cuda:0", "cuda:1"]),
        ("nccl", ["GPU-0", "GPU-0"], ["DeviceError", "DeviceError"]),
        ("gloo", ["GPU-0", "GPU-0"], ["cuda:0", "cuda:1"]),  # gloo ranks may share
    ],
)
def test_settle_gpu_agrees_across_the_group(backend: str, uuids: list, want: list) -> None:
    import ddp_lab as dl

    assert dl.spawn(_settled, args=(backend, uuids), nprocs=2, backend="gloo") == want


def _settled(rank: int, backend: str, uuids: list) -> str:
    from types import SimpleNamespace

    import torch.distributed as dist

    # This rank's torch, faked as if each rank had the GPU named in ``uuids``.
    torch.cuda.get_device_properties = lambda d: SimpleNamespace(uuid=uuids[rank])
    torch.cuda.set_device = lambda d: None

    def no_collective(*args: object, **kw: object) -> None:
        # with nccl alone, NCCL itself would fail first on two ranks of one GPU
        raise AssertionError("settle_gpu ran a collective")

    dist.all_gather_object = dist.all_gather = no_collective
    try:
        return str(device.settle_gpu(torch.device("cuda", rank), backend))
    except device.DeviceError:
        return "DeviceError"


# ----- on a real GPU ----------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_auto_one_rank_reduces_cpu_and_cuda_tensors() -> None:
    """Item 10: backend='auto' with one rank on a GPU machine handles both kinds of tensor."""
    import ddp_lab as dl

    assert dl.spawn(_both_kinds, nprocs=1, backend="auto") == [([1.0, 1.0], [1.0, 1.0])]


def _both_kinds(rank: int) -> tuple[list[float], list[float]]:
    import torch.distributed as dist

    cpu, gpu = torch.ones(2), torch.ones(2, device="cuda")
    dist.all_reduce(cpu)
    dist.all_reduce(gpu)
    return cpu.tolist(), gpu.cpu().tolist()


@pytest.mark.gpu
def test_gpu_more_gloo_ranks_than_gpus_share_them() -> None:
    import ddp_lab as dl

    n = torch.cuda.device_count() + 1
    got = dl.spawn(_shared_gpu, nprocs=n, backend="gloo")
    assert got == [(f"cuda:{r % (n - 1)}", float(n)) for r in range(n)]


def _shared_gpu(rank: int) -> tuple[str, float]:
    import torch.distributed as dist

    where = device.this_rank_device("gloo")
    t = torch.ones(1, device=where)
    dist.all_reduce(t)
    return str(t.device), t.item()
