"""The chapter 08 checker passes a correct fit and rejects the source notes' real mistakes.

Each wrong version below carries one bug from the notes (optimizer created in the loop, no
set_epoch, every rank saving, saving the DDP wrapper or the module object, the loss of one
rank only); the checker must fail it and say why.
"""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import ddp_lab as dl
from ddp_lab.course import grading
from ddp_lab.course.grading import CaseFailed, sandbox
from ddp_lab.course.grading.checks import ch08, ch08_oracle
from ddp_lab.course.grading.checks.ch08_writes import judge_writes
from ddp_lab.course.grading.learner import LearnerError, RemoteLearner
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.runtime import _pickle


def make_fit(bug: str = ""):
    """A fit() with one named bug (or none)."""

    def fit(model, dataset, epochs, batch_size, lr, checkpoint_path):
        rank, world = dist.get_rank(), dist.get_world_size()
        ddp = model if bug == "no_ddp" else DDP(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        losses = []
        for epoch in range(epochs):
            if bug != "no_set_epoch":
                sampler.set_epoch(epoch)
            total, count = 0.0, 0
            for x, y in loader:
                if bug == "optimizer_in_loop":
                    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
                if bug != "no_zero_grad":
                    optimizer.zero_grad()
                loss = F.cross_entropy(ddp(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item() * (len(y) if bug == "per_sample_mean" else 1)
                count += len(y)
            mean = torch.tensor(total / (count if bug == "per_sample_mean" else len(loader)))
            if bug == "rank0_loss":
                losses.append(mean.item())  # each rank logs its own loss: rank 0's is "the" loss
                continue
            dist.all_reduce(mean)
            losses.append((mean if bug == "sum_loss" else mean / world).item())
        module = ddp.module if bug != "no_ddp" else ddp
        if bug == "barrier_before_save":
            dist.barrier()
        if bug == "alias_every_rank_saves":  # counting calls of torch.save saw rank 0's only
            save = torch.save if rank == 0 else torch.serialization.save
            save(module.state_dict(), checkpoint_path)
        elif bug in ("file_every_rank_saves", "file_object") and (
            rank == 0 or bug == "file_every_rank_saves"
        ):
            with open(checkpoint_path, "wb") as f:
                torch.save(module.state_dict(), f)
        elif bug == "atomic" and rank == 0:  # a temporary file, renamed: train_checkpoint.py
            torch.save(module.state_dict(), checkpoint_path + ".tmp")
            os.replace(checkpoint_path + ".tmp", checkpoint_path)
        elif bug == "alias" and rank == 0:
            torch.serialization.save(module.state_dict(), checkpoint_path)
        elif bug in ("alias_every_rank_saves", "file_every_rank_saves", "file_object", "atomic"):
            pass
        elif rank == 0 or bug == "every_rank_saves":
            if bug == "save_wrapper":
                torch.save(ddp.state_dict(), checkpoint_path)
            elif bug == "save_module_object":
                torch.save(module, checkpoint_path)
            elif bug == "extra_file":
                torch.save(module.state_dict(), checkpoint_path)
                torch.save(module.state_dict(), checkpoint_path + ".bak")
            else:
                torch.save(module.state_dict(), checkpoint_path)
        if bug not in ("no_final_barrier", "barrier_before_save"):
            dist.barrier()
        if bug == "reload":  # every rank reads the checkpoint back, once it is complete
            module.load_state_dict(torch.load(checkpoint_path, map_location="cpu"))
        return losses

    return fit


def _grade(fn, capsys) -> str:
    try:
        grading.grade("08.fit", fn)
    except AssertionError as failed:  # the verdict line is the error, "FAIL 08.fit: ..."
        return str(failed)
    return capsys.readouterr().out


def test_correct_fit_passes(capsys):
    assert _grade(make_fit(), capsys).startswith("PASS 08.fit")


def test_loss_averaged_over_samples_is_accepted_too(capsys):
    assert _grade(make_fit("per_sample_mean"), capsys).startswith("PASS 08.fit")


@pytest.mark.parametrize("way", ["alias", "file_object", "atomic", "reload"])
def test_other_honest_ways_to_save_pass(way, capsys):
    """Rank 0 writes through another name, a file object or a renamed temporary file; every
    rank reads the checkpoint back after the barrier."""
    assert _grade(make_fit(way), capsys).startswith("PASS 08.fit")


def _oracle_case(rank, case):
    x, y, model = ch08.make_case(case)
    ch08_oracle.reference_fit(
        model, torch.utils.data.TensorDataset(x, y), case["epochs"], case["batch_size"], case["lr"]
    )
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("world", [2, 3])
def test_the_oracle_equals_a_single_process_simulation_of_ddp(world):
    """DDP = every step, the gradient of the mean of the ranks' batch losses."""
    case = {
        "seed": 7,
        "n": 29,
        "features": 4,
        "classes": 3,
        "hidden": 8,
        "epochs": 2,
        "batch_size": 4,
        "lr": 0.05,
    }
    got = dl.spawn(_oracle_case, args=(case,), nprocs=world, backend="gloo", quiet=True)
    x, y, model = ch08.make_case(case)
    dataset = torch.utils.data.TensorDataset(x, y)
    optimizer = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9)
    samplers = [DistributedSampler(dataset, num_replicas=world, rank=r) for r in range(world)]
    for epoch in range(case["epochs"]):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [list(s) for s in samplers]
        for start in range(0, len(shards[0]), case["batch_size"]):
            optimizer.zero_grad()
            batches = [torch.tensor(sh[start : start + case["batch_size"]]) for sh in shards]
            loss = sum(F.cross_entropy(model(x[b]), y[b]) for b in batches) / world
            loss.backward()
            optimizer.step()
    for rank_params in got:
        for p, q in zip(model.parameters(), rank_params, strict=True):
            torch.testing.assert_close(q, p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "bug, words",
    [
        ("optimizer_in_loop", "optimizer once"),
        ("no_zero_grad", "zero_grad"),
        ("no_set_epoch", "set_epoch"),
        ("every_rank_saves", "only rank 0"),
        ("alias_every_rank_saves", "only rank 0"),  # got 5/5: only torch.save was counted
        ("file_every_rank_saves", "only rank 0"),
        # got 5/5: the probe's own barrier after fit hid the missing one
        ("no_final_barrier", "before rank 0 had written the checkpoint"),
        ("barrier_before_save", "before rank 0 had written the checkpoint"),
        ("save_wrapper", "DDP wrapper"),
        ("save_module_object", "not a plain state_dict"),
        ("extra_file", "exactly one checkpoint file"),
        ("rank0_loss", "different losses"),
        ("sum_loss", "not the mean over all ranks"),
        ("no_ddp", "differ between rank 0 and rank"),
    ],
)
def test_typical_mistakes_fail_with_the_reason(bug, words, capsys):
    out = _grade(make_fit(bug), capsys)
    assert out.startswith("FAIL"), out
    assert words in out, out


def test_losses_that_are_not_numbers_fail_cleanly(capsys):
    correct = make_fit()

    def fit(*args):
        return [object() for _ in correct(*args)]

    out = _grade(fit, capsys)
    assert out.startswith("FAIL") and "list[object]" in out and "one loss" in out, out


class Answers:
    """A learner handle whose ranks send back ``make(nprocs)``: what a tampered runner could."""

    def __init__(self, make):
        self.make = make

    def ranks(self, probe, inputs, timeout=60, fresh=False, share=None):
        result = self.make(len(inputs))
        if isinstance(result, Exception):
            raise result
        return result


def _results(n, **change):
    """Well-formed probe results (of a run that did nothing), with some fields changed."""
    base = {"reads": [], "saves": 0, "returned_at": 1.0, "losses": [1.0] * 3, "params": []}
    return [
        {**base, "saved_at": None, "files": [], "checkpoint": {"error": "X"}, **change}
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "PASS",
        lambda n: ["PASS"] * n,
        lambda n: _results(n + 1),
        lambda n: _results(n),  # no parameters
        lambda n: _results(n, reads="0,1,2"),
        lambda n: _results(n, saves=True),
        lambda n: _results(n, returned_at=1),
        lambda n: _results(n, saved_at="now"),
        lambda n: _results(n, losses=["1.0"]),
        lambda n: _results(n, checkpoint="model.pt"),
        lambda n: LearnerError("WireError", "a MyTensor cannot be sent"),
    ],
)
def test_results_that_are_not_the_probes_data_fail_cleanly(make):
    passed, line = grading.run_checker(grading.load_checkers()["08.fit"], Answers(make), "en")
    assert not passed and line.startswith("FAIL 08.fit") and "Hidden case 1 of 2" in line
    assert "wrong form" in line or "WireError" in line, line


def test_unsolved_stub_fails(capsys, checker_folders):
    def fit(model, dataset, epochs, batch_size, lr, checkpoint_path):
        raise NotImplementedError("your code here")

    import tempfile
    from pathlib import Path

    made = checker_folders("ch08")
    out = _grade(fit, capsys)
    assert out.startswith("NOT ATTEMPTED 08.fit") and "not solved" in out
    # removed all the same (only this test's own folders: other runs on the machine make theirs)
    assert made and not [f for f in made if (Path(tempfile.gettempdir()) / f).exists()]


# --- the grader's own evidence: who wrote the checkpoint, when each rank's reply arrived -----


def _own_account(world: int, saved_at: float = 10.0) -> list[dict]:
    """What honest ranks say of themselves: rank 0 wrote once, every rank returned after."""
    ranks = [{"saves": 0, "returned_at": saved_at + 1.0} for _ in range(world)]
    ranks[0].update(saves=1, saved_at=saved_at, files=["model.pt"])
    return ranks


def _listing(ctime: float, *extra: str) -> dict:
    return {name: {"kind": "file", "size": 9, "ctime": ctime} for name in ("model.pt", *extra)}


def test_the_graders_listing_and_reply_times_decide_over_the_ranks_account():
    """Review 8: the ranks' own account (audit hook, time.monotonic) said all was well while
    rank 1 wrote through a dir_fd and returned at once with its clock pushed on."""
    honest = {"shared": _listing(100.0), "answered": [100.5, 100.4]}
    judge_writes(_own_account(2), "case", honest)
    with pytest.raises(CaseFailed, match="rank 1 returned from fit at least 1.5 s before"):
        judge_writes(_own_account(2), "case", {**honest, "answered": [100.5, 98.5]})
    with pytest.raises(CaseFailed, match="exactly one checkpoint file"):
        judge_writes(_own_account(2), "case", {**honest, "shared": _listing(100.0, "x.pt")})
    # a reply read a moment before the ctime (a clock stepped back) is not a missing barrier
    judge_writes(_own_account(3), "case", {**honest, "answered": [100.5, 99.9, 100.1]})


def dir_fd_every_rank_saves(model, dataset, epochs, batch_size, lr, checkpoint_path):
    """Review 8's D: ranks > 0 save too, by a name relative to the folder (an audit "open"
    event the hook resolved against the cwd): 5/5 on the ranks' own account."""
    losses = make_fit("no_final_barrier")(model, dataset, epochs, batch_size, lr, checkpoint_path)
    if dist.get_rank() > 0:
        folder = os.open(os.path.dirname(checkpoint_path), os.O_RDONLY)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = os.open(os.path.basename(checkpoint_path), flags, 0o644, dir_fd=folder)
        with open(fd, "wb") as f:
            torch.save(model.state_dict(), f)
    dist.barrier()
    return losses


def no_barrier_clock_ahead(model, dataset, epochs, batch_size, lr, checkpoint_path):
    """Review 8's E: no barrier after the save; ranks > 0 push time.monotonic a minute on, so
    the probe's own clock saw them return late: 5/5 on the ranks' own account."""
    losses = make_fit("no_final_barrier")(model, dataset, epochs, batch_size, lr, checkpoint_path)
    if dist.get_rank() > 0:
        real = time.monotonic
        time.monotonic = lambda: real() + 60.0
    return losses


class Remote(RemoteLearner):
    """The verdict's handle without a runner: 08.fit reaches the learner's code through
    ``ranks`` only, each rank in a sandbox of its own."""

    def __init__(self, *objects) -> None:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
        blob = _pickle.dumps(objects)
        super().__init__("08.fit", None, None, lambda: None, blob, "en", 0, RankPool)  # type: ignore[arg-type]


def remote_verdict(fit) -> tuple[bool, str]:
    learner = Remote(fit)
    try:
        return grading.run_checker(grading.load_checkers()["08.fit"], learner, "en")
    finally:
        learner.close()


sandboxed = pytest.mark.skipif(not sandbox.available(), reason="the ranks' sandboxes")


@sandboxed
@pytest.mark.parametrize(
    "fit, words",
    [
        (dir_fd_every_rank_saves, "rank 1 wrote into the checkpoint's folder"),
        (no_barrier_clock_ahead, "rank 1 returned from fit at least"),
    ],
)
def test_graded_review_8s_attacks_fail(fit, words):
    passed, line = remote_verdict(fit)
    assert not passed and " 0/5" in line and "Hidden case 1 of 2" in line, line
    assert words in line, line


@sandboxed
def test_graded_every_rank_reads_the_checkpoint_back():
    """Each rank has a /tmp of its own, but the checkpoint's folder is one: the other ranks
    read what rank 0 wrote (after the barrier), as on a shared disk."""
    passed, line = remote_verdict(make_fit("reload"))
    assert passed and "5/5" in line and "could not observe" not in line, line
