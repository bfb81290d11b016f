"""ZeRO stage 1 from scratch: shard the optimizer state, keep the parameters whole.

Under DDP every rank holds the full optimizer state (for AdamW, two float32 tensors per
parameter) and every rank takes the same step. ``ShardedOptimizer`` splits the parameters
into one shard per rank: each rank builds the real optimizer (``optimizer_class``) over its
shard only, so it keeps state for that shard only, steps it, and then every rank
broadcasts the parameters it owns, so that all replicas are identical again.

How the teaching version differs from PyTorch's
``torch.distributed.optim.ZeroRedundancyOptimizer``
(``torch/distributed/optim/zero_redundancy_optimizer.py``):
- the shard assignment is the same greedy rule (``_partition_parameters``: largest
  parameter first, to the rank with the fewest elements so far), but without the
  ``params_per_rank`` override;
- updated parameters are shared with one ``broadcast`` per parameter (torch can
  flatten them per rank, ``parameters_as_bucket_view=True``, or overlap the broadcasts
  with DDP's communication, ``overlap_with_ddp=True``);
- ``consolidate_state_dict`` uses ``gather_object`` (torch uses broadcasts); no ``Join``
  support, no ``add_param_group`` after construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from ddp_lab.i18n import _t


def assign_shards(
    sizes: Sequence[int], world_size: int, loads: list[int] | None = None
) -> list[int]:
    """The owner rank of each parameter, given the parameters' sizes (numel).

    torch's greedy rule: visit the parameters from the largest to the smallest (a stable
    sort, so equal sizes keep their order) and give each to the rank that owns the fewest
    elements so far (the lowest rank on a tie). ``loads`` (elements per rank) carries
    over from earlier parameter groups and is updated in place.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            _t("world_size must be a positive integer, got {value!r}.", value=world_size)
        )
    if loads is None:
        loads = [0] * world_size
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):
        rank = loads.index(min(loads))
        owners[i] = rank
        loads[rank] += int(sizes[i])
    return owners


class ShardedOptimizer(Optimizer):
    """ZeRO-1: wrap ``optimizer_class`` so that each rank keeps state for its shard only.

    Used like ``ZeroRedundancyOptimizer(params, optimizer_class, **defaults)``:
    ``zero_grad()``, ``step()``, ``param_groups`` (change ``lr`` there, as a scheduler
    does), ``consolidate_state_dict(to)`` on every rank, then ``state_dict()`` on rank
    ``to``: the state dict of the unsharded optimizer, loadable into it.

    Attributes:
        optim: the local ``optimizer_class`` over this rank's shard (None if it owns none).
        owner: the owner rank of each parameter, in ``param_groups`` order.
    """

    def __init__(
        self,
        params: Iterable[Any],
        optimizer_class: Callable[..., Optimizer],
        process_group: Any = None,
        **defaults: Any,
    ) -> None:
        super().__init__(params, defaults)
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        loads = [0] * self.world_size
        self.owner: list[int] = []
        local_groups = []
        for group in self.param_groups:
            owners = assign_shards([p.numel() for p in group["params"]], self.world_size, loads)
            self.owner += owners
            mine = [p for p, r in zip(group["params"], owners, strict=True) if r == self.rank]
            local_groups.append({**group, "params": mine})
        self._all = [p for g in self.param_groups for p in g["params"]]
        self._local_index = [i for i, r in enumerate(self.owner) if r == self.rank]
        has_local = any(g["params"] for g in local_groups)
        self.optim = optimizer_class(local_groups, **defaults) if has_local else None
        self._consolidated: dict[str, Any] | None = None
        self._consolidated_to = 0

    def _sync_groups(self, src: list[dict], dst: list[dict]) -> None:
        for s, d in zip(src, dst, strict=True):
            d.update({k: v for k, v in s.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        """Step this rank's shard, then broadcast every parameter from its owner."""
        loss = None
        if self.optim is not None:
            self._sync_groups(self.param_groups, self.optim.param_groups)
            loss = self.optim.step(closure)
            self._sync_groups(self.optim.param_groups, self.param_groups)
        elif closure is not None:
            with torch.enable_grad():
                loss = closure()
        works = []
        for src in range(self.world_size):  # the same order on every rank
            global_src = (
                src if self.process_group is None else dist.get_global_rank(self.process_group, src)
            )
            for p, owner in zip(self._all, self.owner, strict=True):
                if owner == src:
                    works.append(
                        dist.broadcast(
                            p.data, src=global_src, group=self.process_group, async_op=True
                        )
                    )
        for work in works:
            work.wait()
        return loss

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state (tensors) held by this rank."""
        if self.optim is None:
            return 0
        return sum(
            v.numel() * v.element_size()
            for state in self.optim.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        )

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collect every rank's shard of the optimizer state on rank ``to`` (call on all)."""
        local = self.optim.state_dict() if self.optim is not None else None
        mine = (self._local_index, local)
        gathered: list[Any] | None = [None] * self.world_size if self.rank == to else None
        dist.gather_object(mine, gathered, dst=to, group=self.process_group)
        self._consolidated_to = to
        if gathered is None:
            self._consolidated = None
            return
        state: dict[int, Any] = {}
        hyper: list[dict] | None = None
        for indices, sd in gathered:
            if sd is None:
                continue
            # The local optimizer numbers its parameters 0, 1, ... in its own order.
            for local_i, global_i in enumerate(indices):
                if local_i in sd["state"]:
                    state[global_i] = sd["state"][local_i]
            hyper = hyper or sd["param_groups"]
        groups, start = [], 0
        for g, h in zip(self.param_groups, hyper or self.param_groups, strict=True):
            n = len(g["params"])
            groups.append({**{k: v for k, v in h.items() if k != "params"}, **_hyper(g)})
            groups[-1]["params"] = list(range(start, start + n))
            start += n
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        """The consolidated state dict (rank ``to`` only, after ``consolidate_state_dict``)."""
        if self._consolidated is None:
            raise RuntimeError(
                _t(
                    "Call consolidate_state_dict(to={to}) on every rank first; only rank "
                    "{to} then holds the full state_dict (torch's ZeroRedundancyOptimizer "
                    "has the same rule).",
                    to=self._consolidated_to,
                )
            )
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full (unsharded) state dict: each rank keeps its shard's part."""
        for g, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            g.update(_hyper(saved))
        if self.optim is None:
            return
        local_groups = []
        for g, saved in zip(self.optim.param_groups, state_dict["param_groups"], strict=True):
            local_groups.append({**_hyper(saved), "params": list(range(len(g["params"])))})
        offset = 0  # renumber: local groups are consecutive in the local optimizer
        for lg in local_groups:
            lg["params"] = [offset + i for i in lg["params"]]
            offset += len(lg["params"])
        state = {
            local_i: state_dict["state"][global_i]
            for local_i, global_i in enumerate(self._local_index)
            if global_i in state_dict["state"]
        }
        self.optim.load_state_dict({"state": state, "param_groups": local_groups})
        self._sync_groups(self.optim.param_groups, self.param_groups)


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}
