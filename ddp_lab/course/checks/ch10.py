"""Checkers of chapter 10: a ZeRO-1 optimizer, a bf16 comm hook, FSDP's gradient reduction.

10.sharded_optimizer: the learner's ``MyShardedOptimizer(params, optimizer_class,
**defaults)`` trains hidden models (tied weights, a frozen layer, odd shapes) on 2 or 3
ranks, each rank on its part of the batch, with gradients averaged as DDP does. The
checker passes its own ``optimizer_class`` (AdamW with weight decay that records which
parameters each instance was given), so it sees each rank's shard: every trainable
parameter must belong to exactly one rank (a ZeRO that steps all parameters on every rank
fails), no rank may own much more than its share, and after the steps every rank's
parameters must equal those of plain AdamW on the full batch (one that forgets to share
the updated parameters fails).

10.bf16_hook: the learner's hook is registered on torch's DDP for hidden models; the
gradients after backward must equal those under torch's ``bf16_compress_hook`` bit for
bit, and the collectives must carry bfloat16, 2 bytes per gradient element.

10.fsdp_reduce: the learner's ``reduce_grad(flat_grad)`` replaces the reduce-scatter of
``ddp_lab.fsdp.FullyShardedDP``; training must equal single-process training on the full
batch, and the collectives are watched: an all-reduce (every rank receiving the whole
gradient) fails.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.course.grading import checker, fail
from ddp_lab.course.i18n import Messages

MESSAGES = Messages(
    __name__,
    {
        "owner_all": {
            "en": "rank {rank} built its optimizer over {mine} of the {total} trainable parameters: "
            "under ZeRO-1 each rank keeps optimizer state for its own shard only",
            "zh": "rank {rank} 的优化器包含了全部 {total} 个可训练参数中的 {mine} 个：ZeRO-1 中每个 "
            "rank 只为自己的分片保存优化器状态",
        },
        "owner_none": {
            "en": "parameter #{index} (shape {shape}) is stepped by no rank: every trainable "
            "parameter needs exactly one owner",
            "zh": "第 {index} 个参数（形状 {shape}）没有任何 rank 负责更新：每个可训练参数必须恰好"
            "属于一个 rank",
        },
        "owner_twice": {
            "en": "parameter #{index} (shape {shape}) is stepped by ranks {ranks}: each parameter "
            "must belong to exactly one shard",
            "zh": "第 {index} 个参数（形状 {shape}）被 rank {ranks} 同时更新：每个参数只能属于一个分片",
        },
        "unbalanced": {
            "en": "rank {rank} owns {load} elements, more than the ideal {ideal:.0f} plus the "
            "largest parameter ({largest}): assign the largest parameters first, each to the "
            "least loaded rank",
            "zh": "rank {rank} 拥有 {load} 个元素，超过理想值 {ideal:.0f} 加上最大参数（{largest}）："
            "请先分配最大的参数，每次分给当前负载最小的 rank",
        },
        "params_differ": {
            "en": "rank {rank}: parameters differ from plain AdamW on the full batch by {diff:.3g} "
            "(did every rank receive the parameters updated by their owner? broadcast each "
            "parameter from its owner after the step)",
            "zh": "rank {rank}：参数与在全批上运行的普通 AdamW 相差 {diff:.3g}（每个 rank 都收到了"
            "由所属 rank 更新后的参数吗？优化器步骤之后，请从所属 rank 广播每个参数）",
        },
        "hook_grads": {
            "en": "gradients differ from torch's bf16_compress_hook by {diff:.3g} (cast to "
            "bfloat16, divide by the world size, all-reduce, copy back into bucket.buffer())",
            "zh": "梯度与 torch 的 bf16_compress_hook 相差 {diff:.3g}（转换为 bfloat16、除以 world "
            "size、全归约，再复制回 bucket.buffer()）",
        },
        "hook_bytes": {
            "en": "the collectives carried {dtypes}, {got} bytes for {n} gradient elements; a bf16 "
            "hook sends bfloat16, 2 bytes per element ({want} bytes)",
            "zh": "集合通信传输的是 {dtypes}，{n} 个梯度元素共 {got} 字节；bf16 钩子应当发送 "
            "bfloat16，每个元素 2 字节（{want} 字节）",
        },
        "fsdp_all_reduce": {
            "en": "reduce_grad called dist.all_reduce: every rank received the whole gradient "
            "although it keeps only its shard; use dist.reduce_scatter_single (reduce-scatter)",
            "zh": "reduce_grad 调用了 dist.all_reduce：每个 rank 都收到了完整的梯度，但它只保留"
            "自己的分片；请用 dist.reduce_scatter_single（归约散播）",
        },
        "fsdp_shape": {
            "en": "reduce_grad returned shape {got} for a gradient of {n} elements on {world} "
            "ranks; expected this rank's shard, shape ({want},)",
            "zh": "对 {world} 个 rank 上 {n} 个元素的梯度，reduce_grad 返回的形状是 {got}；应返回"
            "本 rank 的分片，形状为 ({want},)",
        },
        "fsdp_params": {
            "en": "rank {rank}: parameters differ from single-process training on the full batch "
            "by {diff:.3g} (return the average over the ranks, not the sum)",
            "zh": "rank {rank}：参数与在全批上的单进程训练相差 {diff:.3g}（应返回各 rank 的平均值，"
            "而不是和）",
        },
    },
)


# ----- 10.sharded_optimizer ---------------------------------------------------------------


class TiedModel(nn.Module):
    """Tied embedding/output weights, a frozen layer, odd widths."""

    def __init__(self, vocab: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.frozen = nn.Linear(dim, hidden).requires_grad_(False)
        self.mid = nn.Linear(hidden, dim)
        self.out = nn.Linear(dim, vocab)
        self.out.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(torch.tanh(self.frozen(self.emb(idx))))))


def _recording_adamw(log: list[list[int]], index: dict[int, int]) -> type:
    class RecordingAdamW(torch.optim.AdamW):
        """AdamW that notes which parameters (by index in the model) it was given."""

        def __init__(self, params: Any, **defaults: Any) -> None:
            params = list(params)
            flat = [
                p for item in params for p in (item["params"] if isinstance(item, dict) else [item])
            ]
            log.append([index.get(id(p), -1) for p in flat])
            super().__init__(params, **defaults)

    return RecordingAdamW


def _sharded_case(rank: int, my_cls: Callable, spec: dict) -> list[str]:
    world = dist.get_world_size()
    torch.manual_seed(spec["seed"])
    model = TiedModel(spec["vocab"], spec["dim"], spec["hidden"]).double()
    oracle = copy.deepcopy(model)
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    log: list[list[int]] = []
    kw = {"lr": spec["lr"], "weight_decay": spec["wd"]}
    opt = my_cls(model.parameters(), _recording_adamw(log, index), **kw)
    opt_oracle = torch.optim.AdamW(oracle.parameters(), **kw)
    gen = torch.Generator().manual_seed(spec["data_seed"])
    b = spec["per_rank"]
    for _ in range(spec["steps"]):
        idx = torch.randint(0, spec["vocab"], (world * b, 4), generator=gen)
        tgt = torch.randint(0, spec["vocab"], (world * b, 4), generator=gen)
        opt.zero_grad()
        mine = slice(rank * b, (rank + 1) * b)
        nn.functional.cross_entropy(model(idx[mine]).flatten(0, 1), tgt[mine].flatten()).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        opt_oracle.zero_grad()
        nn.functional.cross_entropy(oracle(idx).flatten(0, 1), tgt.flatten()).backward()
        opt_oracle.step()
    owned = sorted({i for group in log for i in group})
    diff = max((p - q).abs().max().item() for p, q in zip(params, oracle.parameters(), strict=True))
    return [owned, diff]


def _sharded_verdict(results: list[list], spec: dict, world: int) -> str:
    torch.manual_seed(spec["seed"])
    params = list(TiedModel(spec["vocab"], spec["dim"], spec["hidden"]).parameters())
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    owners: dict[int, list[int]] = {i: [] for i in trainable}
    for rank, (owned, _) in enumerate(results):
        for i in owned:
            if i in owners:
                owners[i].append(rank)
        mine = [i for i in owned if i in owners]
        if len(trainable) > 1 and len(mine) == len(trainable):
            return MESSAGES("owner_all", rank=rank, mine=len(mine), total=len(trainable))
    for i, ranks in owners.items():
        shape = tuple(params[i].shape)
        if not ranks:
            return MESSAGES("owner_none", index=i, shape=shape)
        if len(ranks) > 1:
            return MESSAGES("owner_twice", index=i, shape=shape, ranks=ranks)
    sizes = {i: params[i].numel() for i in trainable}
    ideal, largest = sum(sizes.values()) / world, max(sizes.values())
    for rank in range(world):
        load = sum(n for i, n in sizes.items() if owners[i] == [rank])
        if load > ideal + largest:
            return MESSAGES("unbalanced", rank=rank, load=load, ideal=ideal, largest=largest)
    for rank, (_, diff) in enumerate(results):
        if diff > 1e-10:
            return MESSAGES("params_differ", rank=rank, diff=diff)
    return ""


def _run(fn: Callable, args: tuple, world_size: int) -> list[Any]:
    from ddp_lab import spawn

    return spawn(fn, args=args, nprocs=world_size, backend="gloo", quiet=True, timeout=120)


@checker("10.sharded_optimizer", points=4)
def check_sharded_optimizer(rng: random.Random, my_cls: Callable) -> Iterator[object]:
    worlds = [2, 3, rng.choice([2, 3])]
    yield len(worlds)
    for world in worlds:
        spec = {
            "seed": rng.randrange(10**6),
            "data_seed": rng.randrange(10**6),
            "vocab": rng.randint(7, 13),
            "dim": rng.randint(3, 9),
            "hidden": rng.randint(3, 9),
            "per_rank": rng.randint(2, 4),
            "steps": rng.randint(3, 4),
            "lr": rng.choice([0.01, 0.05]),
            "wd": rng.choice([0.01, 0.1]),
        }
        label = f"world_size={world}, tied + frozen parameters"
        why = _sharded_verdict(_run(_sharded_case, (my_cls, spec), world), spec, world)
        if why:
            raise fail(why, label)
        yield label


# ----- 10.bf16_hook -----------------------------------------------------------------------


def _hook_case(rank: int, hook: Callable, spec: dict) -> list[Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.comm_hooks import builtin_bf16_hook, count_collectives

    # An unannotated wrapper: DDP checks a hook's name and annotations, not what it does.
    def learner(state, bucket):  # type: ignore[no-untyped-def]
        return hook(state, bucket)

    out = []
    for h in (learner, builtin_bf16_hook):
        torch.manual_seed(spec["seed"])
        layers = [nn.Linear(spec["d"], spec["h"]), nn.Tanh(), nn.Linear(spec["h"], 3)]
        model = DDP(nn.Sequential(*layers), bucket_cap_mb=spec["cap"])
        model.register_comm_hook(None, h)
        gen = torch.Generator().manual_seed(spec["data_seed"] + rank)
        with count_collectives() as log:
            for _ in range(2):
                model.zero_grad()
                model(torch.randn(5, spec["d"], generator=gen)).pow(2).mean().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out.append((grads, log.calls))
    (ours, calls), (theirs, _) = out
    n = 2 * sum(p.numel() for p in model.parameters())  # two backward passes
    return [
        (ours.float() - theirs).abs().max().item(),
        sorted({str(d) for _, d, _ in calls}),
        sum(b for _, _, b in calls),
        n,
        ours.dtype == torch.float32,
    ]


@checker("10.bf16_hook", points=3)
def check_bf16_hook(rng: random.Random, hook: Callable) -> Iterator[object]:
    cases = [2, 2, 3]
    yield len(cases)
    for world in cases:
        spec = {
            "seed": rng.randrange(10**6),
            "data_seed": rng.randrange(10**6),
            "d": rng.randint(4, 40),
            "h": rng.randint(4, 40),
            "cap": rng.choice([1e-4, 25.0]),  # several small buckets, or one
        }
        label = f"world_size={world}, bucket_cap_mb={spec['cap']}"
        for diff, dtypes, got, n, _ in _run(_hook_case, (hook, spec), world):
            if diff != 0.0:
                raise fail(MESSAGES("hook_grads", diff=diff), label)
            if dtypes != ["torch.bfloat16"] or got != 2 * n:
                raise fail(MESSAGES("hook_bytes", dtypes=dtypes, got=got, n=n, want=2 * n), label)
        yield label


# ----- 10.fsdp_reduce ---------------------------------------------------------------------


def _fsdp_case(rank: int, reduce_grad: Callable, spec: dict) -> str:
    from ddp_lab.comm_hooks import count_collectives
    from ddp_lab.fsdp import FullyShardedDP

    world = dist.get_world_size()
    torch.manual_seed(spec["seed"])
    widths = spec["widths"]
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    net = nn.Sequential(*layers[:-1]).double()
    oracle = copy.deepcopy(net)
    shapes: list[tuple[int, tuple]] = []

    def checked(flat: torch.Tensor) -> torch.Tensor:
        with count_collectives(("all_reduce",)) as log:
            out = reduce_grad(flat)
        if log.calls:
            raise AssertionError(MESSAGES("fsdp_all_reduce"))
        shapes.append((flat.numel(), tuple(out.shape)))
        return out

    model = FullyShardedDP(net, reduce_grad=checked)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_oracle = torch.optim.SGD(oracle.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(spec["data_seed"])
    for _ in range(3):
        x = torch.randn(world * 3, widths[0], generator=gen, dtype=torch.float64)
        y = torch.randn(world * 3, widths[-1], generator=gen, dtype=torch.float64)
        mine = slice(rank * 3, rank * 3 + 3)
        opt.zero_grad()
        try:
            nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        except AssertionError as err:
            return str(err)
        for n, shape in shapes:
            if shape != (n // world,):
                return MESSAGES("fsdp_shape", got=shape, n=n, world=world, want=n // world)
        opt.step()
        opt_oracle.zero_grad()
        nn.functional.mse_loss(oracle(x), y).backward()
        opt_oracle.step()
    full = model.full_state_dict()
    diff = max((full[k] - v).abs().max().item() for k, v in oracle.state_dict().items())
    return MESSAGES("fsdp_params", rank=rank, diff=diff) if diff > 1e-10 else ""


@checker("10.fsdp_reduce", points=2)
def check_fsdp_reduce(rng: random.Random, reduce_grad: Callable) -> Iterator[object]:
    worlds = [2, 3]
    yield len(worlds)
    for world in worlds:
        spec = {
            "seed": rng.randrange(10**6),
            "data_seed": rng.randrange(10**6),
            "widths": [rng.randint(2, 9) for _ in range(rng.randint(3, 4))],
        }
        label = f"world_size={world}, uneven shards"
        problems = [p for p in _run(_fsdp_case, (reduce_grad, spec), world) if p]
        if problems:
            raise fail(problems[0], label)
        yield label
