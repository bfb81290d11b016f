"""Chapter 10's checkers' shared forms: what the ranks' results must look like.

Used by ``ch10`` (10.sharded_optimizer, 10.bf16_hook) and ``ch10_fsdp`` (10.fsdp_reduce).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ddp_lab.course.grading import wrong_form


def _kind(value: Any) -> str:
    """A short, language-neutral description of what came back."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def _bad(rank: object, field: str, value: Any, label: str) -> Exception:
    return wrong_form(rank, field, _kind(value), label)


def _ranks(got: Any, world: int, fields: tuple[str, ...], label: str) -> list[dict]:
    """The probe's per-rank results: a list of ``world`` dicts with ``fields``."""
    if not isinstance(got, list) or len(got) != world:
        raise _bad("-", "ranks", got, label)
    for rank, r in enumerate(got):
        if not isinstance(r, dict) or not all(k in r for k in fields):
            raise _bad(rank, "result", r, label)
    return got


def _like(value: Any, want: torch.Tensor) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.shape == want.shape
        and (value.dtype == want.dtype)
    )


def _spawn(fn: Callable, args: tuple, world_size: int) -> list[Any]:
    from ddp_lab.runtime.launcher import spawn

    return spawn(fn, args=args, nprocs=world_size, backend="gloo", quiet=True, timeout=120)


def _flat(params: Any) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def _load(params: Any, init: torch.Tensor) -> None:
    """In the rank: set ``params`` (in order) from the flat ``init``."""
    at = 0
    with torch.no_grad():
        for p in params:
            p.copy_(init[at : at + p.numel()].reshape(p.shape))
            at += p.numel()
