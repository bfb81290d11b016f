"""Tensor parallelism from scratch: Megatron's column- and row-parallel linear layers.

A linear layer ``y = x W^T + b`` is split across the ranks of a group in one of two ways:

- **column-parallel** (``ColumnParallelLinear``): rank r holds the r-th block of rows of
  ``W`` (a slice of the *output* features) and its slice of ``b``; each rank computes its
  slice of ``y`` from the whole ``x``.
- **row-parallel** (``RowParallelLinear``): rank r holds the r-th block of columns of ``W``
  (a slice of the *input* features); each rank multiplies its slice of ``x`` and the partial
  products are summed with one all-reduce; the bias is added once, after the sum.

Column then row (an MLP's two layers) needs no communication between them: the column
layer's output slice is the row layer's input slice. The two communication operators are
conjugate (Megatron-LM's ``megatron/core/tensor_parallel/mappings.py``):

- ``copy_to_parallel_region`` (Megatron's ``f``): identity forward, all-reduce backward
  (every rank used the whole ``x``; its gradient is the sum of the ranks' contributions);
- ``reduce_from_parallel_region`` (``g``): all-reduce forward, identity backward.

How this differs from PyTorch's: torch's ``ColwiseParallel``/``RowwiseParallel``
(``torch/distributed/tensor/parallel/style.py``) do not write these operators by hand: they
turn the weights into ``DTensor``s with ``Shard(0)``/``Shard(1)`` placements on a
``DeviceMesh``. ``g``'s forward all-reduce is ``RowwiseParallel``'s output turned from
``Partial()`` into ``Replicate()`` (``redistribute_local_tensor`` in
``torch/distributed/tensor/_redistribute.py``, then ``Partial._reduce_value`` in
``placement_types.py``); its backward is the identity because ``_redistribute_backward`` keeps
a ``Replicate`` gradient as it is rather than making it ``Partial`` again. ``f``'s backward
all-reduce comes from ``ColwiseParallel``'s input: ``DTensor.from_local(x, mesh,
[Replicate()])`` (``_FromTorchTensor`` in ``torch/distributed/tensor/_api.py``) gets the input's
gradient back as ``Partial`` and redistributes it to ``Replicate``, only when the input
needs a gradient. The arithmetic is the same. This module uses the eager
``torch.distributed.all_reduce`` (what chapter 10's counter,
``ddp_lab.comm_debug.count_collectives``, sees); widths must divide by the world size
(Megatron's ``divide`` asserts the same).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


class _CopyToParallelRegion(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_parallel_region(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """``f``: the input every rank uses whole; its gradient is summed over the ranks."""
    return _CopyToParallelRegion.apply(x, group)


def reduce_from_parallel_region(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """``g``: the partial sums of the ranks added up; the gradient passes through."""
    return _ReduceFromParallelRegion.apply(x, group)


def _world(group: Any) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


class ColumnParallelLinear(nn.Module):
    """This rank's slice of ``linear``'s output features (rows of its weight).

    ``gather_output=False`` (the default here and Megatron's choice inside an MLP) returns the
    slice; True all-gathers the slices into the whole output (forward only: the gather has
    no backward here, so use it for inference or a last layer without gradient).
    """

    def __init__(
        self,
        linear: nn.Linear,
        group: Any = None,
        gather_output: bool = False,
        copy: Any = copy_to_parallel_region,
    ) -> None:
        super().__init__()
        rank, world = _world(group)
        out = linear.out_features
        if out % world:
            raise ValueError(f"out_features={out} is not divisible by the world size {world}")
        part = out // world
        rows = slice(rank * part, (rank + 1) * part)
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        b = linear.bias
        self.bias = nn.Parameter(b.detach()[rows].clone()) if b is not None else None
        self.group, self.gather_output, self.copy = group, gather_output, copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(self.copy(x, self.group), self.weight, self.bias)
        if not self.gather_output:
            return y
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


class RowParallelLinear(nn.Module):
    """This rank's slice of ``linear``'s input features (columns of its weight).

    The input is this rank's slice already (Megatron's ``input_is_parallel=True``: it comes
    from a ``ColumnParallelLinear``); the partial products are summed by ``reduce`` and the
    bias, whole on every rank, is added after the sum (added before, it would count
    ``world`` times).
    """

    def __init__(self, linear: nn.Linear, group: Any = None, reduce: Any = None) -> None:
        super().__init__()
        rank, world = _world(group)
        n_in = linear.in_features
        if n_in % world:
            raise ValueError(f"in_features={n_in} is not divisible by the world size {world}")
        part = n_in // world
        cols = slice(rank * part, (rank + 1) * part)
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone())
        b = linear.bias
        self.bias = nn.Parameter(b.detach().clone()) if b is not None else None
        self.group = group
        self.reduce = reduce or reduce_from_parallel_region

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.reduce(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class MLP(nn.Module):
    """The two-layer MLP of a transformer block: ``fc2(gelu(fc1(x)))``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TensorParallelMLP(nn.Module):
    """``mlp`` split over the group: ``fc1`` column-parallel, ``fc2`` row-parallel.

    One all-reduce forward (in ``g``) and one backward (in ``f``, only when the input needs a
    gradient) per call, each of the activation's size ``batch x dim``; none between the two
    layers.
    """

    def __init__(self, mlp: MLP, group: Any = None) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1, group)
        self.fc2 = RowParallelLinear(mlp.fc2, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def compare_with_one_process(rank: int, dim: int = 8, hidden: int = 16, batch: int = 4) -> dict:
    """In each rank: the TP MLP against the whole MLP in this process, forward and backward.

    Every rank builds the same MLP (same seed) and the same batch; the whole MLP is the
    oracle. Returns the largest differences of the output, the input's gradient and this
    rank's weight-gradient slices, the collectives' bytes (chapter 10's counter), and the
    elements of the block's input, hidden and output activations on this rank and in the
    whole MLP.
    """
    from ddp_lab.comm_debug import count_collectives

    world = dist.get_world_size()
    torch.manual_seed(0)
    mlp = MLP(dim, hidden).double()
    x = torch.randn(batch, dim, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = mlp(x1)
    want.square().sum().backward()
    tp = TensorParallelMLP(mlp, None)
    with count_collectives() as log:
        got = tp(x2)
        got.square().sum().backward()
    with torch.no_grad():
        hidden_here, hidden_whole = tp.fc1(x).numel(), mlp.fc1(x).numel()
    part, cols = hidden // world, slice(rank * hidden // world, (rank + 1) * hidden // world)
    assert mlp.fc1.weight.grad is not None and mlp.fc2.weight.grad is not None
    diffs = {
        "output": (got - want).abs().max().item(),
        "x.grad": (x2.grad - x1.grad).abs().max().item(),
        "fc1.weight.grad": (tp.fc1.weight.grad - mlp.fc1.weight.grad[cols]).abs().max().item(),
        "fc2.weight.grad": (tp.fc2.weight.grad - mlp.fc2.weight.grad[:, cols]).abs().max().item(),
    }
    return {
        "diffs": diffs,
        "shard": part,
        "calls": [(n, b) for n, _, b in log.calls],
        "params": sum(p.numel() for p in tp.parameters()),
        "activations": {
            "this rank": (x2.numel(), hidden_here, got.numel()),
            "one process": (x1.numel(), hidden_whole, want.numel()),
        },
    }


class _FunctionalCommLog(torch.utils._python_dispatch.TorchDispatchMode):
    """Each collective op DTensor or FSDP dispatches: (op name, bytes of its largest tensor).

    Left out, as torch's ``CommDebugMode`` leaves them out: ``wait_tensor`` (the wait of an
    async functional collective) and ``_wrap_tensor_autograd`` (wraps a result in an
    ``AsyncCollectiveTensor``: ``torch/distributed/_functional_collectives.py``); neither
    sends anything.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        name = func._schema.name
        if (
            name.startswith(("_c10d_functional::", "c10d_functional::", "c10d::"))
            and "wait" not in name
            and "_wrap_tensor_autograd" not in name
        ):
            sizes = [a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)]
            sizes += [t.numel() * t.element_size() for a in args if isinstance(a, list) for t in a
                      if isinstance(t, torch.Tensor)]  # fmt: skip
            self.calls.append((name.split("::")[1], max(sizes, default=0)))
        return func(*args, **(kwargs or {}))


def torch_tp_mlp(rank: int, dim: int = 8, hidden: int = 16, batch: int = 4) -> dict:
    """In each rank: torch's ``parallelize_module`` (``ColwiseParallel`` on ``fc1``,
    ``RowwiseParallel`` on ``fc2``) on a 1D ``DeviceMesh``, against the whole MLP; what it
    sends, op by op, forward and backward apart (the largest tensor of each collective, in
    bytes). The input needs a gradient, as inside a deep model, so that ``f``'s backward
    all-reduce shows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    world = dist.get_world_size()
    torch.manual_seed(0)
    whole = MLP(dim, hidden)
    tp = MLP(dim, hidden)
    tp.load_state_dict(whole.state_dict())
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(tp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(batch, dim)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = whole(x1)
    want.square().sum().backward()
    with _FunctionalCommLog() as forward:
        got = tp(x2)
    with _FunctionalCommLog() as backward:
        got.square().sum().backward()
    w = tp.fc1.weight
    assert x1.grad is not None and x2.grad is not None
    return {
        "output_diff": (got - want).abs().max().item(),
        "x_grad_diff": (x2.grad - x1.grad).abs().max().item(),
        "fc1_grad_diff": (w.grad.full_tensor() - whole.fc1.weight.grad).abs().max().item(),
        "fc1.weight": (
            str(type(w).__name__),
            [str(p) for p in w.placements],
            list(w.to_local().shape),
        ),
        "forward": forward.calls,
        "backward": backward.calls,
    }


def fsdp_x_tp(rank: int, dim: int = 8, hidden: int = 16, batch: int = 4) -> dict:
    """In each of 4 ranks: a 2 x 2 mesh ("dp", "tp"); TP on "tp", ``fully_shard`` on "dp".

    Each DP group gets its own half of the batch; every parameter's gradient is compared with
    the whole MLP's on the whole batch in one process. Returns the weight's placements and
    local shape, and the collectives of the forward and of the backward.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    # "cpu" meshes and an explicit mesh for fully_shard: a "cuda" mesh sets cuda:LOCAL_RANK
    # (device_mesh.py, _setup_world_group_and_device) and fully_shard's default mesh is the
    # accelerator's (_fsdp_init.py, _init_default_mesh); one GPU has no cuda:1
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    whole = MLP(dim, hidden)
    model = MLP(dim, hidden)
    model.load_state_dict(whole.state_dict())
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    x = torch.randn(2 * batch, dim)
    whole(x).square().mean().backward()
    dp_rank = mesh["dp"].get_local_rank()
    mine = x[dp_rank * batch : (dp_rank + 1) * batch]
    with _FunctionalCommLog() as forward:
        loss = model(mine).square().mean()
    with _FunctionalCommLog() as backward:
        loss.backward()
    w = model.fc1.weight
    groups = {
        "dp": sorted(dist.get_process_group_ranks(mesh["dp"].get_group())),
        "tp": sorted(dist.get_process_group_ranks(mesh["tp"].get_group())),
    }
    return {
        "groups": groups,
        "placements": [str(p) for p in w.placements],
        "local_shape": list(w.to_local().shape),
        # every parameter's gradient, gathered whole from its 2D placements
        "grad_diff": max(
            (p.grad.full_tensor() - whole.get_parameter(name).grad).abs().max().item()
            for name, p in model.named_parameters()
        ),
        "forward": forward.calls,
        "backward": backward.calls,
    }


class SeparateQKV(nn.Module):
    """An attention-shaped block with separate ``q``, ``k``, ``v`` projections and an output
    projection ``o`` (a stand-in for self-attention's mixing: ``o(tanh(q) * k + v)``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.tanh(self.q(x)) * self.k(x) + self.v(x))


def torch_tp_separate_qkv(rank: int, dim: int = 8, batch: int = 4) -> dict:
    """In each rank: ``ColwiseParallel`` on each of ``q``, ``k``, ``v`` and ``RowwiseParallel``
    on ``o``, on a 1D mesh; the collectives of the forward and of the backward. Each
    ``ColwiseParallel`` wraps the same input with its own ``from_local``, so each one
    all-reduces the input's gradient: three backward all-reduces where Megatron's fused
    ``linear_qkv`` (one ``ColumnParallelLinear``, one ``f``) has one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    block = SeparateQKV(dim)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel()}
    parallelize_module(block, mesh, {**plan, "o": RowwiseParallel()})
    x = torch.randn(batch, dim, requires_grad=True)
    with _FunctionalCommLog() as forward:
        y = block(x)
    with _FunctionalCommLog() as backward:
        y.square().sum().backward()
    return {"forward": forward.calls, "backward": backward.calls}


def torch_tp_and_2d(rank: int) -> dict:
    """torch's runs in one launch of 4 ranks (DTensor's imports paid once).

    Two of torch's notices are silenced in the ranks: FSDP's warning that a module returned
    a view (an in-place change of it would skip a hook; nothing here changes it), and
    DTensor's note that ``full_tensor()`` of a 2D-sharded gradient takes two all-gathers
    (used here only to compare with one process, outside what is counted).
    """
    import logging
    import warnings

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        warnings.filterwarnings("ignore", message="Full backward hook")
        return {"tp": torch_tp_mlp(rank), "2d": fsdp_x_tp(rank), "qkv": torch_tp_separate_qkv(rank)}
