"""Checker of chapter 11's exercise: make a training loop resumable, bit for bit.

The learner writes ``save_state(folder, model, optimizer, scheduler, sampler, step)`` and
``load_state(folder, model, optimizer, scheduler, sampler) -> step`` for
``ddp_lab.labs.recovery.resumable_loop``. Graded in the per-rank form (``learner.ranks``): on 2 or
3 gloo ranks, rank r receives only its own input. A first launch runs the loop up to a
hidden step and saves (``probe_stop``) into a folder of the rank's own, and sends back one
record per step (sample indices, the torch / numpy / Python draws, the LR, the parameters'
digest before and after) and the files the ranks wrote there. A second launch, in fresh
processes (``fresh=True``: new sandboxes in the grader), gets those files back as the
checkpoint folder (what a shared file system would show every rank), loads and finishes
the run (``probe_resume``). The checker runs the same loop without interruption in ranks of
its own, and compares: the final parameters bit for bit, or the first resumed step whose
record differs, which says what the checkpoint missed. The folder crosses as data
(``ch11_files``).

The resume launch's input cannot make the run without the checkpoint (``launches``): other
seeds (the model's initialisation, each rank's random streams), no stop step, and the inputs of
the epochs after the stop's, which the grader draws and the stop launch never receives. So the
state at the stop reaches the resume only in the files the stop launch wrote, and a run the
stop launch finished ahead lacks the later epochs' inputs. That holds whatever the learner's
code changes in its own processes (the probe's code, torch, the rank's reply itself are within
its reach); the probes also bind their helpers at import, before a rank loads the learner's
objects, so that a module attribute those set while they load is not what the probe calls.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.course.grading import checker, fail, running, wrong_form
from ddp_lab.course.grading.checks.ch11_files import (
    _kind,
    checkpoint_files,
    read_files,
    write_files,
)
from ddp_lab.i18n import N_, _t, lookup
from ddp_lab.labs.recovery import loop_case_data, loop_data, resumable_loop

MESSAGES = {
    "step": N_(
        "rank {rank}: load_state returned step {got}, the run had stopped after "
        "step {expected}: return the step counter that save_state received"
    ),
    "model": N_(
        "rank {rank}, step {step}: the parameters before the first resumed step "
        "differ from the uninterrupted run's: save and load model.state_dict()"
    ),
    "sampler": N_(
        "rank {rank}, step {step}: the batch holds other samples than in the "
        "uninterrupted run: save the sampler's epoch and position "
        "(sampler.state_dict()) and restore them"
    ),
    "rng": N_(
        "rank {rank}, step {step}: {which}'s random draw differs from the "
        "uninterrupted run: save each rank's random state ({call}) and restore it"
    ),
    "schedule": N_(
        "rank {rank}, step {step}: the learning rate is {got}, the uninterrupted "
        "run used {expected}: save and load scheduler.state_dict()"
    ),
    "optimizer": N_(
        "rank {rank}, step {step}: the same batch, draws and LR gave other "
        "parameters than in the uninterrupted run: save and load "
        "optimizer.state_dict() (SGD's momentum)"
    ),
    "steps": N_("rank {rank}: the resumed run took {got} steps, the uninterrupted one {expected}"),
    "params": N_(
        "rank {rank}: the final parameters differ from the uninterrupted run's "
        "(max difference {diff:.2e}); resuming must give them bit for bit"
    ),
    "before_stop": N_(
        "rank {rank}: the run differed from the uninterrupted one before it was "
        "stopped (step {step}): save_state must not change the training"
    ),
    "malformed": N_("rank {rank} sent back a result of the wrong form ({field}: {kind})"),
}

RNG_CALLS = {
    "torch": "torch.get_rng_state()",
    "numpy": "np.random.get_state()",
    "python": "random.getstate()",
}
FIELDS = {
    "step": int,
    "epoch": int,
    "indices": list,
    "torch": float,
    "numpy": float,
    "python": bool,
    "lr": float,
    "before": str,
    "after": str,
}


EPOCHS = 3  # a stop falls in the first two: at least one epoch's inputs are new to the resume
# What the loop reads of a case: the oracle gets these, each launch a part (``launches``).
LOOP_KEYS = ("seed", "order_seed", "x", "y", "batch_size", "epochs", "lr", "lr_every",
             "shuffle", "stop_at")  # fmt: skip


def probe_stop(
    rank: int,
    objects: tuple,
    data: dict[str, Any],
    *,
    _loop: Any = resumable_loop,
    _read: Any = read_files,
) -> dict[str, Any]:
    """In the learner's ranks: run the loop up to ``case["stop_at"]``, call save_state, and send
    back the records and the files written into the checkpoint folder. (``_loop``, ``_read``:
    bound at import, before the rank loads the learner's objects.)"""
    save_state, _ = objects
    where = Path(tempfile.gettempdir()) / data["folder"]
    where.mkdir(parents=True, exist_ok=True)
    try:
        out = _loop(data["case"], save_state=save_state, folder=str(where))
        dist.barrier()  # every rank's save is complete before the files are read
        out["files"] = _read(where)
        dist.barrier()
    except BaseException:
        # The launcher stops the other ranks after a failure: nobody else would remove it.
        shutil.rmtree(where, ignore_errors=True)
        raise
    if rank == 0:  # the folder is private to this launch (shared by ranks in self-study)
        shutil.rmtree(where, ignore_errors=True)
    return out


def probe_resume(
    rank: int,
    objects: tuple,
    data: dict[str, Any],
    *,
    _loop: Any = resumable_loop,
    _write: Any = write_files,
) -> dict[str, Any]:
    """In fresh ranks: the checkpoint folder rebuilt from the first launch's files, load_state
    from it, and finish the run (the case of the resume launch: other seeds, no stop step,
    every epoch's inputs; ``_loop``, ``_write``: bound at import)."""
    _, load_state = objects
    where = Path(tempfile.gettempdir()) / data["folder"]
    where.mkdir(parents=True, exist_ok=True)
    loaded: list[Any] = []

    def load(*args: Any) -> int:
        step = load_state(*args)
        loaded.append(step if type(step) is int else -1)
        return step if type(step) is int else 0

    try:
        _write(where, data["files"])
        dist.barrier()  # the folder is complete on every rank before any loads
        out = _loop({**data["case"], "resume": True}, load_state=load, folder=str(where))
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(where, ignore_errors=True)
    out["loaded_step"] = loaded[0] if loaded else -1
    return out


def _oracle(rank: int, case: dict[str, Any]) -> dict[str, Any]:
    """In the grader's ranks: the same loop, never stopped."""
    return resumable_loop({**case, "stop_at": None})


def launches(case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the ranks of the stop launch and of the resume launch receive of ``case``.

    The stop launch: the case, with the inputs of the epochs up to the stop's only. The resume
    launch: the configuration (batch size, epochs, LR, schedule, shuffle and its seed) and
    every epoch's inputs, but other seeds for the model and the random streams, and no stop
    step: the state at the stop comes out right only from the checkpoint, and the epochs after
    the stop's were never seen by the launch that wrote it."""
    stop = {k: case[k] for k in LOOP_KEYS}
    stop["x"] = case["x"][: (case["stop_at"] - 1) // case["per_epoch"] + 1].clone()
    resume = {k: case[k] for k in LOOP_KEYS if k not in ("seed", "stop_at")}
    resume["seed"] = case["resume_seed"]
    return stop, resume


def _validate(results: Any, world: int, case: dict[str, Any], label: str) -> list[dict]:
    """The probe's results, checked to be of the form ``resumable_loop`` returns."""

    def bad(rank: object, field: str, value: Any) -> Exception:
        return wrong_form(rank, field, _kind(value), label)

    if not isinstance(results, list) or len(results) != world:
        raise bad("-", "ranks", results)
    with torch.random.fork_rng(devices=[]):
        shapes = [p.shape for p in loop_case_data(case)[2].parameters()]
    for rank, r in enumerate(results):
        if not isinstance(r, dict) or not isinstance(r.get("records"), list):
            raise bad(rank, "result", r)
        for rec in r["records"]:
            if not isinstance(rec, dict) or set(rec) != set(FIELDS):
                raise bad(rank, "record", rec)
            for name, kind in FIELDS.items():
                if type(rec[name]) is not kind:
                    raise bad(rank, name, rec[name])
        params = r.get("params")
        if (
            not isinstance(params, list)
            or not all(type(p) is torch.Tensor for p in params)
            or [p.shape for p in params] != shapes
        ):
            raise bad(rank, "params", params)
    return results


def first_difference(got: dict[str, Any], want: dict[str, Any]) -> str | None:
    """Which part of a checkpoint a resumed step's record points at, or None if equal."""
    if got == want:
        return None
    if got["step"] != want["step"]:
        return "step"
    if got["before"] != want["before"]:
        return "model"
    if got["epoch"] != want["epoch"] or got["indices"] != want["indices"]:
        return "sampler"
    for name in RNG_CALLS:
        if got[name] != want[name]:
            return name
    if got["lr"] != want["lr"]:
        return "schedule"
    return "optimizer"


def verify(
    stopped: list[dict], resumed: list[dict], reference: list[dict], case: dict[str, Any]
) -> None:
    """Raise CaseFailed at the first resumed step that differs from the uninterrupted run."""
    label = f"world_size={len(reference)}, shuffle={case['shuffle']}, stop_at={case['stop_at']}"
    stop = case["stop_at"]
    for rank, (a, b, ref) in enumerate(zip(stopped, resumed, reference, strict=True)):
        want = ref["records"]
        if a["records"] != want[:stop]:
            first = next(
                (i for i, (g, w) in enumerate(zip(a["records"], want, strict=False)) if g != w), 0
            )
            raise fail(
                _t(
                    "rank {rank}: the run differed from the uninterrupted one before it was "
                    "stopped (step {step}): save_state must not change the training",
                    rank=rank,
                    step=first + 1,
                ),
                label,
            )
        if b.get("loaded_step") != stop:
            raise fail(
                _t(
                    "rank {rank}: load_state returned step {got}, the run had stopped after "
                    "step {expected}: return the step counter that save_state received",
                    rank=rank,
                    got=b.get("loaded_step"),
                    expected=stop,
                ),
                label,
            )
    # The first resumed step where any rank differs, and there the first rank whose own record
    # names a cause: the others' parameters differ too (their gradients were averaged with it),
    # which alone reads as "optimizer", the cause left when all else is equal.
    firsts = []
    for rank, (b, ref) in enumerate(zip(resumed, reference, strict=True)):
        pairs = zip(b["records"], ref["records"][stop:], strict=False)
        for i, (got, exp) in enumerate(pairs):
            what = first_difference(got, exp)
            if what is not None:
                firsts.append((i, what == "optimizer", rank, got, exp, what))
                break
    if firsts:
        _, _, rank, got, exp, what = min(firsts, key=lambda f: f[:3])
        step = exp["step"]
        if what in RNG_CALLS:
            raise fail(
                _t(
                    "rank {rank}, step {step}: {which}'s random draw differs from the "
                    "uninterrupted run: save each rank's random state ({call}) and restore it",
                    rank=rank,
                    step=step,
                    which=what,
                    call=RNG_CALLS[what],
                ),
                label,
            )
        if what == "schedule":
            raise fail(
                _t(
                    "rank {rank}, step {step}: the learning rate is {got}, the uninterrupted "
                    "run used {expected}: save and load scheduler.state_dict()",
                    rank=rank,
                    step=step,
                    got=got["lr"],
                    expected=exp["lr"],
                ),
                label,
            )
        raise fail(
            lookup(MESSAGES, what, rank=rank, step=step, got=got["step"], expected=stop), label
        )
    for rank, (b, ref) in enumerate(zip(resumed, reference, strict=True)):
        want = ref["records"]
        if len(b["records"]) != len(want) - stop:
            raise fail(
                _t(
                    "rank {rank}: the resumed run took {got} steps, the uninterrupted one "
                    "{expected}",
                    rank=rank,
                    got=stop + len(b["records"]),
                    expected=len(want),
                ),
                label,
            )
        for p, q in zip(b["params"], ref["params"], strict=True):
            if not torch.equal(p, q):
                diff = max(
                    (x.double() - y.double()).abs().max().item()
                    for x, y in zip(b["params"], ref["params"], strict=True)
                )
                raise fail(
                    _t(
                        "rank {rank}: the final parameters differ from the uninterrupted run's "
                        "(max difference {diff:.2e}); resuming must give them bit for bit",
                        rank=rank,
                        diff=diff,
                    ),
                    label,
                )


def make_cases(rng: random.Random) -> list[tuple[int, dict[str, Any]]]:
    """(world size, case) of each run: a stop inside the first or second epoch, twice, then one
    on the first epoch's last step (the sampler's position is then the epoch's end)."""

    def case(world: int, shuffle: bool, at_end: bool) -> tuple[int, dict[str, Any]]:
        n, batch = rng.randint(30, 44), rng.choice([3, 4])
        per_epoch = math.ceil(math.ceil(n / world) / batch)  # batches per epoch on a rank
        seed, resume_seed = rng.sample(range(10**6), 2)  # the resume's: never the stop's
        x, y = loop_data(rng.randrange(2**63), n, EPOCHS)
        return world, {
            "seed": seed,
            "resume_seed": resume_seed,
            "order_seed": rng.randrange(10**6),
            "x": x,
            "y": y,
            "n": n,
            "per_epoch": per_epoch,
            "batch_size": batch,
            "epochs": EPOCHS,
            "lr": 0.1,
            "lr_every": rng.randint(2, 4),
            "shuffle": shuffle,
            "stop_at": per_epoch
            if at_end
            else rng.randint(2, per_epoch - 1) + rng.choice([0, per_epoch]),
        }

    inside = [(2, True), (rng.choice([2, 3]), rng.choice([True, False]))]
    cases = [case(world, shuffle, False) for world, shuffle in inside]
    return [*cases, case(2, rng.choice([True, False]), True)]


@checker("11.resume", points=5)
def check_resume(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = make_cases(rng)
    yield len(cases)
    for world, case in cases:
        yield grade_case(learner, world, case)


def grade_case(learner: Any, world: int, case: dict[str, Any]) -> str:
    """One hidden case: stop on ``world`` ranks, resume in fresh ones, compare with an
    uninterrupted run of the grader's own; returns the case's label, raises CaseFailed."""
    from ddp_lab.runtime.launcher import spawn

    label = running(f"world_size={world}, shuffle={case['shuffle']}, stop_at={case['stop_at']}")
    folder = f"ddp_lab_ch11_{uuid.uuid4().hex}"  # in each rank's /tmp
    at_stop, at_resume = launches(case)
    own = [{"case": at_stop, "folder": folder} for _ in range(world)]
    stopped = learner.ranks(probe_stop, own, timeout=120, fresh=True)
    stopped = _validate(stopped, world, case, label)
    files = checkpoint_files(stopped, label)
    own = [{"case": at_resume, "folder": folder, "files": files} for _ in range(world)]
    resumed = learner.ranks(probe_resume, own, timeout=120, fresh=True)
    resumed = _validate(resumed, world, case, label)
    for rank, r in enumerate(resumed):
        if type(r.get("loaded_step")) is not int:
            raise wrong_form(rank, "loaded_step", "?", label)
    whole = {k: case[k] for k in LOOP_KEYS}
    reference = spawn(_oracle, args=(whole,), nprocs=world, backend="gloo", quiet=True, timeout=120)
    verify(stopped, resumed, reference, case)
    return label
