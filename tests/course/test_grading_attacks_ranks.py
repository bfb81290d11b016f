"""The per-rank form (issue 26, class 1): rank r receives only rank r's input.

For each exercise graded in that form, through the verdict's own path (``RemoteLearner`` with
``course.rankhost.RankPool``: one sandbox per rank, the package's answers hidden):
- the honest solution (the released solution's code, defined here so that it travels by value
  as a notebook's does) gets full points;
- an attack that reads every rank's input from the caller's frames and never communicates gets
  0. The same attack passes (at least its first hidden case) where a frame holds every rank's
  input, as every probe's did before the per-rank form: ``LocalLearner`` (self-study) still
  does, which shows that the attack is a real one.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.bucketed_ddp import assign_buckets
from ddp_lab.course import sandbox
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.learner import LocalLearner, RemoteLearner
from ddp_lab.course.rankhost import RankPool
from ddp_lab.resume import save_atomic
from ddp_lab.runtime import _pickle

# --- honest solutions (as in solutions/en/) ---------------------------------------------------


def reduce_broadcast_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    dist.reduce(tensor, dst=0)
    dist.broadcast(tensor, src=0)
    return tensor


def send_recv_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    sends = [dist.isend(tensor, dst=peer) for peer in range(n) if peer != rank]
    for peer in range(n):
        if peer == rank:
            tensor_list[peer].copy_(tensor)
        else:
            dist.recv(tensor_list[peer], src=peer)
    for request in sends:
        request.wait()


def gathered_accuracy(correct: torch.Tensor, dataset_len: int) -> float:
    parts = [torch.empty_like(correct) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, correct)
    return torch.stack(parts, dim=1).flatten()[:dataset_len].mean().item()


class MyDDP(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)

    def forward(self, *args: Any) -> Any:
        for b in self.module.buffers():
            dist.broadcast(b, src=0)
        return self.module(*args)

    def sync_gradients(self) -> None:
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()


class GradBuckets:
    def __init__(self, module: nn.Module, bucket_cap_mb: float) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        plan = assign_buckets(self.params, bucket_cap_mb)  # given code: the package's
        self.buckets = [[self.params[i] for i in idx] for idx in plan]
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.next = 0
        self.works: list = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def flat(self, b: int) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.buckets[b]]) / dist.get_world_size()

    def on_grad_ready(self, param: torch.Tensor) -> None:
        self.ready[self.bucket_of[id(param)]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(
            self.buckets[self.next]
        ):
            b = self.next
            flat = self.flat(b)
            self.works.append((dist.all_reduce(flat, async_op=True), flat, b))
            self.next += 1

    def wait(self) -> None:
        for work, flat, b in self.works:
            work.wait()
            offset = 0
            for p in self.buckets[b]:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.works.clear()
        self.ready = [0] * len(self.buckets)
        self.next = 0


def global_accuracy(correct: int, total: int) -> float:
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def safe_all_reduce(tensor: torch.Tensor) -> None:
    meta = (tuple(tensor.shape), str(tensor.dtype))
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, meta)
    if len(set(metas)) > 1:
        raise ValueError(f"shapes or dtypes differ across ranks: {metas}")
    dist.all_reduce(tensor)


class MySharded:
    def __init__(self, params: Any, optimizer_class: Any, **defaults: Any) -> None:
        self.params = list(params)
        self.rank, world = dist.get_rank(), dist.get_world_size()
        loads, self.owner = [0] * world, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            r = loads.index(min(loads))
            self.owner[i], loads[r] = r, loads[r] + self.params[i].numel()
        mine = [p for p, o in zip(self.params, self.owner, strict=True) if o == self.rank]
        self.optim = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.optim is not None:
            self.optim.step()
        for p, owner in zip(self.params, self.owner, strict=True):
            dist.broadcast(p, src=owner)


def my_bf16_hook(process_group, bucket):  # noqa: ANN001, ANN201  # DDP checks annotations
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(f):  # noqa: ANN001, ANN202
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)


def reduce_grad(flat_grad: torch.Tensor) -> torch.Tensor:
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world, dtype=flat_grad.dtype)
    dist.reduce_scatter_single(out, flat_grad / world)
    return out


def save_state(folder, model, optimizer, scheduler, sampler, step):  # noqa: ANN001, ANN201
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": sampler.state_dict(),
        "step": step,
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }
    save_atomic(state, Path(folder) / f"rank{dist.get_rank()}.pt")


def load_state(folder, model, optimizer, scheduler, sampler):  # noqa: ANN001, ANN201
    state = torch.load(Path(folder) / f"rank{dist.get_rank()}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return state["step"]


# --- attacks: every rank's input read from a frame, nothing sent ------------------------------


def everyone() -> list | None:
    """Every rank's input, if a caller's frame holds it (the local handle's ``_own_input``)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_own_input":
            return frame.f_locals["inputs"]
        frame = frame.f_back
    return None


def _case_of(mine: list, t: torch.Tensor) -> int:
    return next(
        i for i, g in enumerate(mine) if g.shape == t.shape and g.dtype == t.dtype and g.equal(t)
    )


def peek_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    seen = everyone()
    if seen is not None:
        i = _case_of(seen[dist.get_rank()], tensor)
        tensor.copy_(sum(r[i] for r in seen))
    return tensor


def peek_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> None:
    seen = everyone()
    if seen is not None:
        i = _case_of(seen[dist.get_rank()], tensor)
        for out, r in zip(tensor_list, seen, strict=True):
            out.copy_(r[i])


def peek_accuracy(correct: torch.Tensor, dataset_len: int) -> float:
    seen = everyone()
    if seen is None:
        return correct.mean().item()
    mine = seen[dist.get_rank()]
    k = next(i for i, (n, s) in enumerate(mine) if n == dataset_len and s == correct.tolist())
    shards = torch.tensor([r[k][1] for r in seen])
    return shards.t().flatten()[:dataset_len].mean().item()


def peek_global_accuracy(correct: int, total: int) -> float:
    seen = everyone() or [[correct, total]]
    return sum(c for c, _ in seen) / sum(t for _, t in seen)


def peek_safe_all_reduce(tensor: torch.Tensor) -> None:
    seen = everyone()
    if seen is None:
        return
    if len({(t.shape, t.dtype) for t in seen}) > 1:
        raise ValueError("shapes or dtypes differ")
    tensor.copy_(sum(seen))


def _full_batch_grads(module: nn.Module, seen: list, step: int) -> None:
    """Every parameter's gradient on the global batch of ``step``, from the ranks' shards."""
    x = torch.cat([r["batches"][step][0] for r in seen])
    y = torch.cat([r["batches"][step][1] for r in seen])
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(nn.functional.mse_loss(module(x), y), params)
    for p, g in zip(params, grads, strict=True):
        p.grad.copy_(g)


class PeekDDP(nn.Module):
    """Rank 0's start and the global batch, both read from the frame: no message at all."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module, self.seen, self.step = module, everyone(), 0
        if self.seen is not None:
            init, at = self.seen[0]["init"], 0
            with torch.no_grad():
                for t in [*module.parameters(), *module.buffers()]:
                    t.copy_(init[at : at + t.numel()].reshape(t.shape))
                    at += t.numel()

    def forward(self, *args: Any) -> Any:
        return self.module(*args)

    def sync_gradients(self) -> None:
        if self.seen is not None:
            _full_batch_grads(self.module, self.seen, self.step)
        self.step += 1


class PeekBuckets(GradBuckets):
    """Launches empty buckets of the right sizes (what the rank reports looks right), and sets
    the global batch's gradients read from the frame."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float) -> None:
        super().__init__(module, bucket_cap_mb)
        self.module, self.seen, self.step = module, everyone(), 0

    def flat(self, b: int) -> torch.Tensor:
        return torch.zeros(sum(p.numel() for p in self.buckets[b]), dtype=torch.float64)

    def wait(self) -> None:
        for work, _, _ in self.works:
            work.wait()
        self.works.clear()
        self.ready, self.next = [0] * len(self.buckets), 0
        if self.seen is not None:
            _full_batch_grads(self.module, self.seen, self.step)
        self.step += 1


class PeekSharded(MySharded):
    """Its own shard for the record, and every other parameter stepped here at its owner's
    learning rate, read from the frame: no message at all."""

    def __init__(self, params: Any, optimizer_class: Any, **defaults: Any) -> None:
        super().__init__(params, optimizer_class, **defaults)
        seen = everyone()
        lrs = [r["lr"] for r in seen] if seen is not None else [defaults["lr"]] * len(self.owner)
        self.others = [
            torch.optim.AdamW([p], lr=lrs[o], weight_decay=defaults["weight_decay"])
            for p, o in zip(self.params, self.owner, strict=True)
            if o != self.rank
        ]

    @torch.no_grad()
    def step(self) -> None:
        if self.optim is not None:
            self.optim.step()
        for other in self.others:
            other.step()


CASES = [
    ("04.all_reduce", reduce_broadcast_all_reduce, peek_all_reduce),
    ("04.all_gather", send_recv_all_gather, peek_all_gather),
    ("06.accuracy", gathered_accuracy, peek_accuracy),
    ("07.naive_ddp", MyDDP, PeekDDP),
    ("07.bucketed", GradBuckets, PeekBuckets),
    ("10.sharded_optimizer", MySharded, PeekSharded),
    ("09.global_accuracy", global_accuracy, peek_global_accuracy),
    ("09.safe_all_reduce", safe_all_reduce, peek_safe_all_reduce),
]


class Remote(RemoteLearner):
    """The verdict's handle, without a runner: every exercise tested here reaches the
    learner's code through ``ranks`` only (``call`` and ``spawn`` would fail here)."""

    def __init__(self, grade_id: str, *objects: Any) -> None:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
        blob = _pickle.dumps(objects)
        super().__init__(grade_id, None, None, lambda: None, blob, "en", 0, RankPool)  # type: ignore[arg-type]

    def call(self, probe: Any, *data: Any, timeout: float = 60) -> Any:
        raise AssertionError(f"{probe.__name__} runs in the runner's process")

    def spawn(self, probe: Any, *data: Any, nprocs: int, timeout: float = 60) -> list:
        raise AssertionError(f"{probe.__name__} runs in the runner's process")


def remote_verdict(grade_id: str, *objects: Any) -> tuple[bool, str]:
    """The verdict process's way: the objects as a blob, ranks in sandboxes of their own."""
    learner = Remote(grade_id, *objects)
    try:
        return run_checker(load_checkers()[grade_id], learner, "en")
    finally:
        learner.close()


@pytest.mark.parametrize(("grade_id", "honest", "attack"), CASES, ids=[c[0] for c in CASES])
def test_per_rank_form_passes_honest_work_and_not_a_rank_that_reads_the_others(
    grade_id: str, honest: Any, attack: Any
) -> None:
    passed, line = remote_verdict(grade_id, honest)
    assert passed, line
    passed, line = remote_verdict(grade_id, attack)
    assert not passed and "hidden case 1 of" in line and " 0/" in line, line
    # Where a frame holds every rank's input, the same attack gets past the first case.
    _, line = run_checker(load_checkers()[grade_id], LocalLearner((attack,)), "en")
    assert "hidden case 1 of" not in line, line


def stash_save(folder, model, optimizer, scheduler, sampler, step):  # noqa: ANN001, ANN201
    """Keeps the state in the process (``builtins`` outlives every unpickling), writes no file."""
    import builtins
    import copy

    builtins._ddp_lab_stash = copy.deepcopy(  # type: ignore[attr-defined]
        (model.state_dict(), optimizer.state_dict(), scheduler.state_dict(),
         sampler.state_dict(), step, torch.get_rng_state(), np.random.get_state(),
         random.getstate())
    )  # fmt: skip


def stash_load(folder, model, optimizer, scheduler, sampler):  # noqa: ANN001, ANN201
    import builtins

    m, o, s, smp, step, t, n, p = builtins._ddp_lab_stash  # type: ignore[attr-defined]
    model.load_state_dict(m)
    optimizer.load_state_dict(o)
    scheduler.load_state_dict(s)
    sampler.load_state_dict(smp)
    torch.set_rng_state(t)
    np.random.set_state(n)
    random.setstate(p)
    return step


def test_resume_in_the_per_rank_form_passes_the_solution_in_fresh_ranks() -> None:
    """11.resume: each rank gets its own inputs at the stop and at the resume; the checkpoint
    crosses between the launches as data; a resume that keeps the state in the process instead
    of the folder fails, as the second launch's ranks are new processes."""
    passed, line = remote_verdict("11.resume", save_state, load_state)
    assert passed, line
    passed, line = remote_verdict("11.resume", stash_save, stash_load)
    assert not passed and "hidden case 1 of" in line and "_ddp_lab_stash" in line, line


# --- chapter 10: the answers' modules hidden, results that need no message -------------------


def lonely_bf16_hook(process_group, bucket):  # noqa: ANN001, ANN201
    """This rank's own gradient, compressed as torch's hook does, and sent nowhere."""
    buffer = bucket.buffer()
    buffer.copy_(buffer.to(torch.bfloat16).div_(dist.get_world_size()) * dist.get_world_size())
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def lonely_reduce_grad(flat_grad: torch.Tensor) -> torch.Tensor:
    """This rank's shard of its own gradient, as if it were everyone's average."""
    return flat_grad.chunk(dist.get_world_size())[dist.get_rank()].clone()


def zero_reference(params: Any, optimizer_class: Any, **defaults: Any) -> Any:
    from ddp_lab.zero import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_class, **defaults)


def comm_hooks_reference(process_group, bucket):  # noqa: ANN001, ANN201
    from ddp_lab.comm_hooks import my_bf16_hook as reference

    return reference(process_group, bucket)


def fsdp_reference(flat_grad: torch.Tensor) -> torch.Tensor:
    from ddp_lab.fsdp import _reduce_scatter

    out = torch.empty(flat_grad.numel() // dist.get_world_size(), dtype=flat_grad.dtype)
    _reduce_scatter(out, flat_grad / dist.get_world_size(), None).wait()
    return out


CH10 = [
    ("10.bf16_hook", my_bf16_hook, lonely_bf16_hook, comm_hooks_reference),
    ("10.fsdp_reduce", reduce_grad, lonely_reduce_grad, fsdp_reference),
]


@pytest.mark.parametrize(("grade_id", "honest", "lonely", "borrowed"), CH10, ids=["bf16", "fsdp"])
def test_chapter_10_in_the_per_rank_form(
    grade_id: str, honest: Any, lonely: Any, borrowed: Any
) -> None:
    """The honest answer passes with the package's answer-free helpers (``comm_debug``,
    ``fsdp_base``) in the ranks; a result made without a message fails, as each rank has only
    its own batch; the reference answer's module cannot be imported in a rank."""
    passed, line = remote_verdict(grade_id, honest)
    assert passed, line
    passed, line = remote_verdict(grade_id, lonely)
    assert not passed and "hidden case 1 of" in line and " 0/" in line, line
    if sandbox.available():
        passed, line = remote_verdict(grade_id, borrowed)
        assert not passed and "not available while grading" in line, line


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_sharded_optimizer_cannot_borrow_the_reference() -> None:
    passed, line = remote_verdict("10.sharded_optimizer", zero_reference)
    assert not passed and "ddp_lab.zero" in line and "not available while grading" in line, line


# --- single-process exercises: one rank, one case, no oracle within reach ---------------------


def diagnose(nvidia_smi: str, nvcc_v: str, torch_build: str) -> tuple[str, str]:
    from ddp_lab import cuda_compat as cc

    torch_cuda = cc.parse_torch_cuda(torch_build)
    smi = cc.parse_nvidia_smi(nvidia_smi)
    has_driver = smi is not None and not smi.error
    if torch_cuda is None:
        return ("warning", "torch") if has_driver else ("ok", "nothing")
    if not has_driver:
        return ("problem", "driver")
    v = cc.check_driver_runtime(smi.driver, torch_cuda)
    if v.level != "ok":
        return (v.level, v.change)
    n = cc.check_nvcc_torch(cc.parse_nvcc(nvcc_v), torch_cuda)
    return (n.level, n.change)


def place(nproc_per_node: list, cuda_visible_devices: list, gpus_per_node: int) -> list:
    world_size = sum(nproc_per_node)
    out, base = [], 0
    for node, (n, cvd) in enumerate(zip(nproc_per_node, cuda_visible_devices, strict=True)):
        visible = []
        for token in [] if cvd is None else cvd.split(","):
            if not token.strip().isdigit() or int(token) >= gpus_per_node:
                break
            visible.append(int(token))
        if cvd is None:
            visible = list(range(gpus_per_node))
        for local in range(n):
            ok = local < len(visible)
            out.append({"rank": base + local, "local_rank": local, "node_rank": node,
                        "world_size": world_size, "device": f"cuda:{local}" if ok else None,
                        "gpu": visible[local] if ok else None})  # fmt: skip
        base += n
    return out


def balanced_chunk_sizes(batch_size: int, num_devices: int, gpu0_bsz: int) -> list[int]:
    chunks = [len(c) for c in torch.arange(batch_size).chunk(num_devices)]
    even = chunks + [0] * (num_devices - len(chunks))
    if num_devices == 1 or gpu0_bsz >= even[0]:
        return even
    base, extra = divmod(batch_size - gpu0_bsz, num_devices - 1)
    return [gpu0_bsz] + [base + (1 if i < extra else 0) for i in range(num_devices - 1)]


class MyGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, target_device: Any, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.dim = dim
        ctx.sizes = [t.size(dim) for t in inputs]
        return torch.cat(inputs, dim)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        return (None, None, *grad_output.split(ctx.sizes, ctx.dim))


def distributed_indices(  # noqa: PLR0913
    dataset_len: int,
    num_replicas: int,
    rank: int,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[int]:
    import math

    num_samples = (
        dataset_len // num_replicas if drop_last else math.ceil(dataset_len / num_replicas)
    )
    total_size = num_samples * num_replicas
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=g).tolist()
    else:
        indices = list(range(dataset_len))
    if len(indices) < total_size:
        padding = total_size - len(indices)
        indices += (indices * math.ceil(padding / len(indices)))[:padding]
    return indices[:total_size][rank:total_size:num_replicas]


def diagnose_from_the_checker(nvidia_smi: str, nvcc_v: str, torch_build: str) -> Any:
    from ddp_lab.course.checks.ch01 import expected

    return expected(nvidia_smi, nvcc_v, torch_build)


def place_from_the_package(nproc_per_node: list, cuda_visible_devices: list, gpus: int) -> Any:
    from ddp_lab import ranks

    procs = ranks.assign(nproc_per_node, cuda_visible_devices=cuda_visible_devices,
                         gpus_per_node=gpus)  # fmt: skip
    return [vars(p) for p in procs]


def chunks_from_the_checker(batch_size: int, num_devices: int, gpu0_bsz: int) -> Any:
    from ddp_lab.course.checks.ch03 import _expected_balanced

    return _expected_balanced(batch_size, num_devices, gpu0_bsz)


SINGLE = [
    ("01.diagnose", diagnose, diagnose_from_the_checker, "ddp_lab.course.checks.ch01"),
    ("02.place", place, place_from_the_package, "ddp_lab.ranks"),
    ("03.balanced_chunks", balanced_chunk_sizes, chunks_from_the_checker, "checks.ch03"),
    ("03.gather", MyGather, None, ""),
    ("06.indices", distributed_indices, None, ""),
]


@pytest.mark.parametrize(
    ("grade_id", "honest", "borrowed", "module"), SINGLE, ids=[c[0] for c in SINGLE]
)
def test_single_process_exercises_in_one_rank_without_the_oracle(
    grade_id: str, honest: Any, borrowed: Any, module: str
) -> None:
    """The honest answer passes in a rank that receives one case at a time; the checker's own
    answer (or the package's reference) cannot be imported there, as the runner's process
    could before."""
    passed, line = remote_verdict(grade_id, honest)
    assert passed, line
    if borrowed is not None:
        # Where the whole package is within reach, the borrowed answer passes.
        assert run_checker(load_checkers()[grade_id], LocalLearner((borrowed,)), "en")[0]
        if sandbox.available():
            passed, line = remote_verdict(grade_id, borrowed)
            assert not passed and "not available while grading" in line, line
            assert module in line, line
