"""Chapter 07's checkers accept correct solutions and reject the typical wrong ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed import all_reduce  # a name the checker cannot patch: FromImportBuckets

from ddp_lab.buckets import assign_buckets
from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.learner import LearnerError, LocalLearner
from ddp_lab.ddp import NaiveDDP


def verdict(grade_id: str, obj: object) -> str:
    """'' when every hidden case passes, else the failing verdict line (in English)."""
    passed, line = run_checker(load_checkers()[grade_id], LocalLearner((obj,)), "en")
    return "" if passed else line


# ----- 07.naive_ddp -------------------------------------------------------------------


class MyDDP(nn.Module):
    """A correct learner solution, written independently of ddp_lab.ddp."""

    def __init__(
        self,
        module: nn.Module,
        init_sync: bool = True,
        frozen: bool = True,
        buffers: str = "every forward",
        average: bool = True,
    ) -> None:
        super().__init__()
        self.module, self.buffers_mode, self.average = module, buffers, average
        params = [p for p in module.parameters() if frozen or p.requires_grad]
        if init_sync:
            for t in params:
                dist.broadcast(t.data, src=0)
            if buffers != "never":
                for b in module.buffers():
                    dist.broadcast(b, src=0)

    def forward(self, *args: object) -> torch.Tensor:
        if self.buffers_mode == "every forward":
            for b in self.module.buffers():
                dist.broadcast(b, src=0)
        return self.module(*args)

    def sync_gradients(self) -> None:
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                if self.average:
                    p.grad /= dist.get_world_size()


class SumsDDP(MyDDP):
    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, average=False)


class NoBroadcastDDP(MyDDP):
    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, init_sync=False)


class ForgetsBuffersDDP(MyDDP):
    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, buffers="never")


class BuffersOnceDDP(MyDDP):
    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, buffers="at construction")


class TrainableOnlyDDP(MyDDP):
    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, frozen=False)


def test_naive_checker_passes_correct_solutions() -> None:
    assert verdict("07.naive_ddp", MyDDP) == ""
    assert verdict("07.naive_ddp", NaiveDDP) == ""


APART = "other parameters or buffers than rank 0"  # what to broadcast, said as such


@pytest.mark.parametrize(
    ("wrong", "said"),
    [
        (SumsDDP, "summed over the ranks give, not averaged: divide"),
        (NoBroadcastDDP, APART),
        (ForgetsBuffersDDP, APART),
        (BuffersOnceDDP, APART),
        (TrainableOnlyDDP, APART),
    ],
)
def test_naive_checker_rejects_wrong_solutions_saying_what_is_wrong(wrong: type, said: str) -> None:
    line = verdict("07.naive_ddp", wrong)
    assert line.startswith("FAIL 07.naive_ddp") and said in line, line


# ----- 07.bucketed ----------------------------------------------------------------------


class GradBuckets:
    """A correct solution of the bucketed exercise; options make typical mistakes."""

    def __init__(
        self,
        module: nn.Module,
        bucket_cap_mb: float,
        average: bool = True,
        async_op: bool = True,
        copy_back: bool = True,
        in_index_order: bool = True,
        at_the_end: bool = False,
        wait_at_once: str = "",
        collective: Any = None,
    ) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [
            [self.params[i] for i in idx] for idx in assign_buckets(self.params, bucket_cap_mb)
        ]
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.next = 0  # the next bucket to launch, in index order
        self.works: list = []
        self.average, self.async_op, self.copy_back = average, async_op, copy_back
        self.in_index_order, self.at_the_end, self.wait_at_once = (
            in_index_order,
            at_the_end,
            wait_at_once,
        )
        self.collective = collective or (lambda *a, **k: dist.all_reduce(*a, **k))
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def on_grad_ready(self, param: torch.Tensor) -> None:
        b = self.bucket_of[id(param)]
        self.ready[b] += 1
        if self.at_the_end and sum(self.ready) < len(self.params):
            return  # nothing until every gradient is ready: no overlap with backward
        if not self.in_index_order:  # as soon as it fills
            if self.ready[b] == len(self.buckets[b]):
                self.launch(b)
            return
        while self.next < len(self.buckets) and self.ready[self.next] == len(
            self.buckets[self.next]
        ):
            self.launch(self.next)
            self.next += 1

    def launch(self, b: int) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
        if self.average:
            flat /= dist.get_world_size()
        work = self.collective(flat, async_op=self.async_op)
        if self.wait_at_once == "work":
            work.wait()
        elif self.wait_at_once == "future":
            work.get_future().wait()
        elif self.wait_at_once == "spin":  # review 6, F5 (got 3/3): a wait written by hand
            while not work.is_completed():
                pass
        elif self.wait_at_once == "spin_future":
            future = work.get_future()
            while not future.done():
                pass
        elif self.wait_at_once == "spin_between":  # review 8, C (got 3/3)
            other = torch.futures.Future()
            other.set_result(None)
            while not work.is_completed():
                other.done()  # a poll of another object between this work's polls
        self.works.append((work, flat, b))
        self.poll()

    def poll(self) -> None:
        """Nothing here: a subclass asks how its buckets are doing."""

    def wait(self) -> None:
        for work, flat, b in self.works:
            if work is not None:
                work.wait()
            offset = 0
            for p in self.buckets[b]:
                if self.copy_back:
                    p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.works.clear()
        self.ready = [0] * len(self.buckets)
        self.next = 0


class SumsBuckets(GradBuckets):
    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, average=False)


class BlockingBuckets(GradBuckets):
    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, async_op=False)


class NoCopyBackBuckets(GradBuckets):
    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, copy_back=False)


class CompletionOrderBuckets(GradBuckets):
    """Right numbers, but each bucket launched as it fills: not the lesson's index order."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, in_index_order=False)


class FromImportBuckets(GradBuckets):
    """Right: ``all_reduce`` imported from torch.distributed before the checker ran (it saw
    no call through its patched ``dist.all_reduce`` and gave 0)."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, collective=all_reduce)


class ProcessGroupBuckets(GradBuckets):
    """Right: the process group's own method, another name for the same collective."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        def allreduce(flat: torch.Tensor, async_op: bool) -> Any:
            opts = dist.AllreduceOptions()
            opts.asyncOp = async_op
            return dist.group.WORLD.allreduce([flat], opts)

        super().__init__(module, cap, collective=allreduce)


class AtTheEndWaitsBuckets(GradBuckets):
    """What got 3/3: nothing until backward's last hook, then each bucket launched with
    async_op=True and waited for at once (in the old hidden models bucket 0 filled last, so a
    right solution launched everything in the last hook too, and only the flag was read)."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, at_the_end=True, wait_at_once="work")


class AtTheEndBuckets(GradBuckets):
    """Asynchronous and waited for in wait(), but every bucket launched in the last hook."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, at_the_end=True)


class WaitsAtOnceBuckets(GradBuckets):
    """Launched on time with async_op=True, then waited for at once: blocking in all but name."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, wait_at_once="work")


class WaitsOnFutureBuckets(GradBuckets):
    """The same, through the work's future."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, wait_at_once="future")


class SpinsBuckets(GradBuckets):
    """Launched on time, then polled with is_completed() until done: a wait by hand."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, wait_at_once="spin")


class SpinsOnFutureBuckets(GradBuckets):
    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, wait_at_once="spin_future")


class SpinsBetweenOtherPollsBuckets(GradBuckets):
    """The spin above, with a poll of a finished future between the work's polls."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, wait_at_once="spin_between")


class PollsOnceBuckets(GradBuckets):
    """Right: after each launch, asks once how every launched bucket is doing (blocks
    nothing; a poll is not a wait)."""

    def poll(self) -> None:
        self.done = [work.is_completed() for work, _, _ in self.works]
        self.done_futures = [work.get_future().done() for work, _, _ in self.works]


class FunctionalBuckets(GradBuckets):
    """Right: the functional collectives (operators of their own, not c10d's: the checker saw
    no all-reduce and said "got 0"), waited for with wait_tensor in wait()."""

    def launch(self, b: int) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]]) / dist.get_world_size()
        result = funcol.all_reduce(flat, "sum", dist.group.WORLD)
        if self.wait_at_once:
            result = funcol.wait_tensor(result)
        self.works.append((None, result, b))

    def wait(self) -> None:
        self.works = [(None, funcol.wait_tensor(r), b) for _, r, b in self.works]
        super().wait()


class FunctionalWaitsAtOnceBuckets(FunctionalBuckets):
    """The same, waited for at once with wait_tensor: blocking in all but name."""

    def __init__(self, module: nn.Module, cap: float) -> None:
        super().__init__(module, cap, wait_at_once="tensor")


class OneBucketAtTheEnd:
    """Correct numbers, but one all-reduce after backward: no buckets, no overlap."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]

    def wait(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params]) / dist.get_world_size()
        dist.all_reduce(flat)
        offset = 0
        for p in self.params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


@pytest.mark.parametrize(
    "right",
    [GradBuckets, FromImportBuckets, ProcessGroupBuckets, FunctionalBuckets, PollsOnceBuckets],
)
def test_bucketed_checker_passes_a_correct_solution(right: type) -> None:
    assert verdict("07.bucketed", right) == ""


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (SumsBuckets, "summed over the ranks give, not averaged: divide"),
        (BlockingBuckets, "async_op=True"),
        (NoCopyBackBuckets, "max difference"),
        (OneBucketAtTheEnd, "at least 2 all_reduce"),
        (CompletionOrderBuckets, "index order"),  # passed before the checker looked
        (AtTheEndWaitsBuckets, "waited for an all_reduce before backward returned"),
        (AtTheEndBuckets, "no all_reduce before the last gradient was ready"),
        (WaitsAtOnceBuckets, "waited for an all_reduce before backward returned"),
        (WaitsOnFutureBuckets, "waited for an all_reduce before backward returned"),
        (FunctionalWaitsAtOnceBuckets, "waited for an all_reduce before backward returned"),
        (SpinsBuckets, "waited for an all_reduce before backward returned"),
        (SpinsOnFutureBuckets, "waited for an all_reduce before backward returned"),
        (SpinsBetweenOtherPollsBuckets, "waited for an all_reduce before backward returned"),
    ],
)
def test_bucketed_checker_rejects_wrong_solutions(wrong: type, words: str) -> None:
    line = verdict("07.bucketed", wrong)
    assert line.startswith("FAIL 07.bucketed") and words in line, line


def test_unsolved_exercise_reports_not_implemented(capsys: pytest.CaptureFixture) -> None:
    from ddp_lab.course.grading import grade

    class Stub:
        def __init__(self, module: nn.Module, *args: object) -> None:
            raise NotImplementedError("your code here")

    for grade_id in ("07.naive_ddp", "07.bucketed"):
        with pytest.raises(AssertionError) as failed:
            grade(grade_id, Stub)
        assert "NotImplementedError" in str(failed.value)


class Answers:
    """A learner handle whose ranks send back ``make(nprocs)``: what a tampered runner could."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def spawn(self, probe: object, *data: object, nprocs: int, timeout: float = 60) -> Any:
        result = self.make(nprocs)
        if isinstance(result, Exception):
            raise result
        return result

    def ranks(self, probe: object, inputs: list, timeout: float = 60) -> Any:
        return self.spawn(probe, nprocs=len(inputs), timeout=timeout)


@pytest.mark.parametrize("grade_id", ["07.naive_ddp", "07.bucketed"])
@pytest.mark.parametrize(
    "make",
    [
        lambda n: "all good",
        lambda n: ["PASS"] * n,
        lambda n: [torch.zeros(3)] * n,
        lambda n: [{"events": [["all_reduce", 3], ["returned", 0]], "states": "x"}] * n,
        lambda n: [{"events": [["all_reduce", "3"], ["returned", 0]]}] * n,
        lambda n: [{"events": [["all_reduce", 3], ["all_reduce", 3]]}] * n,  # never returned
        lambda n: [{"events": [["ready", 0], ["ready", 0], ["returned", 0]]}] * n,
        lambda n: [torch.zeros(3)] * (n + 1),
        lambda n: LearnerError("WireError", "a MyTensor cannot be sent"),
    ],
)
def test_results_that_are_not_the_probes_data_fail_cleanly(grade_id: str, make: Any) -> None:
    passed, line = run_checker(load_checkers()[grade_id], Answers(make), "en")
    assert not passed and line.startswith(f"FAIL {grade_id}") and "Hidden case 1 of 3" in line
    assert "wrong form" in line or "WireError" in line, line
