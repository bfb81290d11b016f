"""FullyShardedDP against single-process training on the full batch and torch's fully_shard."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from ddp_lab.fsdp import FullyShardedDP
from ddp_lab.runtime.launcher import spawn
from ddp_lab.tools.doctor_facts import OLD_COLLECTIVE_NAMES


class Block(nn.Module):
    """Two layers that share one weight (tied inside one unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(3, 3), nn.Linear(3, 3)
        self.dec.weight = self.enc.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.tanh(self.enc(x)))


class Tied(nn.Module):
    """A root-owned parameter, tied weights inside a unit, a ModuleList, odd sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5, -0.5, 2.0]))
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x * self.scale))
        return self.head(x)


def mlp(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _make_opt(name: str, params: object) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)


def _vs_single(rank: int, world: int, make: object, opt_name: str, steps: int = 3) -> float:
    torch.manual_seed(0)
    net = make().double()
    ref = copy.deepcopy(net)
    model = FullyShardedDP(net)
    opt, opt_ref = _make_opt(opt_name, model.parameters()), _make_opt(opt_name, ref.parameters())
    d_in = next(ref.parameters()).shape[-1] if not isinstance(ref, Tied) else 3
    d_out = ref(torch.zeros(1, d_in, dtype=torch.float64)).shape[-1]
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(world * 3, d_in, generator=gen, dtype=torch.float64)
        y = torch.randn(world * 3, d_out, generator=gen, dtype=torch.float64)
        mine = slice(rank * 3, rank * 3 + 3)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
        opt_ref.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        opt_ref.step()
    full = model.full_state_dict()
    assert list(full) == list(ref.state_dict())
    return max((full[k] - v).abs().max().item() for k, v in ref.state_dict().items())


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_matches_single_process_training(world: int, opt_name: str) -> None:
    diffs = spawn(
        _vs_single, args=(world, Tied, opt_name), nprocs=world, backend="gloo", quiet=True
    )
    assert max(diffs) < 1e-12


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.integers(1, 9), min_size=2, max_size=4), world=st.sampled_from([2, 3]))
def test_awkward_shapes(widths: list[int], world: int) -> None:
    make = lambda: mlp(widths)  # noqa: E731
    diffs = spawn(_vs_single, args=(world, make, "adamw"), nprocs=world, backend="gloo", quiet=True)
    assert max(diffs) < 1e-12


@contextlib.contextmanager
def _as_if_one_gpu(on: bool) -> Iterator[None]:
    """This rank's torch answers as on a one-GPU machine (what fully_shard's default mesh
    and DeviceMesh ask: ``torch/distributed/fsdp/_fully_shard/_fsdp_init.py``,
    ``_init_default_mesh``; ``torch/distributed/device_mesh.py``) while the meshes and
    ``fully_shard`` are set up, and no longer: an optimizer's step then asks the real CUDA
    (``Optimizer._accelerator_graph_capture_health_check``), which a CUDA build of torch on a
    machine without a driver cannot answer."""
    saved = (torch.cuda.is_available, torch.cuda.device_count, torch._C._get_accelerator)
    if on:
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        torch._C._get_accelerator = lambda: torch.device("cuda")
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.device_count, torch._C._get_accelerator = saved


def _vs_fully_shard(rank: int, world: int, one_gpu: bool = False) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ddp_lab.runtime.device import this_rank_device

    torch.manual_seed(0)
    net = mlp([5, 7, 3, 2])
    theirs = copy.deepcopy(net)
    ours = FullyShardedDP(net)
    with _as_if_one_gpu(one_gpu):
        # The ranks compute on CPU (the one rule); fully_shard's default mesh would be the
        # accelerator's, and DeviceMesh would then set cuda:LOCAL_RANK, a GPU rank 1 lacks.
        mesh = init_device_mesh(this_rank_device("gloo", use_gpu=False).type, (world,))
        for layer in theirs:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(theirs, mesh=mesh)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.1) for m in (ours, theirs)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(world * 4, 5, generator=gen), torch.randn(world * 4, 2, generator=gen)
        mine = slice(rank * 4, rank * 4 + 4)
        for m, o in zip((ours, theirs), opts, strict=True):
            o.zero_grad()
            nn.functional.mse_loss(m(x[mine]), y[mine]).backward()
            o.step()
    full = ours.full_state_dict()
    return max((full[n] - p.full_tensor()).abs().max().item() for n, p in theirs.named_parameters())


@pytest.mark.parametrize(("world", "one_gpu"), [(2, False), (3, False), (2, True)])
def test_matches_torch_fully_shard(world: int, one_gpu: bool) -> None:
    diffs = spawn(_vs_fully_shard, args=(world, one_gpu), nprocs=world, backend="gloo", quiet=True)
    assert max(diffs) < 1e-6


def _collectives(rank: int) -> dict[str, object]:
    calls: list[tuple[str, torch.dtype, int]] = []
    patched = {}
    # Recorded under torch 2.13's names; a torch without them (2.11) runs the old ones.
    names = {"all_reduce": "all_reduce", "broadcast": "broadcast", **OLD_COLLECTIVE_NAMES}
    for name, old_name in names.items():
        attr = name if hasattr(dist, name) else old_name
        real = getattr(dist, attr)

        def watch(*args: object, _real: object = real, _name: str = name, **kw: object) -> object:
            t = args[0] if _name in ("all_reduce", "broadcast") else args[1]
            calls.append((_name, t.dtype, t.numel()))
            return _real(*args, **kw)

        patched[attr] = real
        setattr(dist, attr, watch)
    try:
        torch.manual_seed(0)
        model = FullyShardedDP(mlp([6, 8, 4]), compute_dtype=torch.bfloat16)
        calls.clear()  # not the initial broadcast
        out = model(torch.randn(3, 6))
        out.float().pow(2).mean().backward()
    finally:
        for name, real in patched.items():
            setattr(dist, name, real)
    return {
        "calls": calls,
        "out": out.dtype,
        "shard": [p.dtype for p in model.parameters()],
        "grad": [p.grad.dtype for p in model.parameters()],
        "peak": model.peak_gathered_bytes,
    }


def test_reduce_scatters_in_compute_dtype_and_keeps_float32_masters() -> None:
    r = spawn(_collectives, nprocs=2, backend="gloo", quiet=True)[0]
    kinds = [c[0] for c in r["calls"]]
    # forward: gather unit 0, unit 1; backward: gather 1 again, reduce-scatter 1, gather 0, ...
    assert kinds == [
        "all_gather_single",
        "all_gather_single",
        "all_gather_single",
        "reduce_scatter_single",
        "all_gather_single",
        "reduce_scatter_single",
    ]
    assert all(c[1] == torch.bfloat16 for c in r["calls"])
    assert r["out"] == torch.bfloat16
    assert r["shard"] == [torch.float32, torch.float32] == r["grad"]
    # one unit gathered at a time: the larger one, 6*8+8 = 56 elements, in bf16
    assert r["peak"] == 56 * 2


def test_rejects_frozen_parameters() -> None:
    def frozen(rank: int) -> str:
        net = mlp([2, 2])
        net[0].weight.requires_grad_(False)
        try:
            FullyShardedDP(net)
        except ValueError as err:
            return str(err)
        return ""

    assert all("frozen" in m for m in spawn(frozen, nprocs=2, backend="gloo", quiet=True))


def _two_forwards(rank: int, world: int) -> float:
    """loss = m(x1) + m(x2), one backward: each call regathered and reduced on its own."""
    torch.manual_seed(0)
    net = mlp([3, 7, 2]).double()
    ref = copy.deepcopy(net)
    model = FullyShardedDP(net)
    opt, opt_ref = (
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.optim.SGD(ref.parameters(), lr=0.1),
    )
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        x1, x2 = (torch.randn(world * 2, 3, generator=gen, dtype=torch.float64) for _ in range(2))
        mine = slice(rank * 2, rank * 2 + 2)
        opt.zero_grad()
        (model(x1[mine]).pow(2).mean() + model(x2[mine]).sin().mean()).backward()
        opt.step()
        opt_ref.zero_grad()
        (ref(x1).pow(2).mean() + ref(x2).sin().mean()).backward()
        opt_ref.step()
    full = model.full_state_dict()
    return max((full[k] - v).abs().max().item() for k, v in ref.state_dict().items())


def test_two_forwards_before_one_backward() -> None:
    # Before each call kept its own gathered vector, the second forward replaced the first's
    # and backward failed with "setStorage: ... out of bounds for storage of size 0".
    diffs = spawn(_two_forwards, args=(2,), nprocs=2, backend="gloo", quiet=True)
    assert max(diffs) < 1e-12
