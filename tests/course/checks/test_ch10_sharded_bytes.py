"""10.sharded_optimizer's broadcasts, counted by the grader from outside the ranks
(``ch10_sharded_bytes``).

The judging function on byte counts measured in the grading sandboxes (the calibration in
``ch10_sharded_bytes`` and docs/INSTRUCTORS.md); the byte case with a fake learner (the
fallbacks where nothing was counted); then the checker end to end on real ranks, the bytes
those of the grading sandbox, recorded: a rank that steps every parameter itself at its
owners' learning rates (which it asked for) and broadcasts nothing, which the training cases
cannot tell from ZeRO-1, gets nothing.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from ddp_lab.course.grading import CaseFailed, load_checkers, run_checker, traffic
from ddp_lab.course.grading.learner import LocalLearner

# Measured (benchmarks/bench_zero_traffic.py --seed 0), N = 3, six float64 parameters of
# [9311, 9890, 3663, 7242, 11376, 10961] elements; what each rank does not own under the rule:
# [299232, 273920, 265936] bytes. Per rank received, per step:
SIZES = [9311, 9890, 3663, 7242, 11376, 10961]
MEASURED_RIGHT = {
    "a broadcast of each parameter from its owner": [[299808, 274496, 266512]] * 2,
    "an all-gather of the padded shards": [[307792, 307792, 307792]] * 2,
}
MEASURED_WRONG = {
    "steps every parameter, no broadcast": [[0, 0, 0]] * 2,
    "steps every parameter at the owners' rates (all-gathered)": [[592, 592, 592], [0, 0, 0]],
}


def _seen(per_rank: list[int]) -> traffic.Traffic:
    """What every rank received in one step, split evenly over the other ranks."""
    n = len(per_rank)
    pairs = {(a, b): per_rank[b] // (n - 1) for b in range(n) for a in range(n) if a != b}
    return traffic.Traffic(pairs=pairs)


def _least() -> int:
    from ddp_lab.course.grading.checks.ch10 import rule_loads
    from ddp_lab.course.grading.checks.ch10_sharded_bytes import received_least

    return received_least(SIZES, 8, 3, rule_loads)


@pytest.mark.parametrize("name", sorted(MEASURED_RIGHT))
def test_measured_zero1_steps_are_above_the_bound(name: str) -> None:
    from ddp_lab.course.grading.checks.ch10_sharded_bytes import judge_received

    judge_received([_seen(step) for step in MEASURED_RIGHT[name]], _least(), 3, "case")


@pytest.mark.parametrize("name", sorted(MEASURED_WRONG))
def test_measured_local_steps_fail(name: str) -> None:
    from ddp_lab.course.grading.checks.ch10_sharded_bytes import judge_received

    with pytest.raises(CaseFailed, match="the grader saw rank 0 receive .* bytes .* in step 1"):
        judge_received([_seen(step) for step in MEASURED_WRONG[name]], _least(), 3, "case")


def test_the_bound_sits_far_from_both() -> None:
    from ddp_lab.course.grading.checks.ch10_sharded_bytes import judge_received

    least = _least()
    assert (
        592 * 100
        < least
        < min(MEASURED_RIGHT["a broadcast of each parameter from its owner"][0]) / 1.9
    )
    # one step without the broadcasts is enough, on any rank
    calls = [_seen([299808, 274496, 266512]), _seen([299808, 274496, 266512])]
    calls[1].pairs = {k: v for k, v in calls[1].pairs.items() if k[1] != 2}
    with pytest.raises(CaseFailed, match="rank 2 receive 0 bytes .* in step 2"):
        judge_received(calls, least, 3, "case")


# --- the byte case, with a learner of the test's: its results AdamW's, its bytes given ---------


class Given:
    """Answers the byte probe with the right parameters (AdamW, computed as the oracle is);
    ``traffic`` and ``unobserved`` as the grader would have seen them."""

    def __init__(self, seen: list | None, why: str = "") -> None:
        self.seen, self.unobserved, self.traffic, self.notes = seen, why, None, []

    def ranks(self, probe, inputs, timeout=60, fresh=False):
        from ddp_lab.course.grading.checks.ch10_sharded_bytes import _adamw

        assert getattr(probe, "per_call", False) and len({id(x) for x in inputs}) == 1
        want = _adamw(inputs[0])
        self.traffic = self.seen
        steps = len(inputs[0])
        return [[{"params": None}] * (steps - 1) + [{"params": want}] for _ in inputs]


def _check(learner: Given) -> None:
    from ddp_lab.course.grading.checks.ch10 import rule_loads
    from ddp_lab.course.grading.checks.ch10_sharded_bytes import check_sharded_bytes

    check_sharded_bytes(random.Random(0), learner, "case", rule_loads)


def test_the_byte_case_judges_what_the_grader_counted() -> None:
    right = [_seen([299808, 274496, 266512])] * 2  # above any draw's bound (about 140000)
    _check(Given(right))
    with pytest.raises(CaseFailed, match="the grader saw rank 0 receive 592 bytes"):
        _check(Given([_seen([592] * 3), _seen([0] * 3)]))


def test_the_byte_case_without_counts() -> None:
    with pytest.raises(CaseFailed, match="could not count the bytes"):
        _check(Given(None, "unreadable"))
    nothing = Given(None, "no-sandbox")
    _check(nothing)
    assert "whether each rank received the parameters it does not own" in nothing.notes[0]
    _check(Given(None, "self-study"))  # the learner's own processes: no byte case


# --- the checker end to end, on real ranks, with the bytes the sandbox counted -----------------


class StepsAllAtTheOwnersRates:
    """Review 9's answer: the shard's optimizer built for the probe's record only; every rank
    steps every parameter, at its owner's learning rate (the rates all-gathered, 8 bytes a
    rank), and broadcasts nothing. Its parameters are right: the probe averages the
    gradients."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        rank, world = dist.get_rank(), dist.get_world_size()
        loads, owner = [0] * world, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            owner[i] = loads.index(min(loads))
            loads[owner[i]] += self.params[i].numel()
        mine = [p for p, o in zip(self.params, owner, strict=True) if o == rank]
        if mine:
            optimizer_class(mine, **defaults)  # for the record only
        lr = torch.tensor([float(defaults["lr"])], dtype=torch.float64)
        lrs = [torch.zeros_like(lr) for _ in range(world)]
        dist.all_gather(lrs, lr)
        base = next(c for c in optimizer_class.__mro__ if c.__module__.startswith("torch.optim"))
        rest = {k: v for k, v in defaults.items() if k != "lr"}
        groups = [
            {"params": [p for p, o in zip(self.params, owner, strict=True) if o == r]}
            | {"lr": lrs[r].item()}
            for r in range(world)
        ]
        self.full = base([g for g in groups if g["params"]], **rest)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.full.step()


class Recorded(LocalLearner):
    """The learner's ranks as in self-study (real processes, real results), but graded: the
    byte probe's counts are those the grading sandbox measured for this answer."""

    unobserved = ""

    def __init__(self, obj: object, seen: list) -> None:
        super().__init__((obj,))
        self.seen, self.traffic = seen, None

    def ranks(self, probe, inputs, timeout=60, fresh=False, share=None):
        out = super().ranks(probe, inputs, timeout, fresh, share)
        self.traffic = self.seen if getattr(probe, "per_call", False) else None
        return out


def test_local_steps_at_the_owners_rates_get_nothing() -> None:
    """4/4 before: its parameters are right in every training case, and its inner optimizer
    was given its shard only."""
    seen = [
        _seen(step)
        for step in MEASURED_WRONG["steps every parameter at the owners' rates (all-gathered)"]
    ]
    learner = Recorded(StepsAllAtTheOwnersRates, seen)
    passed, line = run_checker(load_checkers()["10.sharded_optimizer"], learner, "en")
    assert not passed and " 0/4" in line and "Hidden case 3 of 3" in line, line
    assert "the grader saw rank 0 receive 592 bytes" in line, line
