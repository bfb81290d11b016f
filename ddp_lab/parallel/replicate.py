"""``replicate``: one copy of a module per simulated device, differentiable.

Mirrors ``torch.nn.parallel.replicate``: parameters (and buffers that require grad) are
copied with the ``Broadcast`` autograd function, so each replica's parameters are *not*
leaves: backward sends their gradients through ``ReduceAddCoalesced``, which sums them
into the original parameters' ``.grad``. Other buffers (BatchNorm's running stats) are
copied without autograd; the replica on the first device shares them with the original
module, so only that replica's in-place updates survive the step.
How it differs from PyTorch's: no TorchScript support, simulated devices.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from ddp_lab.parallel._device import device_index
from ddp_lab.parallel._functions import Broadcast, broadcast_coalesced

T = TypeVar("T", bound=nn.Module)


def _broadcast_coalesced_reshape(
    tensors: Sequence[torch.Tensor], devices: Sequence[int], detach: bool = False
) -> list[list[torch.Tensor]]:
    """Per device, the copies of ``tensors`` (through autograd unless ``detach``)."""
    if len(tensors) == 0:
        return []
    if detach:
        return broadcast_coalesced(tensors, devices)
    copies = Broadcast.apply(devices, *tensors)  # flat: device after device
    n = len(tensors)
    return [list(copies[i : i + n]) for i in range(0, len(copies), n)]


def replicate(network: T, devices: Sequence[Any], detach: bool = False) -> list[T]:
    """Return one replica of ``network`` per device in ``devices``.

    Args:
        detach: copy without autograd (DataParallel passes True under ``torch.no_grad``).
    """
    if not devices:
        return []
    devices = [device_index(d) for d in devices]
    n = len(devices)

    params = list(network.parameters())
    param_indices = {p: i for i, p in enumerate(params)}
    param_copies = _broadcast_coalesced_reshape(params, devices, detach)

    buffers = list(network.buffers())
    buffers_rg = [b for b in buffers if b.requires_grad and not detach]
    buffers_not_rg = [b for b in buffers if not (b.requires_grad and not detach)]
    idx_rg = {b: i for i, b in enumerate(buffers_rg)}
    idx_not_rg = {b: i for i, b in enumerate(buffers_not_rg)}
    copies_rg = _broadcast_coalesced_reshape(buffers_rg, devices, detach=detach)
    copies_not_rg = _broadcast_coalesced_reshape(buffers_not_rg, devices, detach=True)

    modules = list(network.modules())
    module_indices = {m: i for i, m in enumerate(modules)}
    # a shallow copy of each submodule per device: same code, own attribute dicts
    module_copies: list[list[nn.Module]] = [[] for _ in devices]
    for module in modules:
        for j in range(n):
            replica = module._replicate_for_data_parallel()
            replica._former_parameters = OrderedDict()  # what DDP reads; kept for parity
            module_copies[j].append(replica)

    for i, module in enumerate(modules):
        for key, child in module._modules.items():
            for j in range(n):
                if child is None:
                    module_copies[j][i]._modules[key] = None
                else:
                    setattr(module_copies[j][i], key, module_copies[j][module_indices[child]])
        for key, param in module._parameters.items():
            for j in range(n):
                replica = module_copies[j][i]
                if param is None:
                    replica._parameters[key] = None
                else:
                    copy = param_copies[j][param_indices[param]]
                    # not a Parameter (it has a grad_fn), so it becomes a plain attribute
                    setattr(replica, key, copy)
                    replica._former_parameters[key] = copy
        for key, buf in module._buffers.items():
            for j in range(n):
                replica = module_copies[j][i]
                if buf is None:
                    replica._buffers[key] = None
                elif buf.requires_grad and not detach:
                    setattr(replica, key, copies_rg[j][idx_rg[buf]])
                else:
                    setattr(replica, key, copies_not_rg[j][idx_not_rg[buf]])

    return [module_copies[j][0] for j in range(n)]  # type: ignore[misc]
