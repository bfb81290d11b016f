"""Mini DataParallel against the single-device model (the oracle)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ddp_lab.parallel import DataParallel, data_parallel, get_device, trace


def _cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 4)
    ).double()


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 9), n=st.integers(1, 4))
def test_outputs_and_gradients_match_one_device(batch: int, n: int) -> None:
    model = _cnn()
    x = torch.randn(batch, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 4, (batch,))
    ref = model(x)
    nn.functional.cross_entropy(ref, y).backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out = DataParallel(model, device_ids=list(range(n)))(x)
    nn.functional.cross_entropy(out, y).backward()
    assert torch.allclose(out, ref)
    for p, g in zip(model.parameters(), ref_grads, strict=True):
        assert torch.allclose(p.grad, g)


def test_training_steps_match_one_device() -> None:
    a = _cnn()
    b = copy.deepcopy(a)
    dp = DataParallel(b, device_ids=[0, 1, 2])
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(dp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(10, 1, 8, 8, dtype=torch.float64, generator=gen)
        y = torch.randint(0, 4, (10,), generator=gen)
        for model, opt in ((a, opt_a), (dp, opt_b)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q)


def test_batchnorm_normalises_each_chunk_and_keeps_device0_stats() -> None:
    torch.manual_seed(2)
    bn = nn.BatchNorm1d(3).double()
    x = torch.randn(8, 3, dtype=torch.float64) * 3 + 1
    single = copy.deepcopy(bn)
    chunk0 = copy.deepcopy(bn)
    out = DataParallel(bn, device_ids=[0, 1])(x)
    # each replica normalises with its own chunk's statistics, not the whole batch's
    expected = torch.cat([copy.deepcopy(single)(c) for c in x.chunk(2)])
    assert torch.allclose(out, expected)
    assert not torch.allclose(out, single(x))
    # only device 0's replica shares buffers with the module: its chunk's stats survive
    chunk0(x[:4])
    assert torch.allclose(bn.running_mean, chunk0.running_mean)
    assert int(bn.num_batches_tracked) == 1
    bn.eval()
    single.eval()
    single.load_state_dict(bn.state_dict())
    assert torch.allclose(DataParallel(bn, device_ids=[0, 1])(x), single(x))


def test_module_prefix_and_loading() -> None:
    model = _cnn()
    dp = DataParallel(model)
    assert dp.module is model
    assert all(k.startswith("module.") for k in dp.state_dict())
    with pytest.raises(RuntimeError, match="Missing key"):
        dp.load_state_dict(model.state_dict())
    dp.module.load_state_dict(model.state_dict())


def test_per_device_losses_are_gathered_into_a_vector() -> None:
    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 1).double()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (self.lin(x).squeeze(1) - y).pow(2).mean()

    torch.manual_seed(3)
    m = WithLoss()
    x, y = torch.randn(6, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    with pytest.warns(UserWarning, match="scalars"):
        losses = DataParallel(m, device_ids=[0, 1, 2])(x, y=y)
    assert losses.shape == (3,) and get_device(losses) == 0
    # equal chunks: the mean of per-device means is the full-batch mean
    assert torch.allclose(losses.mean(), m(x, y))


def test_kwargs_and_non_tensor_arguments() -> None:
    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, *, scale: float, extra: dict) -> torch.Tensor:
            return x * scale + extra["b"]

    x = torch.arange(6.0).view(6, 1)
    out = DataParallel(Scaled(), [0, 1])(x, scale=2.0, extra={"b": torch.ones(6, 1)})
    assert torch.equal(out, x * 2 + 1)


def test_each_forward_replicates_again() -> None:
    dp = DataParallel(_cnn(), [0, 1])
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    with trace() as tr:
        dp(x)
        dp(x)
    assert [e.name for e in tr.phases()].count("replicate") == 2


@pytest.mark.parametrize(
    "bad", [torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), "model", None]
)
def test_rejects_non_modules(bad: object) -> None:
    with pytest.raises(TypeError, match="nn.Module"):
        DataParallel(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("ids", [[], [0, 0], [-1, 0], ["x"]])
def test_rejects_bad_device_ids(ids: list) -> None:
    with pytest.raises(ValueError, match="device_ids"):
        DataParallel(nn.Linear(1, 1), device_ids=ids)


def test_functional_form() -> None:
    m = nn.Linear(3, 2)
    x = torch.randn(5, 3)
    assert torch.allclose(data_parallel(m, x, [0, 1, 2]), m(x))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for nn.DataParallel")
def test_same_as_torch_data_parallel_on_gpus() -> None:
    model = _cnn().float().cuda()
    x = torch.randn(6, 1, 8, 8, device="cuda")
    theirs = nn.DataParallel(model, device_ids=[0, 1])(x)
    ours = DataParallel(copy.deepcopy(model).cpu(), [0, 1])(x.cpu())
    assert torch.allclose(ours, theirs.cpu(), atol=1e-5)
