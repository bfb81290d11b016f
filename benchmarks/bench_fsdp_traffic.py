"""Calibration of 10.fsdp_reduce's byte bound: what each rank receives, per way of reducing.

Runs each way below as a graded submission of 10.fsdp_reduce's byte probe
(``ch10_fsdp_bytes.probe_fsdp_bytes`` in the grader's per-rank sandboxes,
``course.rankhost.RankPool``) and prints, per world size, the bytes each rank received from
the others in one call (``course.traffic``: on the connections of the group the ranks were
given), whether its shard was right, what the rank's lock refused, and the bytes outside the
group's connections. ``ch10_fsdp_bytes``'s bound comes from these numbers (see its comment and
docs/INSTRUCTORS.md). The probe's ranks refuse every collective but the reduce-scatters: the
all-reduces below show as refused; their bytes were measured with the probe's
``collectives_allowed`` line commented out.
Needs bubblewrap, ss and nsenter (root or user namespaces).

    .venv/bin/python benchmarks/bench_fsdp_traffic.py [--numel 60000] [--ranks 2,3] [--ways a,b]
"""

from __future__ import annotations

import argparse
import sys
import threading

import cloudpickle
import torch
import torch.distributed as dist

from ddp_lab.course.grading import sandbox, traffic
from ddp_lab.course.grading.checks.ch10_fsdp_bytes import probe_fsdp_bytes, received
from ddp_lab.course.grading.learner import probe_name
from ddp_lab.course.grading.rankhost import RankPool


def reference(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world, dtype=flat_grad.dtype)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(out, flat_grad / world)
    return out


def rs_tensor(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world, dtype=flat_grad.dtype)
    dist.reduce_scatter_tensor(out, flat_grad / world)
    return out


def rs_list(flat_grad):
    world = dist.get_world_size()
    parts = list((flat_grad / world).chunk(world))
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts)
    return out


def rs_p2p(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = (flat_grad / world).chunk(world)
    bufs = [torch.empty_like(parts[0]) for _ in range(world)]
    works = []
    for p in range(world):
        if p != rank:
            works.append(dist.isend(parts[p].contiguous(), p))
            works.append(dist.irecv(bufs[p], p))
    for w in works:
        w.wait()
    bufs[rank] = parts[rank].clone()
    return sum(bufs)


def rs_ring(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in (flat_grad / world).chunk(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        s = (rank - step - 1) % world
        r = (rank - step - 2) % world
        ops = [dist.P2POp(dist.isend, chunks[s], right), dist.P2POp(dist.irecv, buf, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        chunks[r] += buf
    return chunks[rank]


def rs_funcol(flat_grad):
    from torch.distributed import _functional_collectives as funcol

    world = dist.get_world_size()
    out = funcol.reduce_scatter_tensor(flat_grad / world, "sum", 0, dist.group.WORLD)
    return funcol.wait_tensor(out)


def plain_allreduce(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    whole = flat_grad / world
    dist.all_reduce(whole)
    n = flat_grad.numel() // world
    return whole[rank * n : (rank + 1) * n].clone()


def thread_allreduce(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    whole = flat_grad / world
    t = threading.Thread(target=dist.all_reduce, args=(whole,))
    t.start()
    t.join()
    n = flat_grad.numel() // world
    return whole[rank * n : (rank + 1) * n].clone()


def batch_p2p_allgather(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    peers = [p for p in range(world) if p != rank]
    bufs = [torch.empty_like(flat_grad) for _ in peers]
    ops, who, tensors = [], [], []
    for p, b in zip(peers, bufs, strict=True):
        ops += ["isend", "irecv"]
        who += [p, p]
        tensors += [flat_grad, b]
    funcol = torch.ops._c10d_functional
    works = funcol.batch_p2p_ops(ops, who, [0] * len(ops), tensors, dist.group.WORLD.group_name)
    for w in works:
        funcol.wait_tensor(w)
    total = flat_grad + sum(bufs)
    n = flat_grad.numel() // world
    return (total[rank * n : (rank + 1) * n] / world).clone()


def gather_each_root(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    total = None
    for root in range(world):
        parts = [torch.empty_like(flat_grad) for _ in range(world)] if rank == root else None
        dist.gather(flat_grad, parts, dst=root)
        if rank == root:
            total = sum(parts)
    n = flat_grad.numel() // world
    return (total[rank * n : (rank + 1) * n] / world).clone()


def all_to_all_whole(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    out = torch.empty(world * flat_grad.numel(), dtype=flat_grad.dtype)
    dist.all_to_all_single(out, flat_grad.repeat(world))
    total = out.view(world, -1).sum(0)
    n = flat_grad.numel() // world
    return (total[rank * n : (rank + 1) * n] / world).clone()


def funcol_allreduce(flat_grad):
    from torch.distributed import _functional_collectives as funcol

    world, rank = dist.get_world_size(), dist.get_rank()
    whole = funcol.wait_tensor(funcol.all_reduce(flat_grad / world, "sum", dist.group.WORLD))
    n = flat_grad.numel() // world
    return whole[rank * n : (rank + 1) * n].clone()


def rs_reduce(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [c.clone() for c in (flat_grad / world).chunk(world)]
    for root in range(world):
        dist.reduce(parts[root], dst=root)
    return parts[rank]


def reduce_whole_each_root(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    out = None
    for root in range(world):
        whole = flat_grad / world
        dist.reduce(whole, dst=root)
        if root == rank:
            out = whole.chunk(world)[rank].clone()
    return out


def rs_all_to_all(flat_grad):
    world = dist.get_world_size()
    out = torch.empty_like(flat_grad)
    dist.all_to_all_single(out, flat_grad / world)
    return out.view(world, -1).sum(0)


WAYS = [
    reference, rs_tensor, rs_list, rs_p2p, rs_ring, rs_funcol, rs_reduce, rs_all_to_all,
    plain_allreduce, thread_allreduce, funcol_allreduce,  # all-reduces (the lock refuses)
    batch_p2p_allgather, gather_each_root, all_to_all_whole, reduce_whole_each_root,
]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--numel", type=int, default=60000)
    p.add_argument("--ranks", default="2,3")
    p.add_argument("--ways", default=",".join(w.__name__ for w in WAYS))
    args = p.parse_args()
    if not sandbox.available() or traffic.tools() is None:
        sys.exit("needs bubblewrap, ss and nsenter")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    for name in args.ways.split(","):
        pool = RankPool(cloudpickle.dumps((globals()[name],)), "en", 0)
        try:
            for n in map(int, args.ranks.split(",")):
                numel = args.numel - args.numel % n
                gen = torch.Generator().manual_seed(1)
                inputs = [
                    [torch.randn(numel, dtype=torch.float64, generator=gen)] for _ in range(n)
                ]
                got = pool.run(probe_name(probe_fsdp_bytes), inputs, 60)
                want = (sum(x[0] for x in inputs) / n).chunk(n)
                ok = all(
                    isinstance(got[r][0]["shard"], torch.Tensor)
                    and got[r][0]["shard"].shape == want[r].shape
                    and torch.allclose(got[r][0]["shard"], want[r])
                    for r in range(n)
                )
                (seen,) = pool.traffic  # one call: one count, on the group's connections
                recv = [received(seen, r, n) for r in range(n)]
                ideal = (n - 1) * (numel // n) * 8
                unseen = seen.hidden + seen.unattributed + seen.outside + seen.store
                print(
                    f"{name:20} N={n} numel={numel} received={recv} "
                    f"x(N-1)S={[round(x / ideal, 3) for x in recv]} right={ok} "
                    f"refused={got[0][0]['refused']!r} unseen={unseen}",
                    flush=True,
                )
        finally:
            pool.close()


if __name__ == "__main__":
    main()
