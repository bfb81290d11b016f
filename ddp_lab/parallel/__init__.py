"""Teaching versions of ``torch.nn.parallel`` (DataParallel's internals) on simulated devices.

``torch.nn.parallel.scatter``, ``replicate`` and ``gather`` refuse CPU tensors, and
``nn.DataParallel`` on a machine without GPUs just calls the module. These versions keep
PyTorch's names, signatures and autograd semantics but run on the CPU, where device ``i``
is a label on a copied tensor (see ``get_device``). Use ``trace()`` to record what moved
where and how long each phase took.
"""

from __future__ import annotations

from ddp_lab.parallel._device import (
    HOST,
    Trace,
    current_device,
    device,
    get_device,
    trace,
)
from ddp_lab.parallel._functions import Broadcast, Gather, ReduceAddCoalesced, Scatter
from ddp_lab.parallel.balanced import (
    BalancedDataParallel,
    balanced_chunk_sizes,
    default_chunk_sizes,
)
from ddp_lab.parallel.data_parallel import DataParallel, data_parallel
from ddp_lab.parallel.parallel_apply import get_a_var, parallel_apply
from ddp_lab.parallel.replicate import replicate
from ddp_lab.parallel.scatter_gather import gather, scatter, scatter_kwargs

__all__ = [
    "HOST",
    "BalancedDataParallel",
    "Broadcast",
    "DataParallel",
    "Gather",
    "ReduceAddCoalesced",
    "Scatter",
    "Trace",
    "balanced_chunk_sizes",
    "current_device",
    "data_parallel",
    "default_chunk_sizes",
    "device",
    "gather",
    "get_a_var",
    "get_device",
    "parallel_apply",
    "replicate",
    "scatter",
    "scatter_kwargs",
    "trace",
]
