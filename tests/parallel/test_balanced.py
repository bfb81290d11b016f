"""Balanced chunk sizes and BalancedDataParallel."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from ddp_lab.parallel import (
    BalancedDataParallel,
    balanced_chunk_sizes,
    default_chunk_sizes,
    trace,
)


@given(batch=st.integers(1, 200), n=st.integers(1, 9))
def test_default_sizes_are_torch_chunk(batch: int, n: int) -> None:
    sizes = [c.shape[0] for c in torch.arange(batch).chunk(n)]  # the oracle
    assert default_chunk_sizes(batch, n) == sizes + [0] * (n - len(sizes))


@given(batch=st.integers(1, 200), n=st.integers(1, 9), g0=st.integers(0, 60))
def test_balanced_sizes_properties(batch: int, n: int, g0: int) -> None:
    sizes = balanced_chunk_sizes(batch, n, g0)
    even = default_chunk_sizes(batch, n)
    assert len(sizes) == n and sum(sizes) == batch and min(sizes) >= 0
    if n == 1 or g0 >= even[0]:
        assert sizes == even
    else:
        assert sizes[0] == g0
        assert max(sizes[1:]) - min(sizes[1:]) <= 1
        assert sizes[1:] == sorted(sizes[1:], reverse=True)  # extras on lower devices


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((52, 3, 16), [16, 18, 18]),
        ((53, 3, 16), [16, 19, 18]),
        ((32, 2, 14), [14, 18]),
        ((10, 4, 2), [2, 3, 3, 2]),  # the notes' rule gives [3, 3, 3, 1]: device 0 over its cap
        ((10, 4, 3), [3, 3, 3, 1]),
        ((3, 4, 0), [0, 1, 1, 1]),
        ((3, 4, 1), [1, 1, 1, 0]),
    ],
)
def test_balanced_examples(args: tuple, expected: list[int]) -> None:
    assert balanced_chunk_sizes(*args) == expected


@pytest.mark.parametrize("args", [(0, 2, 1), (4, 0, 1), (4, 2, -1), (4.0, 2, 1), (4, 2, True)])
def test_bad_arguments(args: tuple) -> None:
    with pytest.raises(ValueError, match=">="):
        balanced_chunk_sizes(*args)


@pytest.mark.parametrize(("batch", "g0"), [(10, 2), (10, 0), (3, 0), (3, 1), (8, 5)])
def test_balanced_dp_matches_one_device(batch: int, g0: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    x = torch.randn(batch, 4, dtype=torch.float64)
    ref = model(x)
    ref.pow(2).sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    dp = BalancedDataParallel(g0, model, device_ids=[0, 1, 2, 3])
    with trace() as tr:
        out = dp(x)
        out.pow(2).sum().backward()
    assert torch.allclose(out, ref)
    for p, g in zip(model.parameters(), ref_grads, strict=True):
        assert torch.allclose(p.grad, g)
    sizes = balanced_chunk_sizes(batch, 4, g0)
    ran_on = sorted(e.src for e in tr.phases() if e.name == "forward")
    assert ran_on == [i for i, s in enumerate(sizes) if s > 0]


def test_needs_a_tensor() -> None:
    with pytest.raises(ValueError, match="tensor"):
        BalancedDataParallel(1, nn.Linear(1, 1))(3)
