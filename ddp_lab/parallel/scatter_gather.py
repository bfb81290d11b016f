"""``scatter``, ``scatter_kwargs`` and ``gather`` on simulated devices.

Same names, signatures and nesting rules as ``torch.nn.parallel.scatter_gather``:
tensors are split along ``dim``; tuples, lists, dicts and namedtuples are walked; any
other object is passed by reference to every device. How it differs from PyTorch's:
devices are simulated CPU labels, and ``scatter``/``scatter_kwargs`` take an extra
keyword ``chunk_sizes`` (PyTorch only has it on the internal ``Scatter`` function) so
that a balanced DataParallel can use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ddp_lab.i18n import _t
from ddp_lab.parallel._functions import Gather, Scatter


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def _check_chunk_sizes(obj: Any, chunk_sizes: Sequence[int], n: int, dim: int) -> None:
    """Fail before anything is copied, as torch's C++ scatter does."""
    sizes = list(chunk_sizes)
    if (
        len(sizes) != n
        or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes)
        or sum(sizes) != obj.size(dim)
    ):
        raise ValueError(
            _t(
                "chunk_sizes must be {count} positive integers that add up to {total} "
                "(the size of dim {dim}), got {value!r}.",
                count=n,
                total=obj.size(dim),
                dim=dim,
                value=chunk_sizes,
            )
        )


def scatter(
    inputs: Any,
    target_gpus: Sequence[Any],
    dim: int = 0,
    *,
    chunk_sizes: Sequence[int] | None = None,
) -> Any:
    """Split every tensor in ``inputs`` into chunks, one per device; copy other objects.

    A tensor gives a tuple of chunks; a tuple/list/dict gives a list with one tuple/list/dict
    per device. There can be fewer chunks than devices (``torch.chunk`` rounds the chunk size
    up), and ``zip`` then drops the devices left without a chunk.
    """

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if chunk_sizes is not None:
                _check_chunk_sizes(obj, chunk_sizes, len(target_gpus), dim)
            return Scatter.apply(target_gpus, chunk_sizes, dim, obj)
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj), strict=False))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()), strict=False)]
        # a non-tensor (or an empty container) is shared by reference, not copied
        return [obj for _ in target_gpus]

    try:
        return scatter_map(inputs)
    finally:
        scatter_map = None  # type: ignore[assignment]  # break the closure's reference cycle


def scatter_kwargs(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    target_gpus: Sequence[Any],
    dim: int = 0,
    *,
    chunk_sizes: Sequence[int] | None = None,
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword arguments; pad the shorter side with () or {}."""
    scattered_inputs = scatter(inputs, target_gpus, dim, chunk_sizes=chunk_sizes) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim, chunk_sizes=chunk_sizes) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(inputs):
        # PyTorch compares with len(inputs) (the number of positional arguments) here,
        # not len(scattered_inputs); kept as is so both behave the same.
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def gather(outputs: Any, target_device: Any, dim: int = 0) -> Any:
    """Concatenate the per-device outputs on ``target_device``, keeping their structure."""

    def gather_map(outputs: Any) -> Any:
        out = outputs[0]
        if isinstance(out, torch.Tensor):
            return Gather.apply(target_device, dim, *outputs)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in outputs):
                raise ValueError(_t("All dicts must have the same number of keys."))
            return type(out)((k, gather_map([d[k] for d in outputs])) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(map(gather_map, zip(*outputs, strict=True)))
        return type(out)(map(gather_map, zip(*outputs, strict=True)))

    try:
        return gather_map(outputs)
    finally:
        gather_map = None  # type: ignore[assignment]
