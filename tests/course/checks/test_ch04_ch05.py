"""The checkers of chapters 04 and 05 pass the reference solutions and reject typical mistakes.

The wrong implementations are the ones named in the issue: all-reduce without the broadcast,
an all-gather that only works for two ranks or fills the list out of order, a ring that
passes the whole buffer around, skips the all-gather phase or only works for N = 2, and
solutions that call the built-in collective they were asked to rebuild (also through an
alias), and results that are not data.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import P2POp, batch_isend_irecv, irecv, isend  # bound before any checker
from torch.distributed import all_gather as aliased_all_gather
from torch.distributed import all_reduce as aliased_all_reduce

import ddp_lab as dl
from ddp_lab.course.grading import CaseFailed, load_checkers, run_checker
from ddp_lab.course.grading.learner import LocalLearner
from ddp_lab.ring import ring_all_reduce


def grade_passes(grade_id: str, fn) -> bool:
    try:
        dl.grade(grade_id, fn)
    except AssertionError as failed:
        print(failed)  # a failing graded cell shows its verdict line as the error
        return False
    return True


def verdict(grade_id: str, fn) -> tuple[bool, str]:
    """The checker run the way the grader runs it, on a learner handle."""
    return run_checker(load_checkers()[grade_id], LocalLearner((fn,)), "en")


class EqualToEverything:
    """Not data: an object that says it equals anything (and fakes a tensor's looks)."""

    shape = torch.Size([1])

    def __eq__(self, other):
        return True

    def __bool__(self):
        return True


# ---------- 04.all_reduce ----------


def ar_reference(t):
    dist.reduce(t, dst=0)
    dist.broadcast(t, src=0)
    return t


def ar_reduce_only(t):  # forgets the broadcast: only rank 0 has the sum
    dist.reduce(t, dst=0)
    return t


def ar_average(t):  # averages instead of summing
    dist.reduce(t, dst=0)
    dist.broadcast(t, src=0)
    t.div_(dist.get_world_size())
    return t


def ar_not_in_place(t):  # returns a new tensor, leaves the input unchanged
    out = t.clone()
    dist.reduce(out, dst=0)
    dist.broadcast(out, src=0)
    return out


def ar_cheats(t):  # calls the collective it should rebuild
    dist.all_reduce(t)
    return t


def test_all_reduce_reference_passes():
    assert grade_passes("04.all_reduce", ar_reference)


def ar_cheats_through_an_alias(t):  # the collective under another name
    aliased_all_reduce(t)
    return t


def ar_not_data(t):  # does the work, then returns something that is not a tensor
    ar_reference(t)
    return EqualToEverything()


@pytest.mark.parametrize(
    "wrong,words",
    [
        (ar_reduce_only, "expected"),
        (ar_average, "raised"),
        (ar_not_in_place, "must return the tensor it was given"),
        (ar_cheats, "called dist.all_reduce"),
        (ar_cheats_through_an_alias, "one of dist.all_reduce"),
    ],
)
def test_all_reduce_rejects(wrong, words):
    passed, line = verdict("04.all_reduce", wrong)
    assert not passed and "FAIL" in line and words in line, line


def test_all_reduce_result_that_is_not_data_fails_cleanly():
    passed, line = verdict("04.all_reduce", ar_not_data)
    assert not passed and "must return the tensor it was given" in line, line


# ---------- 04.all_gather ----------


def ag_reference(tensor_list, tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    reqs = [dist.isend(tensor, p) for p in range(n) if p != rank]
    for p in range(n):
        if p == rank:
            tensor_list[p].copy_(tensor)
        else:
            dist.recv(tensor_list[p], src=p)
    for r in reqs:
        r.wait()


def ag_two_ranks_only(tensor_list, tensor):  # talks to "the other rank"
    rank = dist.get_rank()
    other = 1 - rank
    req = dist.isend(tensor, other)
    dist.recv(tensor_list[other], src=other)
    tensor_list[rank].copy_(tensor)
    req.wait()


def ag_forgets_own(tensor_list, tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    reqs = [dist.isend(tensor, p) for p in range(n) if p != rank]
    for p in range(n):
        if p != rank:
            dist.recv(tensor_list[p], src=p)
    for r in reqs:
        r.wait()


def ag_arrival_order(tensor_list, tensor):  # fills slots in arrival order, not rank order
    rank, n = dist.get_rank(), dist.get_world_size()
    reqs = [dist.isend(tensor, p) for p in range(n) if p != rank]
    tensor_list[0].copy_(tensor)
    for i in range(1, n):
        dist.recv(tensor_list[i])  # any source
    for r in reqs:
        r.wait()


def ag_replaces_entries(tensor_list, tensor):  # rebinds list items instead of filling them
    n = dist.get_world_size()
    gathered = [torch.empty_like(tensor) for _ in range(n)]
    rank = dist.get_rank()
    reqs = [dist.isend(tensor, p) for p in range(n) if p != rank]
    for p in range(n):
        if p == rank:
            gathered[p] = tensor.clone()
        else:
            dist.recv(gathered[p], src=p)
    for r in reqs:
        r.wait()
    tensor_list[:] = gathered


def ag_blocking_sends_first(tensor_list, tensor):  # every rank sends first: a deadlock
    rank, n = dist.get_rank(), dist.get_world_size()
    for p in range(n):
        if p != rank:
            dist.send(tensor, dst=p)
    for p in range(n):
        if p == rank:
            tensor_list[p].copy_(tensor)
        else:
            dist.recv(tensor_list[p], src=p)


def ag_cheats(tensor_list, tensor):
    dist.all_gather(tensor_list, tensor)


def ag_cheats_through_an_alias(tensor_list, tensor):
    aliased_all_gather(tensor_list, tensor)


def ag_not_data(tensor_list, tensor):  # puts objects that say "equal" into the list
    ag_reference(tensor_list, tensor)
    tensor_list[:] = [EqualToEverything() for _ in tensor_list]


def test_all_gather_deadlock_is_reported_as_a_timeout(capsys):
    assert not grade_passes("04.all_gather", ag_blocking_sends_first)
    out = capsys.readouterr().out
    assert "FAIL" in out and "deadlock" in out
    # the hint names the mistake made here (blocking sends first), not only a recv
    assert "blocked in send" in out


def test_all_gather_reference_passes():
    assert grade_passes("04.all_gather", ag_reference)


@pytest.mark.parametrize(
    "wrong,words",
    [
        (ag_two_ranks_only, "FAIL"),
        (ag_forgets_own, "expected"),
        (ag_arrival_order, "expected"),
        (ag_replaces_entries, "instead of replacing them"),
        (ag_cheats, "called dist.all_gather"),
        (ag_cheats_through_an_alias, "one of dist.all_gather"),
        (ag_not_data, "instead of replacing them"),
    ],
)
def test_all_gather_rejects(wrong, words):
    passed, line = verdict("04.all_gather", wrong)
    assert not passed and words in line, line


# ---------- 05.ring ----------


def ring_full_buffer(t):  # passes the whole buffer around the ring N-1 times
    rank, n = dist.get_rank(), dist.get_world_size()
    acc, cur, buf = t.clone(), t.clone(), torch.empty_like(t)
    for _ in range(n - 1):
        ops = [
            dist.P2POp(dist.isend, cur, (rank + 1) % n),
            dist.P2POp(dist.irecv, buf, (rank - 1) % n),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        acc += buf
        cur = buf.clone()
    t.copy_(acc)
    return t


def ring_no_all_gather(t):  # stops after the reduce-scatter
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(t.view(-1).tensor_split(n))
    for s in range(n - 1):
        send, recv = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        buf = torch.empty_like(recv)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % n)] if send.numel() else []
        ops += [dist.P2POp(dist.irecv, buf, (rank - 1) % n)] if recv.numel() else []
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
        recv += buf
    return t


def ring_two_ranks(t):  # swap halves with "the other rank": right only for N = 2
    rank = dist.get_rank()
    other = 1 - rank if rank < 2 else 0
    buf = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, other), dist.P2POp(dist.irecv, buf, other)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    t += buf
    return t


def ring_cheats(t):
    dist.all_reduce(t)
    return t


def ring_divisible_only(t):  # assumes numel % N == 0 (view(n, -1))
    n = dist.get_world_size()
    if t.numel() % n:
        raise ValueError("numel must be divisible by the world size")
    return ring_all_reduce(t)


def test_ring_reference_passes():
    assert grade_passes("05.ring", ring_all_reduce)


def test_segmented_ring_passes():
    assert grade_passes("05.ring", lambda t: ring_all_reduce(t, segment_bytes=64))


def ring_not_data(t):
    ring_all_reduce(t)
    return EqualToEverything()


@pytest.mark.parametrize(
    "wrong,words",
    [
        (ring_full_buffer, "Send one chunk per step"),
        (ring_no_all_gather, "its input was ["),
        (ring_two_ranks, "raised"),
        (ring_cheats, "called dist.all_reduce"),
        (ring_divisible_only, "ValueError"),
    ],
)
def test_ring_rejects(wrong, words):
    passed, line = verdict("05.ring", wrong)
    assert not passed and words in line, line


def test_ring_result_that_is_not_data_fails_cleanly():
    passed, line = verdict("05.ring", ring_not_data)
    assert not passed and "must return the tensor it was given" in line, line


def test_faked_records_do_not_pass():
    # A learner's process can fake what the probe records, not the oracle's values.
    def fake(probe, inputs, timeout):
        return [
            [
                {
                    "returned_input": True,
                    "tensor": torch.zeros_like(given),
                    "forbidden": [],
                    "sent": 0,
                    "batches": [],
                    "loose": [],
                }
                for given in mine
            ]
            for mine in inputs
        ]

    learner = LocalLearner((ring_all_reduce,))
    learner.ranks = fake
    passed, line = run_checker(load_checkers()["05.ring"], learner, "en")
    assert not passed and "which every rank must hold, is" in line, line


# ---------- 05.ring: safe on NCCL (paired p2p) ----------


def _ring(t, exchange):
    """A ring all-reduce (reduce-scatter, then all-gather) around ``exchange(send, recv)``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = t.view(-1).tensor_split(n)
    for s in range(n - 1):
        target = chunks[(rank - s - 1) % n]
        incoming = torch.empty_like(target)
        exchange(chunks[(rank - s) % n], incoming)
        target += incoming
    for s in range(n - 1):
        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])
    return t


def ring_unbatched(t):  # irecv posted before isend, each on its own: fine on Gloo
    rank, n = dist.get_rank(), dist.get_world_size()

    def exchange(send, recv):
        works = [dist.irecv(recv, (rank - 1) % n)] if recv.numel() else []
        works += [dist.isend(send, (rank + 1) % n)] if send.numel() else []
        for w in works:
            w.wait()

    return _ring(t, exchange)


def ring_one_op_batches(t):  # every op in its own batch: the schedule that hangs NCCL
    rank, n = dist.get_rank(), dist.get_world_size()

    def exchange(send, recv):
        works = []
        if recv.numel():
            works += dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv, (rank - 1) % n)])
        if send.numel():
            works += dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (rank + 1) % n)])
        for w in works:
            w.wait()

    return _ring(t, exchange)


def ring_batched_by_imported_names(t):  # correct: names imported when this module loaded
    rank, n = dist.get_rank(), dist.get_world_size()

    def exchange(send, recv):
        ops = [P2POp(isend, send, (rank + 1) % n)] if send.numel() else []
        ops += [P2POp(irecv, recv, (rank - 1) % n)] if recv.numel() else []
        for w in batch_isend_irecv(ops) if ops else []:
            w.wait()

    return _ring(t, exchange)


def ring_unbatched_by_imported_names(t):  # ring_unbatched, with isend/irecv imported by name
    rank, n = dist.get_rank(), dist.get_world_size()

    def exchange(send, recv):
        works = [irecv(recv, (rank - 1) % n)] if recv.numel() else []
        works += [isend(send, (rank + 1) % n)] if send.numel() else []
        for w in works:
            w.wait()

    return _ring(t, exchange)


def ring_unbatched_by_group_methods(t):  # the process group's own send and recv
    rank, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD

    def exchange(send, recv):
        works = [group.recv([recv], (rank - 1) % n, 0)] if recv.numel() else []
        works += [group.send([send], (rank + 1) % n, 0)] if send.numel() else []
        for w in works:
            w.wait()

    return _ring(t, exchange)


def test_ring_passes_a_batched_ring_whose_names_were_imported():
    assert grade_passes("05.ring", ring_batched_by_imported_names)


@pytest.mark.parametrize(
    "wrong",
    [
        ring_unbatched,
        ring_one_op_batches,
        ring_unbatched_by_imported_names,
        ring_unbatched_by_group_methods,
    ],
)
def test_ring_rejects_rings_that_deadlock_on_nccl(wrong, capsys):
    assert not grade_passes("05.ring", wrong)
    assert "NCCL" in capsys.readouterr().out


def _feedback(lang: str, fn) -> str:
    """The checker's feedback on one case of 151 elements on 3 ranks, in ``lang``."""
    from ddp_lab import i18n
    from ddp_lab.course.grading.checks import ch04, ch05

    n = 3
    inputs = [[ch04.make_input(r, (3 * 50 + 1,), torch.float32, 1)] for r in range(n)]
    records = LocalLearner((fn,)).ranks(ch05.probe_ring, inputs)
    expected = ch04.summed(inputs)
    saved = i18n.get_language()
    i18n.set_language(lang)
    try:
        with pytest.raises(CaseFailed) as failed:
            ch05.judge_ring_case([r[0] for r in records], [e[0] for e in expected], n, "-")
    finally:
        i18n.set_language(saved)
    return failed.value.args[0]


@pytest.mark.parametrize(
    "lang,fn,needle",
    [
        ("en", ring_unbatched, "outside batch_isend_irecv"),
        ("zh", ring_unbatched, "之外调用了 dist.irecv"),
        ("en", ring_one_op_batches, "would deadlock: rank 0 waits in its batch_isend_irecv"),
        ("zh", ring_one_op_batches, "在 NCCL 上会死锁：rank 0 卡在它的第 1 个"),
    ],
)
def test_ring_unpaired_feedback_says_why_in_both_languages(lang, fn, needle):
    why = _feedback(lang, fn)
    assert needle in why, why


def test_package_ring_reference_passes_with_its_nccl_schedule():
    # the checker answers "nccl" to dist.get_backend: ddp_lab.ring pairs its ops
    assert grade_passes("05.ring", lambda t: ring_all_reduce(t, segment_bytes=64))


def test_replay_on_one_stream():
    from ddp_lab.course.grading.checks.ch05 import replay_on_one_stream as replay

    paired = [[[("send", (r + 1) % 3), ("recv", (r - 1) % 3)]] * 2 for r in range(3)]
    assert replay(paired) is None
    recv_first = [[[("recv", (r - 1) % 3)], [("send", (r + 1) % 3)]] for r in range(3)]
    assert replay(recv_first) == (0, 0)
    # a lone op is fine when its partner is lone too (an empty segment on the other side)
    lone = [[[("send", 1)]], [[("recv", 0)]]]
    assert replay(lone) is None


def _gloo_collectives(rank: int, per_rank: list) -> tuple[list, list]:
    """torch's own all_reduce and all_gather of rank ``rank``'s inputs, on gloo."""
    sums, lists = [], []
    for mine in per_rank[rank]:
        total = mine.clone()
        dist.all_reduce(total)
        sums.append(total)
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, mine)
        lists.append(parts)
    return sums, lists


@pytest.mark.parametrize("n", [2, 3, 4])
def test_one_process_oracles_equal_torchs_collectives(n: int) -> None:
    """The checkers' oracles (``summed``, ``gathered``: one process) are, bit for bit, what
    gloo's all_reduce and all_gather leave on every rank, for every dtype the cases use."""
    from ddp_lab.course.grading.checks import ch04

    cases = [((5, 3), dtype, 7 + i) for i, dtype in enumerate(ch04.DTYPES)]
    cases += [((1001,), "float32", 99)]
    inputs = ch04.rank_inputs(cases, n)
    real = dl.spawn(_gloo_collectives, args=(inputs,), nprocs=n, backend="gloo", quiet=True)
    summed, gathered = ch04.summed(inputs), ch04.gathered(inputs)
    for rank, (sums, lists) in enumerate(real):
        for i in range(len(cases)):
            assert ch04.same(summed[rank][i], sums[i])
            got, want = gathered[rank][i], lists[i]
            assert len(got) == n and all(ch04.same(g, w) for g, w in zip(got, want, strict=True))
