"""11.resume in sandboxed ranks: no resume without a checkpoint (review: 5/5 with none).

The attacks, as a learner writes them in the notebook (their objects travel by value, as a
notebook's code does; ``course.rankhost`` loads them in each rank before the probe runs):
- ``replay_*``: load_state ignores the folder and replays the run up to the stop from what the
  resume rank received (the case's seed and stop step, which it used to be given);
- ``swap_*``: a ``__reduce__`` in the objects replaces the checker's module attribute
  ``resumable_loop`` while they load, with a loop that computes the uninterrupted run;
- ``ahead_*``: save_state, in the stop launch, finishes the run and leaves it as the
  "checkpoint"; a ``__reduce__`` swaps the code of the loop function itself (what any binding
  calls) for one that hands the stored run back in the resume launch.

Each one got full points. Now the resume launch gets other seeds, no stop step, and the inputs
of epochs the stop launch never saw (``ch11.launches``), and the probes bind the loop at import:
each case fails. One hidden case each (``ch11.grade_case``), to stay fast.
"""

from __future__ import annotations

import copy
import random
import sys
import types
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch
import torch.distributed as dist

from ddp_lab.course.grading.checkers import CaseFailed
from ddp_lab.course.grading.checks import ch11
from ddp_lab.course.grading.learner import LearnerError, RemoteLearner
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.runtime import _pickle


class Remote(RemoteLearner):
    """The verdict's handle, without a runner (11.resume reaches the learner through ranks)."""

    def __init__(self, *objects: Any) -> None:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's code
        blob = _pickle.dumps(objects)
        super().__init__("11.resume", None, None, lambda: None, blob, "en", 0, RankPool)  # type: ignore[arg-type]


def _received() -> dict:
    """The case this rank was given: ``data["case"]`` in the probe's frame."""
    frame = sys._getframe(1)
    while frame is not None:
        data = frame.f_locals.get("data")
        if isinstance(data, dict) and isinstance(data.get("case"), dict):
            return data["case"]
        frame = frame.f_back
    raise RuntimeError("no case in the frames")


GUESS: list[int] = []  # the stop step, where the rank is not told it: a lucky guess (the test's)


def _stop_of(case: dict) -> int:
    return case.get("stop_at") or GUESS[0]


def _at_stop(case: dict) -> dict:
    """Run the loop of ``case`` to its (given or guessed) stop; the state there, as data."""
    from ddp_lab.labs import recovery

    got: dict = {}

    def grab(folder, model, optimizer, scheduler, sampler, step):  # noqa: ANN001, ANN202
        got.update(
            model=copy.deepcopy(model.state_dict()),
            optimizer=copy.deepcopy(optimizer.state_dict()),
            scheduler=copy.deepcopy(scheduler.state_dict()),
            sampler=dict(sampler.state_dict()),
            step=step,
            rng=(torch.get_rng_state(), np.random.get_state(), random.getstate()),
        )

    run = {k: v for k, v in case.items() if k != "resume"}
    recovery.resumable_loop({**run, "stop_at": _stop_of(case)}, save_state=grab)
    return got


def replay_save(folder, model, optimizer, scheduler, sampler, step):  # noqa: ANN001, ANN201
    """No checkpoint at all."""


def replay_load(folder, model, optimizer, scheduler, sampler):  # noqa: ANN001, ANN201
    got = _at_stop(_received())
    model.load_state_dict(got["model"])
    optimizer.load_state_dict(got["optimizer"])
    scheduler.load_state_dict(got["scheduler"])
    sampler.load_state_dict(got["sampler"])
    torch.set_rng_state(got["rng"][0])
    np.random.set_state(got["rng"][1])
    random.setstate(got["rng"][2])
    return got["step"]


class Patched:
    """A callable whose unpickling runs ``install`` first (``__reduce__``)."""

    def __init__(self, fn: Any, install: Any) -> None:
        self.fn, self.install = fn, install

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __reduce__(self) -> tuple:
        return (_patched, (self.fn, self.install))


def _patched(fn: Any, install: Any) -> Patched:
    install()
    return Patched(fn, install)


def _uninterrupted(
    case: Any, save_state: Any = None, load_state: Any = None, folder: Any = None
) -> dict:
    """In place of ``resumable_loop``: a resume hands back the uninterrupted run's rest."""
    from ddp_lab.labs import recovery

    if not case.get("resume"):
        return recovery.resumable_loop(case, save_state=save_state, folder=folder)
    given = _received()
    stop = _stop_of(given)
    out = recovery.resumable_loop({**given, "resume": False, "stop_at": None})
    load_state(folder, None, None, None, None)
    return {"records": out["records"][stop:], "params": out["params"]}


def _swap_the_checkers_loop() -> None:
    checker = sys.modules.get("ddp_lab.course.grading.checks.ch11")
    if checker is not None:
        checker.resumable_loop = _uninterrupted


def swap_load(folder, model, optimizer, scheduler, sampler):  # noqa: ANN001, ANN201
    return _stop_of(_received())


def _never(*args: Any, **kwargs: Any) -> dict:
    raise RuntimeError("the learner's loop was called")


def _swap_in_never() -> None:
    checker = sys.modules.get("ddp_lab.course.grading.checks.ch11")
    if checker is not None:
        checker.resumable_loop = _never


def honest_save(folder, model, optimizer, scheduler, sampler, step):  # noqa: ANN001, ANN201
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": sampler.state_dict(),
        "step": step,
        "rng": (torch.get_rng_state(), np.random.get_state(), random.getstate()),
    }
    torch.save(state, Path(folder) / f"rank{dist.get_rank()}.pt")


def honest_load(folder, model, optimizer, scheduler, sampler):  # noqa: ANN001, ANN201
    state = torch.load(Path(folder) / f"rank{dist.get_rank()}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"][0])
    np.random.set_state(state["rng"][1])
    random.setstate(state["rng"][2])
    return state["step"]


def ahead_save(folder, model, optimizer, scheduler, sampler, step):  # noqa: ANN001, ANN201
    """The rest of the run, finished now, as the checkpoint (as far as the inputs given go)."""
    from ddp_lab.labs import recovery

    frame, case = sys._getframe(1), None
    while case is None:
        found = frame.f_locals.get("case")
        case = found if isinstance(found, dict) and "seed" in found else None
        frame = frame.f_back
    run = {**case, "stop_at": None}
    if "x" in run:  # the epochs whose inputs the stop launch has
        run["epochs"] = min(run["epochs"], len(run["x"]))
    out = getattr(recovery, "_real_loop", recovery.resumable_loop)(run)
    stored = {"records": out["records"][step:], "params": out["params"], "step": step}
    torch.save(stored, Path(folder) / f"rank{dist.get_rank()}.pt")


def ahead_load(folder, model, optimizer, scheduler, sampler):  # noqa: ANN001, ANN201
    return torch.load(Path(folder) / f"rank{dist.get_rank()}.pt", weights_only=False)["step"]


def _stored_run(
    case: Any, save_state: Any = None, load_state: Any = None, folder: Any = None
) -> dict:
    """The code swapped into ``resumable_loop``: a resume returns what the stop launch stored."""
    from pathlib import Path as P

    import torch as t
    import torch.distributed as d

    from ddp_lab.labs import recovery as r

    if not case.get("resume"):
        return r._real_loop(case, save_state=save_state, load_state=load_state, folder=folder)
    load_state(folder, None, None, None, None)
    got = t.load(P(folder) / f"rank{d.get_rank()}.pt", weights_only=False)
    return {"records": got["records"], "params": got["params"]}


def _swap_the_loops_code() -> None:
    from ddp_lab.labs import recovery

    if not hasattr(recovery, "_real_loop"):
        loop = recovery.resumable_loop
        recovery._real_loop = types.FunctionType(
            loop.__code__, loop.__globals__, "real", loop.__defaults__, loop.__closure__
        )
        loop.__code__ = _stored_run.__code__


def _lucky(guess: int) -> None:
    GUESS[:] = [guess]


ATTACKS = {
    "replay": (replay_save, replay_load),
    "swap": (replay_save, swap_load),
    "ahead": (ahead_save, ahead_load),
}
INSTALLS = {"replay": lambda: None, "swap": _swap_the_checkers_loop, "ahead": _swap_the_loops_code}


def attack(name: str, stop: int) -> tuple:
    """The attack's (save_state, load_state); the load's unpickling installs its swap and the
    guess of the stop step (every rank of the stop and of the resume launch unpickles it)."""
    save, load = ATTACKS[name]

    def install() -> None:
        _lucky(stop)
        INSTALLS[name]()

    return save, Patched(load, install)


def _first_case() -> tuple[int, dict]:
    return ch11.make_cases(random.Random(11))[0]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_resume_without_a_checkpoint_fails(name: str) -> None:
    world, case = _first_case()
    learner = Remote(*attack(name, case["stop_at"]))
    try:
        # "ahead" raises in the ranks as they load the objects, and "swap" leaves the checker's
        # module changed when the probe returns (``course.grading.freeze``): the learner's
        # error (the checker's ``run_checker`` fails the case with it)
        with pytest.raises(CaseFailed if name == "replay" else LearnerError) as failed:
            ch11.grade_case(learner, world, case)
    finally:
        learner.close()
    # with the stop step guessed right, the state at the stop is still another run's (the
    # resume's seeds); a run finished ahead lacks the epochs whose inputs came later
    said = str(failed.value.args[0])
    # "ahead" swaps the loop's __code__ as the objects load: a graded rank is sealed by then
    # (``guard.seal``, review 9); before the seal, the run it finished ahead failed the same case
    # for lacking the later epochs' inputs ("the uninterrupted one").
    expected = {
        "ahead": "changing __code__ of a function of ddp_lab or torch",
        "swap": "replaced ddp_lab.course.grading.checks.ch11.resumable_loop",
    }
    assert expected.get(name, "model.state_dict()") in said, said


def test_a_loop_swapped_in_while_the_objects_load_is_not_called() -> None:
    """The probes call the loop they bound at import, not the one the learner's objects set
    the checker's module attribute to (which would raise): the case fails on the changed
    module (``course.grading.freeze``), not in the learner's loop."""
    world, case = _first_case()
    learner = Remote(honest_save, Patched(honest_load, _swap_in_never))
    try:
        with pytest.raises(LearnerError) as failed:
            ch11.grade_case(learner, world, case)
    finally:
        learner.close()
    said = str(failed.value.args[0])
    assert "replaced ddp_lab.course.grading.checks.ch11.resumable_loop" in said, said
    assert "the learner's loop was called" not in said, said
