"""Memory per rank: the ZeRO paper's model, and bytes counted on real ranks.

The ZeRO paper (Rajbhandari et al., 2019, arXiv:1910.02054, section 3) counts, for a
model with Psi parameters trained with mixed-precision Adam: 2 Psi bytes of fp16
parameters, 2 Psi of fp16 gradients and K Psi of optimizer state, K = 12 (an fp32 copy
of the parameters, momentum and variance, 4 bytes each). ZeRO stage 1 divides the K term
by the number of ranks N, stage 2 the gradients too, stage 3 the parameters too.

``measure_memory`` (inside ``dl.spawn``) counts the bytes of the tensors each rank really
holds under DDP, ``ShardedOptimizer`` (ZeRO-1) and ``FullyShardedDP`` (ZeRO-3), float32
AdamW (so K = 8 and 4 + 4 bytes for parameters and gradients). Activations are left out:
they are the same for all three.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddp_lab.i18n import _t

STAGES = {0: "DDP", 1: "ZeRO-1 (P_os)", 2: "ZeRO-2 (P_os+g)", 3: "ZeRO-3 / FSDP (P_os+g+p)"}


def zero_bytes_per_rank(
    psi: float, n: int, stage: int, k: float = 12, param_bytes: float = 2, grad_bytes: float = 2
) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state for a ZeRO stage."""
    params = param_bytes * psi / (n if stage >= 3 else 1)
    grads = grad_bytes * psi / (n if stage >= 2 else 1)
    optim = k * psi / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optim": optim, "total": params + grads + optim}


def paper_example(psi: float = 7.5e9, n: int = 64) -> list[tuple[str, float]]:
    """The example of the paper's Figure 1: (stage, GB per rank)."""
    return [(STAGES[s], zero_bytes_per_rank(psi, n, s)["total"] / 1e9) for s in STAGES]


def tensor_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind some tensors (views counted once)."""
    storages: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for state in opt.state.values() for v in state.values())


def memory_mlp(width: int = 512, depth: int = 4) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def measure_memory(rank: int, width: int = 512, depth: int = 4) -> list[dict[str, Any]]:
    """Bytes this rank holds after two AdamW steps, under DDP, ZeRO-1 and FSDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.fsdp import FullyShardedDP
    from ddp_lab.zero import ShardedOptimizer

    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
    rows = []
    for name in ("DDP", "ZeRO-1", "FSDP"):
        torch.manual_seed(0)
        if name == "FSDP":
            model: nn.Module = FullyShardedDP(memory_mlp(width, depth))
            opt: Any = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            model = DDP(memory_mlp(width, depth), gradient_as_bucket_view=True)
            if name == "DDP":
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            else:
                opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            model(x).pow(2).mean().backward()
            opt.step()
        params = list(model.parameters())
        row = {
            "method": name,
            "psi": sum(p.numel() for p in memory_mlp(width, depth).parameters()),
            "params": tensor_bytes(params),
            "grads": tensor_bytes(p.grad for p in params),
            "optim": optimizer_state_bytes(opt.optim if name == "ZeRO-1" else opt),
            "gathered_peak": model.peak_gathered_bytes if name == "FSDP" else 0,
        }
        row["total"] = row["params"] + row["grads"] + row["optim"] + row["gathered_peak"]
        rows.append(row)
    return rows


def worst_rank(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """For each method, the row of the rank that holds the most bytes (the one that
    runs out of memory first)."""
    return [max(rows, key=lambda r: r["total"]) for rows in zip(*per_rank, strict=True)]


def plot_memory(measured: dict[int, list[dict[str, Any]]], ax: Any = None) -> Any:
    """Counted MiB per rank against N, with the model's lines (float32 AdamW: 4+4+8).

    ``measured[n]`` holds one row per method, e.g. ``worst_rank`` of a run on n ranks.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    ns = sorted(measured)
    psi = measured[ns[0]][0]["psi"]
    colors = {"DDP": "tab:gray", "ZeRO-1": "tab:blue", "FSDP": "tab:green"}
    stage = {"DDP": 0, "ZeRO-1": 1, "FSDP": 3}
    for method, color in colors.items():
        counted = [next(r for r in measured[n] if r["method"] == method)["total"] for n in ns]
        ax.plot(ns, [b / 2**20 for b in counted], "o", color=color, label=f"{method}")
        model_line = [
            zero_bytes_per_rank(psi, n, stage[method], k=8, param_bytes=4, grad_bytes=4)["total"]
            for n in ns
        ]
        ax.plot(ns, [b / 2**20 for b in model_line], "--", color=color)
    ax.set_xticks(ns)
    ax.set_xlabel(_t("ranks N"))
    ax.set_ylabel(_t("MiB per rank"))
    ax.set_title(_t("counted (dots) vs (4+4+8)Psi model (dashes), Psi={psi}", psi=f"{psi:,}"))
    ax.legend()
    return ax
