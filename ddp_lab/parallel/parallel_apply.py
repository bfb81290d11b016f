"""``parallel_apply``: run each replica on its input in its own thread.

Mirrors ``torch.nn.parallel.parallel_apply``: one Python thread per replica, the caller's
grad mode copied into each thread, outputs returned in replica order, and an exception
in a replica re-raised in the caller with "in replica i on device d" in its message.
How it differs from PyTorch's: no CUDA streams or autocast; the "current device" is
the simulated one (``ddp_lab.parallel.current_device()`` inside ``forward``). The threads
share one interpreter, so Python code in ``forward`` runs one thread at a time (the GIL);
only the time spent inside torch kernels overlaps.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from ddp_lab.i18n import _t
from ddp_lab.parallel._device import (
    HOST,
    count_saved,
    device,
    device_index,
    get_device,
    phase,
    record_alloc,
    tag,
)


def get_a_var(obj: Any) -> torch.Tensor | None:
    """The first tensor found in ``obj`` (depth first), or None."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for result in map(get_a_var, obj):
            if isinstance(result, torch.Tensor):
                return result
    if isinstance(obj, dict):
        for result in map(get_a_var, obj.items()):
            if isinstance(result, torch.Tensor):
                return result
    return None


def _tag_all(obj: Any, dev: int) -> None:
    """Label every tensor in a replica's output with the replica's device."""
    if isinstance(obj, torch.Tensor):
        tag(obj, dev)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tag_all(o, dev)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tag_all(o, dev)


def parallel_apply(
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]] | None = None,
    devices: Sequence[Any] | None = None,
) -> list[Any]:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` in parallel threads; return outputs.

    An element of ``inputs`` that is not a list or tuple is the replica's only argument.
    """
    if len(modules) != len(inputs):
        raise ValueError(
            _t(
                "The number of modules {modules} is not equal to the number of {what} {count}.",
                modules=len(modules),
                what="inputs",
                count=len(inputs),
            )
        )
    if kwargs_tup is not None:
        if len(modules) != len(kwargs_tup):
            raise ValueError(
                _t(
                    "The number of modules {modules} is not equal to the number of {what} {count}.",
                    modules=len(modules),
                    what="kwargs_tup",
                    count=len(kwargs_tup),
                )
            )
    else:
        kwargs_tup = ({},) * len(modules)
    if devices is not None:
        if len(modules) != len(devices):
            raise ValueError(
                _t(
                    "The number of modules {modules} is not equal to the number of {what} {count}.",
                    modules=len(modules),
                    what="devices",
                    count=len(devices),
                )
            )
        devices = [device_index(d) for d in devices]
    else:
        devices = [None] * len(modules)
    lock = threading.Lock()
    results: dict[int, Any] = {}
    grad_enabled = torch.is_grad_enabled()  # grad mode is per thread: pass it on

    def _worker(
        i: int, module: nn.Module, input: Any, kwargs: dict[str, Any], dev: int | None
    ) -> None:
        torch.set_grad_enabled(grad_enabled)
        if dev is None:
            t = get_a_var(input) if get_a_var(input) is not None else get_a_var(kwargs)
            # torch needs a CUDA tensor here; an untagged (host) tensor runs on device i
            dev = i if t is None or get_device(t) == HOST else get_device(t)
        try:
            with device(dev), phase("forward", dev), count_saved(dev, module):
                if not isinstance(input, (list, tuple)):
                    input = (input,)  # also avoids iterating over a tensor's rows
                output = module(*input, **kwargs)
            _tag_all(output, dev)
            record_alloc("output", dev, output)
            with lock:
                results[i] = output
        except Exception:
            with lock:
                results[i] = ExceptionWrapper(where=f"in replica {i} on device {dev}")

    if len(modules) > 1:
        threads = [
            threading.Thread(target=_worker, name=f"replica-{i}", args=(i, m, inp, kw, dev))
            for i, (m, inp, kw, dev) in enumerate(
                zip(modules, inputs, kwargs_tup, devices, strict=True)
            )
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        _worker(0, modules[0], inputs[0], kwargs_tup[0], devices[0])

    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs
