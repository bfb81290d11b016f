"""A mini ``DataParallel`` built from scatter, replicate, parallel_apply and gather.

Same constructor, attributes (``module``, ``device_ids``, ``output_device``, ``dim``) and
overridable methods (``scatter``, ``replicate``, ``parallel_apply``, ``gather``) as
``torch.nn.DataParallel``, so a subclass written for one reads like one for the other.
How it differs from PyTorch's: devices are simulated, so ``device_ids`` defaults to two
devices instead of "all GPUs", the module is not moved anywhere, and each phase of
``forward`` is timed for ``ddp_lab.parallel.trace()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from ddp_lab.i18n import _t
from ddp_lab.parallel._device import device_index, phase
from ddp_lab.parallel.parallel_apply import parallel_apply
from ddp_lab.parallel.replicate import replicate
from ddp_lab.parallel.scatter_gather import gather, scatter_kwargs

T = TypeVar("T", bound=nn.Module)
DEFAULT_DEVICES = (0, 1)


def _check_module(module: Any) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(
            _t(
                "DataParallel wraps an nn.Module (your model), got {kind}. An optimizer "
                "is not a Module: keep it as it is and build it from model.parameters().",
                kind=type(module).__name__,
            )
        )


def _check_devices(device_ids: Sequence[Any]) -> list[int]:
    try:
        ids = [device_index(d) for d in device_ids]
    except (TypeError, ValueError):
        raise ValueError(
            _t(
                "device_ids must be a non-empty list of distinct device indices >= 0, "
                "got {value!r}.",
                value=device_ids,
            )
        ) from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise ValueError(
            _t(
                "device_ids must be a non-empty list of distinct device indices >= 0, "
                "got {value!r}.",
                value=device_ids,
            )
        )
    return ids


class DataParallel(nn.Module, Generic[T]):
    """Run ``module`` on chunks of the batch on several simulated devices, every forward.

    Each call scatters the inputs, replicates the module (a fresh copy every step), runs
    the replicas in threads and gathers their outputs on ``output_device``. Backward sums
    the replicas' parameter gradients into ``module``'s parameters.
    """

    def __init__(
        self,
        module: T,
        device_ids: Sequence[Any] | None = None,
        output_device: Any = None,
        dim: int = 0,
    ) -> None:
        _check_module(module)  # before nn.Module.__init__: a clear error, nothing half-built
        super().__init__()
        self.module = module
        self.device_ids = _check_devices(DEFAULT_DEVICES if device_ids is None else device_ids)
        self.output_device = device_index(
            self.device_ids[0] if output_device is None else output_device
        )
        self.dim = dim

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        with phase("scatter"):
            inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        if not inputs and not module_kwargs:
            inputs, module_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            return self.module(*inputs[0], **module_kwargs[0])
        # a batch smaller than the device count gives fewer chunks: fewer replicas
        with phase("replicate"):
            replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        with phase("gather"):
            return self.gather(outputs, self.output_device)

    def replicate(self, module: T, device_ids: Sequence[Any]) -> list[T]:
        return replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(
        self, inputs: tuple[Any, ...], kwargs: dict[str, Any] | None, device_ids: Sequence[Any]
    ) -> Any:
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(
        self, replicas: Sequence[T], inputs: Sequence[Any], kwargs: Any
    ) -> list[Any]:
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])

    def gather(self, outputs: Any, output_device: Any) -> Any:
        return gather(outputs, output_device, dim=self.dim)


def data_parallel(
    module: nn.Module,
    inputs: Any,
    device_ids: Sequence[Any] | None = None,
    output_device: Any = None,
    dim: int = 0,
    module_kwargs: Any | None = None,
) -> Any:
    """The functional form: one DataParallel forward of ``module`` on ``inputs``."""
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    dp = DataParallel(module, device_ids, output_device, dim)
    return dp(*inputs, **(module_kwargs or {}))
