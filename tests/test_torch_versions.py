"""What the package does on a torch older than the course's 2.13 (issue 40 item 5; the GPU
machine has torch 2.11): the paths each torch takes, checked on this one. The paths an older
torch takes are reached by hiding the newer API (monkeypatch), as tests/test_one_gpu*.py do."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn

import ddp_lab as dl
from ddp_lab.tools import train_process


def _buckets(rank: int) -> tuple[list[int], list[int], int]:
    """DDP's bucket sizes under ``fixed_buckets``: at construction and after the rebuild."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.tools.train import SmallCNN

    torch.manual_seed(0)
    model = DDP(SmallCNN(), **train_process.fixed_buckets())
    built = model._get_ddp_logging_data()["bucket_sizes"]
    for _ in range(3):  # the rebuild happens in forward 2, the logger sees it in forward 3
        model(torch.randn(2, 1, 8, 8)).sum().backward()
    data = model._get_ddp_logging_data()
    return (
        built,
        data.get("rebuilt_bucket_sizes", data["bucket_sizes"]),
        data["has_rebuilt_buckets"],
    )


def _sizes(text: str | list[int]) -> list[int]:
    return sorted(int(x) for x in text.split(", ")) if isinstance(text, str) else sorted(text)


def test_fixed_buckets_put_each_parameter_alone_before_and_after_the_rebuild() -> None:
    """A bucket per parameter tensor in both layouts. With ``bucket_cap_mb_list=[0]`` torch
    2.11's DDP raised "bucket_cap_mb should be set by now" at construction."""
    from ddp_lab.tools.train import SmallCNN

    assert train_process.fixed_buckets() == {"bucket_cap_mb_list": [train_process.ONE_BYTE_MB]}
    built, rebuilt, _ = dl.spawn(_buckets, nprocs=1, backend="gloo", quiet=True)[0]
    params = sorted(p.numel() * p.element_size() for p in SmallCNN().parameters())
    assert _sizes(built) == params
    assert _sizes(rebuilt) == params


def test_fixed_buckets_on_a_ddp_without_bucket_cap_mb_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An older DDP: find_unused_parameters, and no Python filter pretending to hide torch's
    C++ warning about it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    class OlderDDP(DDP):
        def __init__(self, module: nn.Module, find_unused_parameters: bool = False) -> None:
            super().__init__(module, find_unused_parameters=find_unused_parameters)

    assert "bucket_cap_mb_list" not in inspect.signature(OlderDDP).parameters
    monkeypatch.setattr(train_process, "DDP", OlderDDP)
    with warnings.catch_warnings():
        before = list(warnings.filters)
        assert train_process.fixed_buckets() == {"find_unused_parameters": True}
        assert warnings.filters == before
