"""Buckets: which gradients DDP all-reduces together, and in which order.

DDP does not all-reduce each gradient on its own (one small message per parameter) nor all of
them at the end (no overlap with backward): it groups the parameters into buckets of about
``bucket_cap_mb`` and all-reduces a bucket as soon as its last gradient is ready. This module is
only the plan (``assign_buckets``), the part chapter 07's exercise is given; the reducer that
uses it is ``ddp_lab.bucketed_ddp``. It is a module of its own so that a graded rank of
``07.bucketed`` can import the plan while the reducer (an answer) stays hidden from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ddp_lab.i18n import _t

DEFAULT_BUCKET_CAP_MB = 25.0  # torch's default
DEFAULT_FIRST_BUCKET_MB = 1.0  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES, in MiB
MB = 1024 * 1024


def check_cap(value: Any) -> float | None:
    """Validate a ``bucket_cap_mb`` argument (None means torch's default)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            _t(
                "bucket_cap_mb must be a positive number of MiB or None (25), got {value!r}.",
                value=value,
            )
        )
    return float(value)


def assign_buckets(
    params: Sequence[torch.Tensor],
    bucket_cap_mb: float | None = None,
    *,
    find_unused_parameters: bool = False,
) -> list[list[int]]:
    """Group parameter indices into buckets, in the order the buckets will be all-reduced.

    This is the plan torch's DDP reduces with from its second iteration on (torch 2.13,
    ``torch/nn/parallel/distributed.py`` ``_ddp_init_helper`` and ``_BucketCapacityConfig``,
    ``Reducer::rebuild_buckets`` in ``torch/csrc/distributed/c10d/reducer.cpp``):

    - the first iteration uses ONE bucket of unbounded size (``[sys.maxsize]``), unless
      ``find_unused_parameters=True``;
    - during that backward the reducer records the order the gradients arrived in; before
      the next forward it rebuilds the buckets by walking the parameters in that order and
      closing a bucket as soon as it holds at least the cap. With ``bucket_cap_mb=None`` the
      first bucket closed (the first reduced: the output layers) has a 1 MiB cap
      (``dist._DEFAULT_FIRST_BUCKET_BYTES``) and the others 25 MiB; an explicit
      ``bucket_cap_mb`` gives every bucket that cap (no 1 MiB first bucket).

    We cannot see the order gradients arrive in before a backward, so this function assumes
    it is the reverse of the definition order (true for a model whose layers run in the order
    they are defined, e.g. ``nn.Sequential``; inside a layer the bias comes before the weight).
    ``tests/test_bucketed_ddp.py`` checks the result against the buckets torch's DDP reports
    in ``_get_ddp_logging_data()["rebuilt_per_bucket_param_indices"]``.

    ``find_unused_parameters=True`` gives torch's plan with that flag instead: buckets are
    never rebuilt, so the construction plan stays, walked in definition order (the 1 MiB
    bucket holds the FIRST layers, reduced last) and then reversed.
    """
    cap = check_cap(bucket_cap_mb)
    limits = (
        [DEFAULT_FIRST_BUCKET_MB * MB, DEFAULT_BUCKET_CAP_MB * MB] if cap is None else [cap * MB]
    )
    order = range(len(params)) if find_unused_parameters else range(len(params) - 1, -1, -1)
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in order:
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= limits[min(len(buckets), len(limits) - 1)]:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets[::-1] if find_unused_parameters else buckets
