"""Distributed evaluation without the padding bias: gather in index order, or sum counts.

``DistributedSampler`` pads the dataset so that every rank gets ``num_samples`` items, so
concatenating every rank's predictions counts the first few samples twice. Two fixes:

- ``gather_in_index_order``: all_gather the per-sample values, put them back in dataset
  order and cut them at the dataset length (needs the shards of a ``shuffle=False``
  sampler); ``gather_by_index`` does the same for any sampler by sending the indices too;
- ``unpadded_shard`` + ``all_reduce_accuracy``: each rank evaluates ``range(rank, n, R)``
  (no padding, shards may differ by one) and the ranks sum their correct/total counts.

PyTorch has no built-in for this (libraries such as torchmetrics or torcheval do the
bookkeeping); these are teaching versions written with ``all_gather`` and ``all_reduce``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.sampler import check_arguments


def gather_tensor(local: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``local`` (same shape on every rank) in rank order."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts, dim=0)


def gather_in_index_order(local: torch.Tensor, dataset_len: int) -> torch.Tensor:
    """Gather per-sample values from a ``shuffle=False`` sampler's shards, in dataset order.

    Rank r's j-th value belongs to position ``j * R + r`` of the padded list, so stacking
    the shards as columns and reading row by row restores the order; the positions from
    ``dataset_len`` on are the padding and are cut off.
    """
    world = dist.get_world_size()
    check_arguments(dataset_len, world)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local.contiguous())
    interleaved = torch.stack(parts, dim=1).flatten(0, 1)  # [S, R, ...] -> [S*R, ...]
    return interleaved[:dataset_len]


def gather_by_index(local: torch.Tensor, indices: torch.Tensor, dataset_len: int) -> torch.Tensor:
    """Gather per-sample values from any sampler (shuffled too) into a ``dataset_len`` tensor.

    Each rank also sends the dataset index of each value; a repeated index (padding)
    writes the same value twice, so it counts once.
    """
    check_arguments(dataset_len, dist.get_world_size())
    values = gather_tensor(local)
    where = gather_tensor(indices.to(torch.int64))
    # On the values' device: under NCCL they are CUDA tensors, and a CPU ``out`` would
    # fail in ``out[where] = values`` with a device mismatch.
    out = torch.zeros((dataset_len, *values.shape[1:]), dtype=values.dtype, device=values.device)
    out[where.to(values.device)] = values
    return out


def unpadded_shard(dataset_len: int, num_replicas: int, rank: int) -> range:
    """The indices of rank ``rank`` with the sampler's striding but without padding."""
    check_arguments(dataset_len, num_replicas, rank)
    return range(rank, dataset_len, num_replicas)


def all_reduce_accuracy(correct: int | torch.Tensor, total: int | torch.Tensor) -> float:
    """Sum ``correct`` and ``total`` over the ranks and return their ratio (every rank gets it)."""
    # NCCL reduces CUDA tensors only: count on the device the inputs live on.
    device = next((t.device for t in (correct, total) if isinstance(t, torch.Tensor)), "cpu")
    counts = torch.tensor([float(correct), float(total)], dtype=torch.float64, device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return (counts[0] / counts[1]).item() if counts[1] > 0 else float("nan")
