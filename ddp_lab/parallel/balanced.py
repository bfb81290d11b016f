"""A DataParallel that gives device 0 a smaller chunk, because device 0 does more.

Device 0 holds the original module, the gathered outputs, the loss and the summed
gradients, so with an even split it runs out of memory first. ``balanced_chunk_sizes``
computes a split where device 0 gets at most ``gpu0_bsz`` rows; ``BalancedDataParallel``
uses it. PyTorch has no balanced DataParallel: this follows the idea of the
``BalancedDataParallel`` in transformer-xl, with its chunk-size rule fixed (see below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import nn

from ddp_lab.i18n import _t
from ddp_lab.parallel._device import phase
from ddp_lab.parallel.data_parallel import DataParallel
from ddp_lab.parallel.parallel_apply import get_a_var
from ddp_lab.parallel.scatter_gather import scatter_kwargs


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            _t(
                "{name} must be an integer >= {low}, got {value!r}.",
                name=name,
                value=value,
                low=low,
            )
        )
    return value


def default_chunk_sizes(batch_size: int, num_devices: int) -> list[int]:
    """The rows each device gets from DataParallel's default scatter (``torch.chunk``).

    Every chunk has ``ceil(batch_size / num_devices)`` rows except the last one; devices
    past the last chunk get 0 (and no replica). Example: 10 rows on 4 devices -> [3, 3, 3, 1];
    6 rows on 4 devices -> [2, 2, 2, 0].
    """
    _check_int("batch_size", batch_size, 1)
    _check_int("num_devices", num_devices, 1)
    size = math.ceil(batch_size / num_devices)
    return [max(0, min(size, batch_size - i * size)) for i in range(num_devices)]


def balanced_chunk_sizes(batch_size: int, num_devices: int, gpu0_bsz: int) -> list[int]:
    """Rows per device when device 0 may take at most ``gpu0_bsz`` rows.

    If the default split already gives device 0 no more than ``gpu0_bsz``, it is kept.
    Otherwise device 0 gets exactly ``gpu0_bsz`` and the other devices share the rest as
    evenly as possible, the lower-numbered ones taking one extra row each for the remainder.
    A 0 means the device is not used. One device takes the whole batch.

    The source notes fall back to the default split whenever ``gpu0_bsz`` is not below the
    others' share, which can give device 0 *more* than ``gpu0_bsz`` (10 rows, 4 devices,
    ``gpu0_bsz=2``: [3, 3, 3, 1]); this rule compares with device 0's default share instead.
    """
    even = default_chunk_sizes(batch_size, num_devices)
    _check_int("gpu0_bsz", gpu0_bsz, 0)
    if num_devices == 1 or gpu0_bsz >= even[0]:
        return even
    base, extra = divmod(batch_size - gpu0_bsz, num_devices - 1)
    return [gpu0_bsz] + [base + (1 if i < extra else 0) for i in range(num_devices - 1)]


class BalancedDataParallel(DataParallel):
    """DataParallel whose device 0 gets at most ``gpu0_bsz`` rows of each batch.

    Same arguments as DataParallel after ``gpu0_bsz`` (the order the source notes use).
    """

    def __init__(
        self,
        gpu0_bsz: int,
        module: nn.Module,
        device_ids: Sequence[Any] | None = None,
        output_device: Any = None,
        dim: int = 0,
    ) -> None:
        self_gpu0 = _check_int("gpu0_bsz", gpu0_bsz, 0)
        super().__init__(module, device_ids, output_device, dim)
        self.gpu0_bsz = self_gpu0

    def chunk_sizes(self, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
        """This batch's rows per device (the batch size comes from the first tensor)."""
        t = get_a_var(inputs) if get_a_var(inputs) is not None else get_a_var(kwargs)
        if t is None:
            raise ValueError(
                _t(
                    "BalancedDataParallel needs at least one tensor argument to find the "
                    "batch size."
                )
            )
        return balanced_chunk_sizes(t.size(self.dim), len(self.device_ids), self.gpu0_bsz)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        sizes = self.chunk_sizes(inputs, kwargs)
        used = [i for i, s in enumerate(sizes) if s > 0]
        with phase("scatter"):
            inputs, module_kwargs = scatter_kwargs(
                inputs,
                kwargs,
                [self.device_ids[i] for i in used],
                self.dim,
                chunk_sizes=[sizes[i] for i in used],
            )
        if len(used) == 1 and used[0] == 0:
            return self.module(*inputs[0], **module_kwargs[0])
        with phase("replicate"):
            # replicate from device 0 (where the module lives), then drop unused replicas
            replicas = self.replicate(self.module, self.device_ids[: used[-1] + 1])
        replicas = [replicas[i] for i in used]
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        with phase("gather"):
            return self.gather(outputs, self.output_device)

    def parallel_apply(
        self, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any
    ) -> list[Any]:
        from ddp_lab.parallel.parallel_apply import parallel_apply

        # the devices come from the scattered inputs (device 0 may have been skipped)
        return parallel_apply(replicas, inputs, kwargs)
