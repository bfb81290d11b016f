"""Chapter 10's checkers accept correct solutions and reject the typical wrong ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import all_reduce  # a name bound before any checker runs (see below)

from ddp_lab.comm_hooks import my_bf16_hook
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import LearnerError, LocalLearner
from ddp_lab.tools.doctor_facts import collective
from ddp_lab.zero import ShardedOptimizer


def verdict(grade_id: str, obj: object) -> str:
    """'' when every hidden case passes, else the failing verdict line (in English)."""
    passed, line = run_checker(load_checkers()[grade_id], LocalLearner((obj,)), "en")
    return "" if passed else line


# ----- 10.sharded_optimizer -----------------------------------------------------------------


class MySharded:
    """A correct solution written independently of ddp_lab.zero; options make mistakes."""

    def __init__(self, params, optimizer_class, *, mode="ok", **defaults):
        self.params = list(params)
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if mode == "round robin by index, no balance":
            self.owner = [0 if i < len(self.params) - 1 else 1 for i in range(len(self.params))]
        elif mode == "round robin in definition order":
            self.owner = [i % world for i in range(len(self.params))]
        else:
            n = len(self.params)
            order = sorted(range(n), key=lambda i: -self.params[i].numel())
            if mode == "greedy in definition order":  # the largest-first sort left out
                order = list(range(n))
            elif mode == "smallest first":
                order = order[::-1]
            loads, counts, self.owner = [0] * world, [0] * world, [0] * n
            for i in order:
                least = counts if mode == "by count" else loads  # parameters, not elements
                r = least.index(min(least))
                self.owner[i], loads[r] = r, loads[r] + self.params[i].numel()
                counts[r] += 1
        self.mode = mode
        mine = [p for p, o in zip(self.params, self.owner, strict=True) if o == self.rank]
        if mode == "steps everything":
            mine = self.params
        self.optim = optimizer_class(mine, **defaults) if mine else None
        if mode == "steps the others itself":  # its own shard for the record, no message
            others = [p for p in self.params if id(p) not in {id(q) for q in mine}]
            self.optim2 = torch.optim.AdamW(others, **defaults) if others else None

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        if self.optim is not None:
            self.optim.step()
        if self.mode == "steps the others itself":
            if self.optim2 is not None:
                self.optim2.step()
            return
        if self.mode in ("forgets to share", "steps everything"):
            return
        for p, o in zip(self.params, self.owner, strict=True):
            dist.broadcast(p, src=o)


def _variant(mode):
    return lambda params, cls, **kw: MySharded(params, cls, mode=mode, **kw)


def test_sharded_checker_passes_correct_solutions():
    assert verdict("10.sharded_optimizer", MySharded) == ""
    assert verdict("10.sharded_optimizer", ShardedOptimizer) == ""


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("steps everything", "only"),
        ("forgets to share", "broadcast"),
        # right if every rank had every rank's learning rate; each has only its own
        ("steps the others itself", "broadcast"),
        ("round robin by index, no balance", "least loaded"),
        # within ideal + largest, so the old bound passed it; the stated rule does not
        ("round robin in definition order", "largest parameters first"),
        # passed most seeds when the one hidden model's definition order was nearly sorted
        ("greedy in definition order", "largest parameters first"),
        ("smallest first", "largest parameters first"),
        ("by count", "largest parameters first"),
    ],
)
def test_sharded_checker_rejects_wrong_solutions(mode, words):
    why = verdict("10.sharded_optimizer", _variant(mode))
    assert words in why


def _owners(sizes: list[int], world: int, rule: str) -> list[int]:
    """Each parameter's owner under ``rule`` (written here apart from the checker's)."""
    n = len(sizes)
    if rule == "round robin":
        return [i % world for i in range(n)]
    order = {
        "largest first": sorted(range(n), key=lambda i: -sizes[i]),
        "definition order": list(range(n)),
        "reverse definition order": list(range(n))[::-1],
        "smallest first": sorted(range(n), key=lambda i: sizes[i]),
        "largest first, by count": sorted(range(n), key=lambda i: -sizes[i]),
    }[rule]
    elements, count, owner = [0] * world, [0] * world, [0] * n
    for i in order:
        least = count if rule.endswith("by count") else elements
        owner[i] = least.index(min(least))
        elements[owner[i]] += sizes[i]
        count[owner[i]] += 1
    return owner


SHARD_RULES = [
    "largest first",
    "definition order",
    "reverse definition order",
    "smallest first",
    "round robin",
    "largest first, by count",
]


def test_sharded_cases_tell_every_wrong_rule_apart_under_every_seed(monkeypatch):
    """Every hidden model, under every seed, fails each wrong assignment rule (applied to every
    parameter or to the trainable ones only) and passes the exercise's."""
    from ddp_lab.course.grading.checkers import rng_for
    from ddp_lab.course.grading.checks import ch10

    for seed in [str(i) for i in range(30)] + ["course-2026-spring"]:
        monkeypatch.setenv("DDP_LAB_GRADE_SEED", seed)
        cases = ch10.sharded_specs(rng_for("10.sharded_optimizer"))
        assert [world for world, _ in cases][:2] == [2, 3]
        for world, spec in cases:
            params = list(ch10._tied_model(spec).parameters())
            trainable = [i for i, p in enumerate(params) if p.requires_grad]
            assert len(trainable) < len(params), "a frozen parameter in every model"
            assert len(params) < len(list(ch10._tied_model(spec).state_dict())), "tied"
            for rule in SHARD_RULES:
                for scope in (list(range(len(params))), trainable):
                    owner = _owners([params[i].numel() for i in scope], world, rule)
                    owned = [
                        [i for i, o in zip(scope, owner, strict=True) if o == r]
                        for r in range(world)
                    ]
                    why = ch10.loads_verdict(params, owned, world)
                    if rule == "largest first":
                        assert why == "", (seed, spec, scope)
                    else:
                        assert "largest parameters first" in why, (seed, rule, spec, scope)


def test_sharded_checker_grades_the_cases_of_sharded_specs(monkeypatch):
    """The checker trains exactly the models of ``sharded_specs`` (what the test above reads)."""
    from ddp_lab.course.grading.checkers import rng_for
    from ddp_lab.course.grading.checks import ch10

    monkeypatch.setenv("DDP_LAB_GRADE_SEED", "7")
    world, spec = ch10.sharded_specs(rng_for("10.sharded_optimizer"))[0]
    seen = []

    class Recorder:
        def ranks(self, probe, inputs, timeout=60, fresh=False):
            seen.extend(inputs)
            raise LearnerError("NotImplementedError", "your code here")

    run_checker(load_checkers()["10.sharded_optimizer"], Recorder(), "en")
    assert len(seen) == world
    for rank, mine in enumerate(seen):
        assert mine["order"] == spec["order"] and mine["lr"] == spec["lrs"][rank]
        assert (mine["vocab"], mine["dim"], mine["hidden"]) == tuple(
            spec[k] for k in ("vocab", "dim", "hidden")
        )


# ----- 10.bf16_hook ---------------------------------------------------------------------------


def sums_hook(process_group, bucket):
    buf = bucket.buffer()
    fut = dist.all_reduce(buf.to(torch.bfloat16), async_op=True).get_future()
    return fut.then(lambda f: buf.copy_(f.value()[0]))


def fp32_hook(process_group, bucket):
    buf = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def imported_name_hook(process_group, bucket):
    """Correct, calling all_reduce by a name imported from torch.distributed when the module
    was loaded (a common style: a counter that replaces dist.all_reduce does not see it)."""
    buf = bucket.buffer()
    half = buf.to(torch.bfloat16).div_(dist.get_world_size())
    fut = all_reduce(half, async_op=True).get_future()
    return fut.then(lambda f: buf.copy_(f.value()[0]))


def process_group_hook(process_group, bucket):
    """Sends float32 through the process group's own method: not a bf16 hook."""
    buf = bucket.buffer().div_(dist.get_world_size())
    return dist.group.WORLD.allreduce(buf).get_future().then(lambda f: f.value()[0])


def test_hook_checker_passes_the_reference():
    assert verdict("10.bf16_hook", my_bf16_hook) == ""


def test_hook_checker_passes_a_correct_hook_that_imports_all_reduce_by_name():
    assert verdict("10.bf16_hook", imported_name_hook) == ""


@pytest.mark.parametrize(
    ("wrong", "words"),
    [(sums_hook, "differ"), (fp32_hook, "bfloat16"), (process_group_hook, "bfloat16")],
)
def test_hook_checker_rejects_wrong_hooks(wrong, words):
    assert words in verdict("10.bf16_hook", wrong)


# ----- 10.fsdp_reduce ---------------------------------------------------------------------------


def _reduce_scatter():
    """dist.reduce_scatter_single, under its old name on torch before 2.13 (2.11 lacks it)."""
    return collective("reduce_scatter_single")


def reduce_scatter_grad(flat):
    out = torch.empty(flat.numel() // dist.get_world_size(), dtype=flat.dtype)
    _reduce_scatter()(out, flat / dist.get_world_size())
    return out


def all_reduce_grad(flat):
    flat = flat / dist.get_world_size()
    dist.all_reduce(flat)
    return flat.chunk(dist.get_world_size())[dist.get_rank()].clone()


def summing_grad(flat):
    out = torch.empty(flat.numel() // dist.get_world_size(), dtype=flat.dtype)
    _reduce_scatter()(out, flat)
    return out


def gather_and_sum_grad(flat):
    world = dist.get_world_size()
    parts = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(parts, flat)
    return (sum(parts) / world).chunk(world)[dist.get_rank()].clone()


def whole_grad(flat):
    flat = flat.clone()
    dist.all_reduce(flat)
    return flat


def imported_all_reduce_grad(flat):  # all_reduce by a name imported before the counter
    total = flat / dist.get_world_size()
    all_reduce(total)
    return total.chunk(dist.get_world_size())[dist.get_rank()].clone()


def broadcasts_grad(flat):  # an all-gather made of broadcasts, then a local sum
    world, total = dist.get_world_size(), torch.zeros_like(flat)
    for src in range(world):
        buf = flat.clone()
        dist.broadcast(buf, src=src)
        total += buf
    return (total / world).chunk(world)[dist.get_rank()].clone()


def group_method_grad(flat):  # the process group's own all-reduce
    total = flat / dist.get_world_size()
    dist.group.WORLD.allreduce(total).wait()
    return total.chunk(dist.get_world_size())[dist.get_rank()].clone()


def funcol_reduce_scatter_grad(flat):  # the functional collectives: operators of their own
    world = dist.get_world_size()
    return funcol.reduce_scatter_tensor(flat / world, "sum", 0, dist.group.WORLD).wait()


def funcol_all_reduce_grad(flat):
    world = dist.get_world_size()
    total = funcol.all_reduce(flat / world, "sum", dist.group.WORLD).wait()
    return total.chunk(world)[dist.get_rank()].clone()


def _exchanged(flat, shard_of):
    """Send ``shard_of(flat, peer)`` to every other rank and receive theirs (batched)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    peers = [p for p in range(world) if p != rank]
    got = {p: torch.empty_like(shard_of(flat, rank)) for p in peers}
    ops = [dist.P2POp(dist.isend, shard_of(flat, p).contiguous(), p) for p in peers]
    ops += [dist.P2POp(dist.irecv, got[p], p) for p in peers]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


def p2p_reduce_scatter_grad(flat):  # by hand: each rank receives one shard from each other
    world, rank = dist.get_world_size(), dist.get_rank()
    got = _exchanged(flat, lambda f, p: f.chunk(world)[p])
    return (flat.chunk(world)[rank] + sum(got.values())) / world


def p2p_gather_and_sum_grad(flat):  # an all-gather by send/recv, then a local sum
    world, rank = dist.get_world_size(), dist.get_rank()
    got = _exchanged(flat, lambda f, p: f)
    return ((flat + sum(got.values())) / world).chunk(world)[rank].clone()


def batch_p2p_gather_and_sum_grad(flat):  # an all-gather by the functional batch_p2p_ops
    world, rank = dist.get_world_size(), dist.get_rank()
    peers = [p for p in range(world) if p != rank]
    bufs = [torch.empty_like(flat) for _ in peers]
    ops, tensors = ["isend", "irecv"] * len(peers), []
    for b in bufs:
        tensors += [flat, b]
    who = [p for p in peers for _ in range(2)]
    funcol_ops = torch.ops._c10d_functional
    works = funcol_ops.batch_p2p_ops(ops, who, [0] * len(ops), tensors, dist.group.WORLD.group_name)
    for w in works:
        funcol_ops.wait_tensor(w)
    return ((flat + sum(bufs)) / world).chunk(world)[rank].clone()


def gather_to_each_root_grad(flat):  # every rank's whole gradient gathered on each in turn
    world, rank = dist.get_world_size(), dist.get_rank()
    total = None
    for root in range(world):
        parts = [torch.empty_like(flat) for _ in range(world)] if rank == root else None
        dist.gather(flat, parts, dst=root)
        total = sum(parts) if rank == root else total
    return (total / world).chunk(world)[rank].clone()


def all_to_all_whole_grad(flat):  # every rank's whole gradient to every rank
    world, rank = dist.get_world_size(), dist.get_rank()
    out = torch.empty(world * flat.numel(), dtype=flat.dtype)
    dist.all_to_all_single(out, flat.repeat(world))
    return (out.view(world, -1).sum(0) / world).chunk(world)[rank].clone()


def all_to_all_reduce_scatter_grad(flat):  # shard j of every rank to rank j: a reduce-scatter
    world = dist.get_world_size()
    out = torch.empty_like(flat)
    dist.all_to_all_single(out, flat / world)
    return out.view(world, -1).sum(0)


@pytest.mark.parametrize(
    "right",
    [
        reduce_scatter_grad,
        p2p_reduce_scatter_grad,
        funcol_reduce_scatter_grad,
        all_to_all_reduce_scatter_grad,
    ],
)
def test_fsdp_checker_passes_reduce_scatter(right):
    assert verdict("10.fsdp_reduce", right) == ""


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (all_reduce_grad, "all_reduce"),
        (summing_grad, "average"),
        (whole_grad, "all_reduce"),
        (gather_and_sum_grad, "dist.all_gather:"),  # the right numbers, N times the bytes
        (imported_all_reduce_grad, "dist.all_reduce:"),
        (broadcasts_grad, "dist.broadcast:"),
        (group_method_grad, "dist.all_reduce:"),
        (p2p_gather_and_sum_grad, "received more by dist.recv than a reduce-scatter"),
        (funcol_all_reduce_grad, "dist.all_reduce:"),  # passed: a namespace of its own
        # passed: not logged, or not counted as receiving
        (batch_p2p_gather_and_sum_grad, "received more by dist.recv than a reduce-scatter"),
        (gather_to_each_root_grad, "received more by dist.gather than a reduce-scatter"),
        (all_to_all_whole_grad, "received more by dist.all_to_all_single than"),
    ],
)
def test_fsdp_checker_rejects_wrong_solutions(wrong, words):
    assert words in verdict("10.fsdp_reduce", wrong)


def test_unsolved_exercises_report_not_implemented(capsys):
    from ddp_lab.course.grading import grade

    def stub(*args, **kwargs):
        raise NotImplementedError("your code here")

    for grade_id in ("10.sharded_optimizer", "10.bf16_hook", "10.fsdp_reduce"):
        with pytest.raises(AssertionError) as failed:
            grade(grade_id, stub)
        assert "NotImplementedError" in str(failed.value)


class Answers:
    """A learner handle whose ranks send back ``make(nprocs)``: what a tampered runner could."""

    def __init__(self, make):
        self.make = make

    def ranks(self, probe, inputs, timeout=60, fresh=False):
        result = self.make(len(inputs))
        if isinstance(result, Exception):
            raise result
        return result


@pytest.mark.parametrize("grade_id", ["10.sharded_optimizer", "10.bf16_hook", "10.fsdp_reduce"])
@pytest.mark.parametrize(
    "make",
    [
        lambda n: "PASS",
        lambda n: ["PASS"] * n,
        lambda n: [{}] * (n + 1),
        lambda n: [{"owned": "all", "params": [], "grads": 0, "dtypes": "bf16", "bytes": "2"}] * n,
        lambda n: [{"calls": [[1, "x", 0]], "error": None, "state": {}, "owned": [0, 1]}] * n,
        lambda n: [{"owned": [0], "params": [torch.zeros(1)], "grads": torch.zeros(1)}] * n,
        lambda n: [{"calls": [], "error": 3, "state": None, "dtypes": [], "bytes": 0}] * n,
        lambda n: LearnerError("WireError", "a MyTensor cannot be sent"),
    ],
)
def test_results_that_are_not_the_probes_data_fail_cleanly(grade_id, make):
    passed, line = run_checker(load_checkers()[grade_id], Answers(make), "en")
    assert not passed and line.startswith(f"FAIL {grade_id}") and "Hidden case 1 of" in line
    assert "wrong form" in line or "WireError" in line, line
