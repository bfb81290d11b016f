"""The per-rank form (issue 26, class 1): rank r receives only rank r's input.

For each exercise graded in that form, through the verdict's own path (``RemoteLearner`` with
``course.rankhost.RankPool``: one sandbox per rank, the package's answers hidden):
- the honest solution (the released solution notebook's code, read by
  ``_solutions.graded_solution``; it travels by value as a notebook's does) gets full points;
- an attack that reads every rank's input from the caller's frames and never communicates gets
  0. The same attack passes (at least its first hidden case) where a frame holds every rank's
  input, as every probe's did before the per-rank form: ``LocalLearner`` (self-study) still
  does, which shows that the attack is a real one.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import _lock_ways
import _ring_ways
import cloudpickle
import numpy as np
import pytest
import torch
import torch.distributed as dist
from _ring_ways import WRONG_WAYS, all_gather_sum
from _solutions import graded_solution
from torch import nn

from ddp_lab.buckets import assign_buckets
from ddp_lab.course.grading import load_checkers, run_checker, sandbox, traffic
from ddp_lab.course.grading.learner import LocalLearner, RemoteLearner
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.runtime import _pickle

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


class PeekBuckets:
    """Launches empty buckets of the right sizes, in index order, while backward runs (what
    the rank reports looks right), and sets the global batch's gradients read from the frame."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float) -> None:
        self.module, self.seen, self.step = module, everyone(), 0
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [[params[i] for i in idx] for idx in assign_buckets(params, bucket_cap_mb)]
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.ready, self.works = [0] * len(self.buckets), []
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def on_grad_ready(self, param: torch.Tensor) -> None:
        self.ready[self.bucket_of[id(param)]] += 1
        b = len(self.works)  # the next bucket to launch
        while b < len(self.buckets) and self.ready[b] == len(self.buckets[b]):
            flat = torch.zeros(sum(p.numel() for p in self.buckets[b]), dtype=torch.float64)
            self.works.append(dist.all_reduce(flat, async_op=True))
            b += 1

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        self.ready, self.works = [0] * len(self.buckets), []
        if self.seen is not None:
            _full_batch_grads(self.module, self.seen, self.step)
        self.step += 1


class PeekSharded:
    """Its own shard for the record (the largest-first ownership), and every other parameter
    stepped here at its owner's learning rate, read from the frame: no message at all."""

    def __init__(self, params: Any, optimizer_class: Any, **defaults: Any) -> None:
        self.params = list(params)
        self.rank, world = dist.get_rank(), dist.get_world_size()
        loads, self.owner = [0] * world, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            r = loads.index(min(loads))
            self.owner[i], loads[r] = r, loads[r] + self.params[i].numel()
        mine = [p for p, o in zip(self.params, self.owner, strict=True) if o == self.rank]
        self.optim = optimizer_class(mine, **defaults) if mine else None
        seen = everyone()
        lrs = [r["lr"] for r in seen] if seen is not None else [defaults["lr"]] * world
        self.others = [
            torch.optim.AdamW([p], lr=lrs[o], weight_decay=defaults["weight_decay"])
            for p, o in zip(self.params, self.owner, strict=True)
            if o != self.rank
        ]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.optim is not None:
            self.optim.step()
        for other in self.others:
            other.step()


CASES = [
    ("04.all_reduce", peek_all_reduce),
    ("04.all_gather", peek_all_gather),
    ("06.accuracy", peek_accuracy),
    ("07.naive_ddp", PeekDDP),
    ("07.bucketed", PeekBuckets),
    ("10.sharded_optimizer", PeekSharded),
    ("09.global_accuracy", peek_global_accuracy),
    ("09.safe_all_reduce", peek_safe_all_reduce),
]


class Remote(RemoteLearner):
    """The verdict's handle, without a runner: every exercise tested here reaches the
    learner's code through ``ranks`` only (``call`` and ``spawn`` would fail here)."""

    def __init__(self, grade_id: str, *objects: Any) -> None:
        for module in (sys.modules[__name__], _ring_ways, _lock_ways):  # as a notebook's code
            cloudpickle.register_pickle_by_value(module)
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


@pytest.mark.parametrize(("grade_id", "attack"), CASES, ids=[c[0] for c in CASES])
def test_per_rank_form_passes_honest_work_and_not_a_rank_that_reads_the_others(
    grade_id: str, attack: Any
) -> None:
    passed, line = remote_verdict(grade_id, *graded_solution(grade_id))
    assert passed, line
    passed, line = remote_verdict(grade_id, attack)
    assert not passed and "Hidden case 1 of" in line and " 0/" in line, line
    # Where a frame holds every rank's input, the same attack gets past the first case.
    _, line = run_checker(load_checkers()[grade_id], LocalLearner((attack,)), "en")
    assert "Hidden case 1 of" not in line, line


@pytest.mark.parametrize(
    ("attack", "words"),
    [
        # ctypes, as the blob is loaded (after the lock, before the call's own refusals); it
        # first reads /proc/self/mem to find the lock's registration, refused since a rank's
        # memory holds its token (rankserve); ctypes itself: test_lockdown.py
        (_lock_ways.unlocked_all_reduce, "/proc is not allowed"),
        # a sparse tensor: c10d::allreduce_'s SparseCPU kernel
        (_lock_ways.sparse_all_reduce, "called dist.all_reduce"),
    ],
    ids=["ctypes_at_unpickle", "sparse"],
)
def test_gloo_s_own_all_reduce_around_the_lock_gets_nothing(attack: Any, words: str) -> None:
    """Both got 3/3 for 04.all_reduce (``ddp-lab check``): the lock left ctypes usable and
    the sparse kernels unlocked (``checks/lockdown.py``)."""
    passed, line = remote_verdict("04.all_reduce", attack)
    assert not passed and "Hidden case 1 of" in line and " 0/3" in line, line
    assert words in line, line


def test_a_case_whose_process_group_fails_to_set_up_runs_again_on_fresh_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # gloo's connection set-up fails now and then on a busy machine ("connectFullMesh failed
    # ... Connection closed by peer"), before any of the learner's code runs: not theirs to
    # lose points for. Made to happen here with a port no TCP socket can have, once or always.
    from ddp_lab.course.grading import rankhost

    real_port, bad = rankhost.RankPool._port, {"left": 1}

    def port(self: Any) -> int:
        if bad["left"]:
            bad["left"] -= 1
            return 70000
        return real_port(self)

    monkeypatch.setattr(rankhost.RankPool, "_port", port)
    grade_id = "04.all_reduce"
    passed, line = remote_verdict(grade_id, *graded_solution(grade_id))
    assert passed and bad["left"] == 0, line
    bad["left"] = 10**6  # every try: the second failure is reported, as the set-up's error
    passed, line = remote_verdict(grade_id, *graded_solution(grade_id))
    assert not passed and "Hidden case 1 of" in line, line


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
    passed, line = remote_verdict("11.resume", *graded_solution("11.resume"))
    assert passed, line
    passed, line = remote_verdict("11.resume", stash_save, stash_load)
    assert not passed and "Hidden case 1 of" in line and "_ddp_lab_stash" in line, line


# --- 05.ring: the way, observed by the grader in the ranks' network ---------------------------
# The attacks (``_ring_ways.WRONG_WAYS``) get the right sum and switch the checker's guards off:
# their own record shows nothing; only the bytes the grader counts in the ranks' network
# namespace tell them from a ring.


def _unlock() -> None:
    """Try to undo the ranks' lockdown from the learner's code, in their process: drop every
    ``torch.library.Library`` the garbage collector can find (the lock keeps its
    registration out of reach: ``tests/course/test_lockdown.py``)."""
    import gc

    for o in gc.get_objects():
        if type(o) is torch.library.Library:
            try:
                o._destroy()
            except Exception:  # noqa: BLE001, S110  # torch's own libraries may refuse
                pass


_GROUPS: dict = {}


def backwards_group(tensor: torch.Tensor) -> torch.Tensor:
    """The issue's attack: gloo's own all-reduce on a group whose ranks are numbered backwards
    (built by hand: ``dist.new_group`` sorts its ranks), with the lockdown undone first. Its
    ring runs to the right neighbour in the world's numbering: the bytes per neighbour of an
    honest ring, on connections of its own."""
    import datetime

    from torch._C._distributed_c10d import ProcessGroup, ProcessGroupGloo

    _unlock()
    rank, n = dist.get_rank(), dist.get_world_size()
    if n not in _GROUPS:
        store = dist.PrefixStore(f"backwards{n}", dist.distributed_c10d._get_default_store())
        gloo = ProcessGroupGloo(store, n - 1 - rank, n, datetime.timedelta(seconds=60))
        group = ProcessGroup(store, n - 1 - rank, n)
        group._set_default_backend(ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
        _GROUPS[n] = group
    _GROUPS[n].allreduce([tensor]).wait()
    return tensor


_SOCKETS: dict = {}


def socket_ring(tensor: torch.Tensor) -> torch.Tensor:
    """A ring over TCP sockets of the learner's own between the ranks (they share a network):
    a ring's bytes to the right, and no call of the process group at all (the rank's report:
    nothing sent, no batch, nothing an NCCL replay could fault)."""
    import os
    import socket
    import time

    rank, n = dist.get_rank(), dist.get_world_size()
    key = (os.environ["MASTER_PORT"], n)
    if key not in _SOCKETS:
        base = int(os.environ["MASTER_PORT"]) + 1
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", base + rank))
        server.listen(1)
        while True:
            try:
                right = socket.create_connection(("127.0.0.1", base + (rank + 1) % n))
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        _SOCKETS[key] = (server.accept()[0], right)
    left, right = _SOCKETS[key]
    chunks = list(torch.tensor_split(tensor.view(-1), n))

    def step(out: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        right.sendall(out.numpy().tobytes())
        want, got = into.numel() * into.element_size(), bytearray()
        while len(got) < want:
            got += left.recv(want - len(got))
        return torch.frombuffer(got, dtype=into.dtype) if want else into.new_empty(0)

    for s in range(n - 1):  # reduce-scatter, then all-gather, each step to the right
        into = chunks[(rank - s - 1) % n]
        into += step(chunks[(rank - s) % n], into)
    for s in range(n - 1):
        into = chunks[(rank - s) % n]
        into.copy_(step(chunks[(rank - s + 1) % n], into))
    return tensor


def unsolved_ring(tensor: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError


@pytest.fixture(scope="module")
def ring_verdicts() -> dict[str, tuple[bool, str]]:
    """Each 05.ring submission graded once, the grader's way (shared by the tests below)."""
    verdicts = {"solution": remote_verdict("05.ring", *graded_solution("05.ring"))}
    ways = [*WRONG_WAYS, backwards_group, socket_ring, unsolved_ring]
    return verdicts | {fn.__name__: remote_verdict("05.ring", fn) for fn in ways}


def test_ring_observed_an_honest_ring_gets_full_points(ring_verdicts: dict) -> None:
    passed, line = ring_verdicts["solution"]
    assert passed and "5/5" in line and "could not observe" not in line, line


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("gather_broadcast", "which is not its right neighbour"),
        ("all_gather_sum", "which is not its right neighbour"),
        ("full_buffer_ring", "to its right neighbour (rank"),
    ],
)
def test_ring_observed_a_right_sum_sent_the_wrong_way_gets_nothing(
    ring_verdicts: dict, name: str, words: str
) -> None:
    """The sums are right and the rank's own report is clean: only the grader's count of the
    bytes fails them (at N = 2 every one of them is a ring, so case 2, N = 3, fails)."""
    passed, line = ring_verdicts[name]
    assert not passed and " 0/5" in line and "the grader saw rank" in line, line
    assert words in line and "Hidden case 2 of" in line, line


def test_ring_a_built_in_collective_gets_nothing_at_the_first_case(ring_verdicts: dict) -> None:
    """gloo's own all-reduce through the group's method: the ranks' lockdown
    (``checks/lockdown.py``) stops it before any byte moves, at the first case, and names the
    collective (the group's ``allreduce`` ends in ``c10d::allreduce_``)."""
    passed, line = ring_verdicts["gloo_all_reduce"]
    assert not passed and " 0/5" in line and "Hidden case 1 of" in line, line
    assert "called dist.all_reduce: build it from" in line, line


observed = pytest.mark.skipif(
    not sandbox.available() or traffic.tools() is None,
    reason="the grader counts the ranks' bytes with a sandbox, ss and nsenter",
)


@observed
@pytest.mark.parametrize(
    ("name", "words"),
    [
        # the lock holds (it once could be undone, and then the bytes caught it)
        ("backwards_group", "build it from dist.batch_isend_irecv"),
        ("socket_ring", "outside their process group's connections"),
    ],
)
def test_ring_bytes_count_only_on_the_connections_of_the_group_given(
    ring_verdicts: dict, name: str, words: str
) -> None:
    """A ring's bytes to the right neighbour, sent on connections other than those of the
    group the ranks were given (gloo's all-reduce on a group numbered backwards with the
    lockdown undone; sockets of the learner's own), get nothing at the first case: the grader
    noted the group's connections before the learner's code ran and counts each call's bytes
    on them only. Both got 5/5 when bytes were counted per neighbour over every connection.
    Beside them, in the same runs: the honest ring 5/5, the unsolved stub 0."""
    passed, line = ring_verdicts[name]
    assert not passed and " 0/5" in line and "hidden case 1 of" in line.lower(), line
    assert words in line, line
    passed, line = ring_verdicts["solution"]
    assert passed and "5/5" in line, line
    passed, line = ring_verdicts["unsolved_ring"]
    assert not passed and " 0/5" in line and "NOT ATTEMPTED" in line, line


def aborting_ring(tensor: torch.Tensor) -> torch.Tensor:
    """A rank that dies in the learner's code (as an uncaught C++ exception in a rank does)."""
    import os

    os.abort()


def exiting_ring(tensor: torch.Tensor) -> torch.Tensor:
    """A rank that exits in the learner's code."""
    import os

    os._exit(3)


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_a_rank_that_ends_without_an_answer_is_told_how() -> None:
    """A rank whose process ends in the learner's code gets 0 with how it ended (the signal,
    or the exit status), not only "ended without an answer"."""
    passed, line = remote_verdict("05.ring", aborting_ring)
    assert not passed and " 0/5" in line and "hidden case 1 of" in line.lower(), line
    assert "ended without an answer: its process was killed by SIGABRT" in line, line
    passed, line = remote_verdict("05.ring", exiting_ring)
    assert not passed and " 0/5" in line, line
    assert "ended without an answer: its process exited with status 3" in line, line


@pytest.mark.parametrize("missing", ["ss", "sandbox"])
def test_ring_unobserved_falls_back_to_the_report_and_says_so(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """Without ss/nsenter, or without a sandbox (``DDP_LAB_SANDBOX=0``: the ranks share the
    host's network), the attack is graded as before the observation (it passes: the attack
    is real), and the verdict says that the way was not observed."""
    if missing == "ss":
        monkeypatch.setattr(traffic, "tools", lambda: None)
    else:
        monkeypatch.setenv("DDP_LAB_SANDBOX", "0")
    passed, line = remote_verdict("05.ring", all_gather_sum)
    assert passed and "could not observe the bytes" in line, line


def test_ring_counters_that_cannot_be_read_fail_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count that fails (ranks that open sockets by the thousand) is no way around it: the
    case fails, rather than falling back to the ranks' own report."""

    def flooded(holder_pid: int) -> traffic.Snapshot:
        raise traffic.Unreadable("ss wrote too much")

    monkeypatch.setattr(traffic, "snapshot", flooded)
    passed, line = remote_verdict("05.ring", *graded_solution("05.ring"))
    assert not passed and "could not count the bytes" in line, line


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
    ("10.bf16_hook", lonely_bf16_hook, comm_hooks_reference),
    ("10.fsdp_reduce", lonely_reduce_grad, fsdp_reference),
]


@pytest.mark.parametrize(("grade_id", "lonely", "borrowed"), CH10, ids=["bf16", "fsdp"])
def test_chapter_10_in_the_per_rank_form(grade_id: str, lonely: Any, borrowed: Any) -> None:
    """The honest answer passes with the package's answer-free helpers (``comm_debug``,
    ``fsdp_base``) in the ranks; a result made without a message fails, as each rank has only
    its own batch; the reference answer's module cannot be imported in a rank."""
    passed, line = remote_verdict(grade_id, *graded_solution(grade_id))
    assert passed, line
    passed, line = remote_verdict(grade_id, lonely)
    assert not passed and "Hidden case 1 of" in line and " 0/" in line, line
    if sandbox.available():
        passed, line = remote_verdict(grade_id, borrowed)
        assert not passed and "not available while grading" in line, line


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_sharded_optimizer_cannot_borrow_the_reference() -> None:
    passed, line = remote_verdict("10.sharded_optimizer", zero_reference)
    assert not passed and "ddp_lab.zero" in line and "not available while grading" in line, line


# --- single-process exercises: one rank, one case, no oracle within reach ---------------------


def diagnose_from_the_checker(nvidia_smi: str, nvcc_v: str, torch_build: str) -> Any:
    from ddp_lab.course.grading.checks.ch01 import expected

    return expected(nvidia_smi, nvcc_v, torch_build)


def place_from_the_package(nproc_per_node: list, cuda_visible_devices: list, gpus: int) -> Any:
    from ddp_lab.tools import ranks

    procs = ranks.assign(nproc_per_node, cuda_visible_devices=cuda_visible_devices,
                         gpus_per_node=gpus)  # fmt: skip
    return [vars(p) for p in procs]


def place_from_the_old_path(nproc_per_node: list, cuda_visible_devices: list, gpus: int) -> Any:
    from ddp_lab import ranks  # the path before the tools moved (ddp_lab/_moved.py)

    procs = ranks.assign(nproc_per_node, cuda_visible_devices=cuda_visible_devices,
                         gpus_per_node=gpus)  # fmt: skip
    return [vars(p) for p in procs]


def chunks_from_the_checker(batch_size: int, num_devices: int, gpu0_bsz: int) -> Any:
    from ddp_lab.course.grading.checks.ch03 import _expected_balanced

    return _expected_balanced(batch_size, num_devices, gpu0_bsz)


SINGLE = [
    ("01.diagnose", diagnose_from_the_checker, "ddp_lab.course.grading.checks.ch01"),
    ("02.place", place_from_the_package, "ddp_lab.tools.ranks"),
    ("02.place", place_from_the_old_path, "ddp_lab.tools.ranks"),
    ("03.balanced_chunks", chunks_from_the_checker, "checks.ch03"),
    ("03.gather", None, ""),
    ("06.indices", None, ""),
]


@pytest.mark.parametrize(
    ("grade_id", "borrowed", "module"),
    SINGLE,
    ids=[c[0] + ("-old-path" if c[1] is place_from_the_old_path else "") for c in SINGLE],
)
def test_single_process_exercises_in_one_rank_without_the_oracle(
    grade_id: str, borrowed: Any, module: str
) -> None:
    """The honest answer passes in a rank that receives one case at a time; the checker's own
    answer (or the package's reference) cannot be imported there, as the runner's process
    could before."""
    passed, line = remote_verdict(grade_id, *graded_solution(grade_id))
    assert passed, line
    if borrowed is not None:
        # Where the whole package is within reach, the borrowed answer passes.
        assert run_checker(load_checkers()[grade_id], LocalLearner((borrowed,)), "en")[0]
        if sandbox.available():
            passed, line = remote_verdict(grade_id, borrowed)
            assert not passed and "not available while grading" in line, line
            assert module in line, line


# --- chapter 12: the references (tensor_parallel.py, pipeline_1f1b.py) hidden in the ranks ---


def borrowed_copy(x: torch.Tensor) -> torch.Tensor:
    from ddp_lab.tensor_parallel import copy_to_parallel_region

    return copy_to_parallel_region(x)


def borrowed_reduce(x: torch.Tensor) -> torch.Tensor:
    from ddp_lab.tensor_parallel import reduce_from_parallel_region

    return reduce_from_parallel_region(x)


def borrowed_schedule(stage: int, stages: int, micro: int) -> Any:
    from ddp_lab.pipeline_1f1b import one_f_one_b_order

    return one_f_one_b_order(stage, stages, micro)


CH12 = [("12.tp_pair", (borrowed_copy, borrowed_reduce)), ("12.one_f_one_b", (borrowed_schedule,))]


@pytest.mark.parametrize(("grade_id", "borrowed"), CH12, ids=["tp_pair", "one_f_one_b"])
def test_chapter_12_in_the_per_rank_form(grade_id: str, borrowed: tuple) -> None:
    """The released answer passes in sandboxed ranks (12.one_f_one_b's run uses the
    answer-free ``ddp_lab.pipeline``); the reference's module cannot be imported there."""
    passed, line = remote_verdict(grade_id, *graded_solution(grade_id))
    assert passed, line
    if sandbox.available():
        passed, line = remote_verdict(grade_id, *borrowed)
        assert not passed and "not available while grading" in line, line


# --- torch's own answer to the exercise, the checker's oracle: refused in the ranks ----------


class TorchDDP(nn.Module):
    """07.naive_ddp: torch's DistributedDataParallel does the broadcast and the averaging."""

    def __init__(self, module: nn.Module) -> None:
        from torch.nn.parallel import DistributedDataParallel

        super().__init__()
        self.module = module
        self.inner = DistributedDataParallel(module)

    def forward(self, *args: Any) -> Any:
        return self.inner(*args)

    def sync_gradients(self) -> None:
        pass


class TorchZero:
    """10.sharded_optimizer: torch's ZeroRedundancyOptimizer shards largest-first too."""

    def __init__(self, params: Any, optimizer_class: Any, **defaults: Any) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.params = list(params)
        self.inner = ZeroRedundancyOptimizer(self.params, optimizer_class, **defaults)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.inner.step()


def torch_bf16_hook(process_group, bucket):  # noqa: ANN001, ANN201
    """10.bf16_hook: the checker's oracle itself."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return bf16_compress_hook(process_group, bucket)


def torch_bf16_wrapper(process_group, bucket):  # noqa: ANN001, ANN201
    """10.bf16_hook: the same steps, as torch's wrapper around its plain all-reduce hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = default_hooks.bf16_compress_wrapper(default_hooks.allreduce_hook)
    return hook(process_group, bucket)


READY_MADE = [
    ("07.naive_ddp", TorchDDP, "DistributedDataParallel"),
    ("10.sharded_optimizer", TorchZero, "ZeroRedundancyOptimizer"),
    ("10.bf16_hook", torch_bf16_hook, "bf16_compress_hook"),
    ("10.bf16_hook", torch_bf16_wrapper, "bf16_compress_wrapper"),
]


@pytest.mark.parametrize(
    ("grade_id", "ready_made", "name"), READY_MADE, ids=[c[2] for c in READY_MADE]
)
def test_torch_ready_made_answer_is_refused_in_the_ranks(
    grade_id: str, ready_made: Any, name: str
) -> None:
    """A wrapper around torch's own implementation of the exercise (the checker's oracle, or
    the same algorithm) got full points: in the grader's ranks and in self-study it is now
    refused (``course.learner.refusing``), and the honest answer still passes."""
    passed, line = remote_verdict(grade_id, ready_made)
    assert not passed and "Refused" in line and name in line and " 0/" in line, line
    passed, line = run_checker(load_checkers()[grade_id], LocalLearner((ready_made,)), "en")
    assert not passed and "Refused" in line and name in line, line


# --- a fresh, unrefused copy of what the exercise refuses, by names the scan cannot read -----
# 06.indices refuses torch's DistributedSampler (the checker's oracle) by swapping the code of
# the class already imported. Each attack below gets a copy that was never swapped, and spells
# every name the static scan looks for (``sys.modules``, ``importlib``'s loaders, ``subprocess``)
# as a string built at run time, so ``course.grading.scan`` flags none of them. Before the
# guard's audit hook (``course.grading.guard``) each passed every case.
_SAMPLER = "torch.utils.data.distributed"


def _module(name: str) -> Any:
    """``name`` imported, with no name the scan reads (``import``, ``__import__``, ``sys.modules``)."""
    loader = getattr(sys, "mod" + "ules")["import" + "lib"]
    return getattr(loader, "import_" + "module")(name)


def _indices(module: Any, n: int, r: int, k: int, e: int, seed: int, sh: bool, dl: bool) -> list:
    made = getattr(module, "Distributed" + "Sampler")
    s = made(range(n), num_replicas=r, rank=k, shuffle=sh, seed=seed, drop_last=dl)
    s.set_epoch(e)
    return list(s)


def sampler_reimported(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,  # noqa: ANN001, ANN201
                       drop_last=False):  # fmt: skip
    """Out of ``sys.modules`` (reached with ``getattr``), then imported again."""
    getattr(sys, "mod" + "ules").pop(_SAMPLER, None)
    fresh = _module(_SAMPLER)
    return _indices(fresh, dataset_len, num_replicas, rank, epoch, seed, shuffle, drop_last)


def sampler_from_its_file(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,  # noqa: ANN001, ANN201
                          drop_last=False):  # fmt: skip
    """Its file run again as a module of another name (``spec_from_file_location``)."""
    util = _module("import" + "lib.util")
    path = getattr(sys, "mod" + "ules")[_SAMPLER].__file__
    spec = getattr(util, "spec_from_" + "file_location")("a_fresh_sampler", path)
    fresh = util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return _indices(fresh, dataset_len, num_replicas, rank, epoch, seed, shuffle, drop_last)


_CHILD = f"""
import json, sys
import {_SAMPLER} as d
n, r, k, e, seed, sh, dl = json.loads(sys.argv[1])
s = getattr(d, "Distributed" + "Sampler")(range(n), num_replicas=r, rank=k, shuffle=sh,
                                          seed=seed, drop_last=dl)
s.set_epoch(e)
print(json.dumps(list(s)))
"""


def sampler_in_a_child(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,  # noqa: ANN001, ANN201
                       drop_last=False):  # fmt: skip
    """A new Python, where nothing is refused, started through a name built as a string."""
    import json

    run = getattr(_module("sub" + "process"), "run")  # noqa: B009
    args = json.dumps([dataset_len, num_replicas, rank, epoch, seed, shuffle, drop_last])
    done = run([sys.executable, "-c", _CHILD, args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


FRESH_COPIES = [sampler_reimported, sampler_from_its_file, sampler_in_a_child]


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap here")
@pytest.mark.parametrize("attack", FRESH_COPIES, ids=[a.__name__ for a in FRESH_COPIES])
def test_chapter_06_a_fresh_sampler_behind_a_built_name_is_refused(attack: Any) -> None:
    """The scan cannot read these names; the refusal's audit hook, in the rank, refuses what
    they do (the module's file run again, another program) and says so."""
    import inspect

    from ddp_lab.course.grading import scan

    for code in (attack, _module, _indices):
        assert scan.findings(inspect.getsource(code)) == [], code
    passed, line = remote_verdict("06.indices", attack)
    assert not passed and " 0/" in line and "Refused" in line, line
    assert "DistributedSampler" in line, line
    # In self-study the same hook refuses it in the learner's ranks.
    passed, line = run_checker(load_checkers()["06.indices"], LocalLearner((attack,)), "en")
    assert not passed and "Refused" in line and "DistributedSampler" in line, line
