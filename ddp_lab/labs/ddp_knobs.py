"""DDP's knobs measured: gradient_as_bucket_view, static_graph, bucket rebuild, find_unused.

``measure_knobs`` (run it inside ``dl.spawn``) builds the same model under each setting of
``DistributedDataParallel`` and measures, in one run:
- the bytes held by gradients and DDP's buckets together, counted as distinct storages
  (with ``gradient_as_bucket_view=True`` each ``param.grad`` is a view into its bucket, so
  the gradients take no memory of their own);
- the buckets of the first three iterations, seen by a pass-through comm hook:
  torch 2.13 puts every parameter in *one* bucket for the first iteration (unless
  ``find_unused_parameters=True`` without ``static_graph``; ``_BucketCapacityConfig.
  compute_bucket_size_limits`` in ``torch/nn/parallel/distributed.py``) and rebuilds the
  buckets after it, in the order the gradients really arrived.

Both are exact counts. Step times are left out on purpose: for this model on a shared CPU
they vary more from run to run (0.8x to 1.5x the default's, for every setting) than the
settings differ.

How this differs from PyTorch: torch exposes no per-storage byte count; this counts tensors
that Python can see (``param.grad`` and the buckets a hook receives).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddp_lab.i18n import _t

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "gradient_as_bucket_view=True": {"gradient_as_bucket_view": True},
    "static_graph=True": {"static_graph": True},
    "find_unused_parameters=True": {"find_unused_parameters": True},
}


class ShuffledMLP(nn.Module):
    """Square layers called in an order that is not their definition order.

    DDP's first buckets follow the definition order (reversed); backward produces
    gradients in the reverse *call* order, which is what the rebuild learns.
    """

    def __init__(self, width: int = 256, depth: int = 12, seed: int = 0) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.order = torch.randperm(depth, generator=torch.Generator().manual_seed(seed)).tolist()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.order:
            x = torch.tanh(self.layers[i](x))
        return x


def _recording_hook(log: list[tuple[int, int, int]]) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    # No annotations: under ``from __future__ import annotations`` they would be strings,
    # and DDP's _check_comm_hook compares them with the dist.GradBucket class itself.
    def record(state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        log.append(
            (bucket.index(), buf.untyped_storage().data_ptr(), buf.untyped_storage().nbytes())
        )
        return allreduce_hook(state, bucket)

    return record


def grad_storage_bytes(model: nn.Module, buckets: list[tuple[int, int, int]]) -> int:
    """Bytes of the distinct storages behind ``param.grad`` and the given buckets."""
    storages = {ptr: nbytes for _, ptr, nbytes in buckets}
    for p in model.parameters():
        if p.grad is not None:
            s = p.grad.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=False)  # keep grads (views into buckets stay views)
    model(x).pow(2).mean().backward()
    opt.step()


def measure_knobs(
    rank: int, width: int = 256, depth: int = 12, bucket_cap_mb: float = 1.0
) -> list[dict[str, Any]]:
    """One row per setting of ``CONFIGS``; see the module docstring."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rows = []
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(rank))
    for name, kwargs in CONFIGS.items():
        torch.manual_seed(0)
        probe = DDP(ShuffledMLP(width, depth), bucket_cap_mb=bucket_cap_mb, **kwargs)
        log: list[tuple[int, int, int]] = []
        probe.register_comm_hook(None, _recording_hook(log))
        opt = torch.optim.SGD(probe.parameters(), lr=1e-3)
        per_iter = []
        for _ in range(3):
            log.clear()
            _step(probe, opt, x)
            per_iter.append(list(log))
        params = sum(p.numel() * p.element_size() for p in probe.parameters())
        rows.append(
            {
                "config": name,
                "param_bytes": params,
                "grad_bytes": grad_storage_bytes(probe, per_iter[-1]),
                "buckets": [len(it) for it in per_iter],
                "bucket_mib_last": [round(n / 2**20, 2) for _, _, n in per_iter[-1]],
            }
        )
    return rows


def format_knob_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``measure_knobs`` rows."""
    lines = [
        _t("| setting | grads + buckets (MiB) | / parameters | buckets in iterations 0, 1, 2 |"),
        "| --- | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['config']}` | {r['grad_bytes'] / 2**20:.2f} | "
            f"{r['grad_bytes'] / r['param_bytes']:.1f}x | {', '.join(map(str, r['buckets']))} |"
        )
    return "\n".join(lines)
