"""The four autograd functions behind DataParallel, on simulated devices.

They mirror ``torch/nn/parallel/_functions.py``: each one's backward is another one's
forward, which is what makes DataParallel differentiable end to end:

    Scatter   forward: split a batch to devices     backward: Gather the gradients
    Gather    forward: concatenate on one device    backward: Scatter the gradient
    Broadcast forward: copy parameters to devices   backward: ReduceAddCoalesced (sum)
    ReduceAddCoalesced forward: sum onto one device backward: Broadcast

How they differ from PyTorch's: devices are simulated (see ``_device``), copies are plain
``clone`` calls instead of coalesced NCCL/CUDA copies, and there are no CUDA streams.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd import Function

from ddp_lab.parallel._device import (
    HOST,
    backward_step,
    copy_to,
    device_index,
    get_device,
    record_alloc,
    record_copy,
    tag,
)


class Scatter(Function):
    """Split ``input`` along ``dim`` and copy chunk ``i`` to ``target_gpus[i]``."""

    @staticmethod
    def forward(
        ctx: Any,
        target_gpus: Sequence[Any],
        chunk_sizes: Sequence[int] | None,
        dim: int,
        input: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        target_gpus = [device_index(d) for d in target_gpus]
        ctx.dim = dim
        ctx.input_device = get_device(input)
        ctx.target_gpus = target_gpus
        if chunk_sizes is None:
            # torch.chunk, not an even split: 6 rows on 4 devices give 3 chunks of 2
            chunks = input.chunk(len(target_gpus), dim)
        else:
            chunks = input.split(list(chunk_sizes), dim)
        # a chunk is a view: it lives where the input lives until it is copied
        return tuple(
            copy_to(tag(c, ctx.input_device), d, "scatter")
            for c, d in zip(chunks, target_gpus, strict=False)
        )

    @staticmethod
    def backward(ctx: Any, *grad_output: torch.Tensor) -> tuple[Any, ...]:
        for g, d in zip(grad_output, ctx.target_gpus, strict=False):
            tag(g, d)  # autograd does not carry our device labels
        with backward_step():
            return None, None, None, Gather.apply(ctx.input_device, ctx.dim, *grad_output)


class Gather(Function):
    """Concatenate ``inputs`` along ``dim`` on ``target_device``."""

    @staticmethod
    def forward(ctx: Any, target_device: Any, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        target = device_index(target_device)
        ctx.target_device = target
        ctx.dim = dim
        ctx.input_gpus = tuple(get_device(i) for i in inputs)
        if all(t.dim() == 0 for t in inputs) and dim == 0:
            # same behaviour (and warning) as torch: per-device scalars become a vector
            inputs = tuple(t.view(1) for t in inputs)
            warnings.warn(
                "Was asked to gather along dimension 0, but all input tensors were "
                "scalars; will instead unsqueeze and return a vector.",
                stacklevel=2,
            )
            ctx.unsqueezed_scalar = True
        else:
            ctx.unsqueezed_scalar = False
        ctx.input_sizes = tuple(i.size(dim) for i in inputs)
        for t in inputs:
            record_copy(t, target, "gather")
        out = tag(torch.cat(inputs, dim), target)
        record_alloc("gathered", target, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        tag(grad_output, ctx.target_device)  # autograd does not carry our device labels
        with backward_step():
            grads = Scatter.apply(ctx.input_gpus, ctx.input_sizes, ctx.dim, grad_output)
        if ctx.unsqueezed_scalar:
            grads = tuple(g[0] for g in grads)
        return (None, None, *grads)


class Broadcast(Function):
    """Copy every input to every device in ``target_gpus``; device 0's "copy" is the input.

    The inputs live on ``target_gpus[0]`` (DataParallel requires the module there), so
    the first replica shares storage with the original module, as in PyTorch.
    """

    @staticmethod
    def forward(ctx: Any, target_gpus: Sequence[Any], *inputs: torch.Tensor) -> tuple:
        target_gpus = [device_index(d) for d in target_gpus]
        ctx.target_gpus = target_gpus
        if not inputs:
            return ()
        ctx.num_inputs = len(inputs)
        ctx.input_device = target_gpus[0]
        outputs = broadcast_coalesced(inputs, target_gpus)
        non_differentiable = [
            out[idx]
            for idx, needs in enumerate(ctx.needs_input_grad[1:])
            if not needs
            for out in outputs
        ]
        ctx.mark_non_differentiable(*non_differentiable)
        return tuple(t for device_outputs in outputs for t in device_outputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        n = ctx.num_inputs
        for j, d in enumerate(ctx.target_gpus):
            for g in grad_outputs[j * n : (j + 1) * n]:
                tag(g, d)
        return (None, *ReduceAddCoalesced.apply(ctx.input_device, n, *grad_outputs))


class ReduceAddCoalesced(Function):
    """Sum the k-th tensor of every device's group onto ``destination``.

    ``grads`` holds one group of ``num_inputs`` tensors per device, device after device.
    """

    @staticmethod
    def forward(ctx: Any, destination: Any, num_inputs: int, *grads: torch.Tensor) -> tuple:
        destination = device_index(destination)
        groups = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
        ctx.target_gpus = [get_device(g[0]) for g in groups]
        results = []
        for k in range(num_inputs):
            total = groups[0][k].clone()
            for group in groups[1:]:
                record_copy(group[k], destination, "reduce_add")
                total += group[k]
            results.append(tag(total, destination))
        return tuple(results)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, *Broadcast.apply(ctx.target_gpus, *grad_outputs))


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Sequence[int]
) -> list[list[torch.Tensor]]:
    """Copies of ``tensors`` on each device; the first device gets the tensors themselves.

    Mirrors ``torch.nn.parallel.comm.broadcast_coalesced`` without the coalescing into
    10 MiB buffers (which only saves kernel launches on real GPUs).
    """
    source = devices[0]
    out: list[list[torch.Tensor]] = [list(tensors)]
    for d in devices[1:]:
        copies = []
        for t in tensors:
            src = t.detach()
            if get_device(src) == HOST:
                src = tag(src.view_as(src), source)  # the module is on devices[0]
            copies.append(copy_to(src, d, "broadcast"))
        out.append(copies)
    return out
