"""DDP communication hooks: count what they send, and compare them on a small model.

``DistributedDataParallel.register_comm_hook(state, hook)`` replaces the all-reduce of
each gradient bucket by ``hook(state, bucket)``, which must return a future of the
bucket's averaged gradient. torch's built-in hooks
(``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py`` and
``powerSGD_hook.py``) all send through ``torch.distributed.all_reduce``, so
``count_collectives`` (``ddp_lab.comm_debug``, re-exported here) can count their bytes by
wrapping that function in this process.

How this differs from PyTorch: torch has no byte counter for hooks. What is counted is
the payload handed to each collective (``numel * element_size``), not the bytes on the
wire: a ring all-reduce moves about ``2 (N-1)/N`` times its payload per rank (chapter 05).
"""

# No ``from __future__ import annotations`` here: DDP's ``_check_comm_hook`` compares a
# hook's annotations with ``dist.GradBucket`` and ``Future[Tensor]`` objects, not strings.
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.comm_debug import COUNTED, CollectiveLog, count_collectives
from ddp_lab.i18n import _t

__all__ = [  # the counter lives in ddp_lab.comm_debug (no answer there: visible while grading)
    "COUNTED",
    "CollectiveLog",
    "builtin_bf16_hook",
    "compare_hooks",
    "count_collectives",
    "digits_mlp",
    "format_table",
    "hook_choices",
    "my_bf16_hook",
    "unknown_hook",
]


def hook_choices() -> dict[str, tuple[Callable[[], Any], Callable]]:
    """name -> (make the hook's state, the hook), torch's built-in hooks."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    def power_state(rank: int) -> Callable[[], Any]:
        # start_powerSGD_iter must be > 1 with error feedback (powerSGD_hook.py checks it)
        return lambda: powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2
        )

    return {
        "allreduce (plain DDP)": (lambda: None, default.allreduce_hook),
        "fp16_compress_hook": (lambda: None, default.fp16_compress_hook),
        "bf16_compress_hook": (lambda: None, builtin_bf16_hook),
        "PowerSGD rank 1": (power_state(1), powersgd.powerSGD_hook),
        "PowerSGD rank 4": (power_state(4), powersgd.powerSGD_hook),
    }


def digits_mlp(hidden: int = 64) -> nn.Module:
    """The small model of the comparison: 8x8 digits -> 10 classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def compare_hooks(
    rank: int,
    hooks: dict[str, tuple[Callable[[], Any], Callable]] | None = None,
    steps: int = 60,
    batch: int = 32,
    lr: float = 0.1,
) -> list[dict[str, Any]]:
    """Train the same model under each hook on the digits; run inside ``dl.spawn``.

    Returns one row per hook: bytes handed to collectives per step (after the first
    steps, when PowerSGD has started), test accuracy after ``steps``, and the largest
    parameter difference from plain DDP.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.tools.data import build_digits

    hooks = hooks or hook_choices()
    _check_powersgd_on_cpu(hooks)
    data = build_digits()
    world = dist.get_world_size()
    rows, plain = [], None
    for name, (make_state, hook) in hooks.items():
        torch.manual_seed(0)
        model = DDP(digits_mlp())
        model.register_comm_hook(make_state(), hook)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        gen = torch.Generator().manual_seed(1)
        per_step = []
        for _ in range(steps):
            idx = torch.randint(0, len(data["y_train"]), (world * batch,), generator=gen)
            mine = idx[rank * batch : (rank + 1) * batch]
            opt.zero_grad()
            with count_collectives() as log:
                loss = nn.functional.cross_entropy(
                    model(data["x_train"][mine]), data["y_train"][mine]
                )
                loss.backward()
            per_step.append(log.bytes)
            opt.step()
        with torch.no_grad():
            pred = model.module(data["x_test"]).argmax(1)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        plain = flat if plain is None else plain
        rows.append(
            {
                "hook": name,
                "bytes_per_step": per_step[-1],
                "accuracy": (pred == data["y_test"]).float().mean().item(),
                "max_diff_vs_plain": (flat - plain).abs().max().item(),
            }
        )
    return rows


def _check_powersgd_on_cpu(hooks: dict[str, tuple[Callable[[], Any], Callable]]) -> None:
    """A clear error before training where PowerSGD would fail on this CPU model.

    ``powerSGD_hook``'s and ``batched_powerSGD_hook``'s ``decompress`` call
    ``torch.cuda.synchronize(device)`` whenever ``torch.cuda.is_available()``, also for a CPU
    bucket, which raises "Expected a cuda device, but got: cpu" (``powerSGD_hook.py``).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    power = (powersgd.powerSGD_hook, powersgd.batched_powerSGD_hook)
    if torch.cuda.is_available() and any(hook in power for _, hook in hooks.values()):
        raise RuntimeError(
            _t(
                "PowerSGD cannot train this CPU model where CUDA is available: its "
                "decompress calls torch.cuda.synchronize(device) for a CPU bucket too "
                "(powerSGD_hook.py). Launch the ranks under dl.gpus_hidden(), as chapter "
                "10 does."
            )
        )


def format_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``compare_hooks`` rows (bytes relative to the first row)."""
    base = rows[0]["bytes_per_step"]
    lines = [
        _t("| hook | bytes per step | vs plain | test accuracy | max parameter diff vs plain |"),
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['hook']}` | {r['bytes_per_step']:,} | {r['bytes_per_step'] / base:.3f}x | "
            f"{r['accuracy']:.1%} | {r['max_diff_vs_plain']:.2e} |"
        )
    return "\n".join(lines)


def builtin_bf16_hook(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``bf16_compress_hook``, called under another name.

    ``DistributedDataParallel._check_comm_hook`` (``torch/nn/parallel/distributed.py``)
    refuses a hook *named* ``bf16_compress_hook`` unless CUDA with NCCL >= 2.10 (or XPU)
    is present, although gloo all-reduces bfloat16 on CPU. This wrapper runs the very
    same function, so the comparison can run here.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return bf16_compress_hook(process_group, bucket)


def my_bf16_hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A hand-written bf16 compression hook (the reference solution of exercise 10.bf16_hook).

    The same steps as torch's ``bf16_compress_hook`` (``default_hooks.py``,
    ``_compress_hook``): cast the bucket to bfloat16, divide by the world size (before
    the sum, against overflow), all-reduce asynchronously, then copy the result back into
    the float32 bucket in a ``then`` callback.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)


def unknown_hook(name: str) -> ValueError:
    return ValueError(
        _t("Unknown hook {name!r}; choose one of {names}.", name=name, names=sorted(hook_choices()))
    )
