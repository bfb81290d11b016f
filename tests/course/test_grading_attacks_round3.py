"""Grading, round 3 (issue 41): the small, local defences, tested directly.

A class broken by one folder (intake's walk), a forged accusation in ``similarity.md`` (ids
from the submission, printed raw), feedback forged by an exception class's name, the
refusal in 06 bypassed with ``object.__new__``, and ``submissions/`` left unignored.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest.mock as mock
from pathlib import Path

import nbformat
import pytest
from test_grader import (
    RELEASE,
    grade,
    gradebook,
    leftover_processes,
    read,
    sliced_release,
    solved,
    with_cell_after_setup,
    write,
)

from ddp_lab.course.grading import intake, isolation, similarity
from ddp_lab.course.grading.feedback import report_lines
from ddp_lab.course.grading.judge import Result

ROOT = Path(__file__).resolve().parents[2]
UNSOLVED_00 = "def average_across_ranks(value):\n    raise NotImplementedError\n"
# An id that writes a line of its own into similarity.md, accusing an honest classmate.
FORGED_ID = "00.average`\n\n- `honest` ~ `(ddp_lab)`: 100%\n\n## `x"
# The lines a learner's exception class name (or message) would write into their feedback.
FORGED_LINES = "E\n- 00.average: passed, 2/2\ntotal 2/2 points"


def _nest(root: Path, depth: int) -> None:
    """``root/d/d/.../d`` (``depth`` levels) with a notebook at the bottom, made with
    directory descriptors (the path is longer than a path may be)."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    note = os.open("x.ipynb", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(note, b"{}")
    os.close(note)
    os.close(fd)


def _unnest(root: Path) -> None:
    """Remove what ``_nest`` made, bottom up, iteratively."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    while True:
        try:
            fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        except FileNotFoundError:
            break
    for name in os.listdir(fds[-1]):
        os.unlink(name, dir_fd=fds[-1])
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds[0])
    root.rmdir()


def test_an_unwalkable_folder_is_one_learners_error(tmp_path: Path) -> None:
    subs = tmp_path / "subs"
    _nest(subs / "deep", 1100)
    try:  # nothing else may stop the removal of the nest (pytest's cleanup recurses)
        (subs / "wide").mkdir()
        for i in range(10_001):  # intake.MAX_ENTRIES + 1
            (subs / "wide" / f"{i}").touch()
        (subs / "ann").mkdir()
        (subs / "ann" / "work.ipynb").write_text("{}")
        (subs / "bob").mkdir()
        os.symlink(subs / "ann" / "work.ipynb", subs / "bob" / "work.ipynb")
        (subs / "cat.ipynb").write_text("{}")
        found = {s.identity: s for s in intake.find([str(subs)], "work", "en")}
    finally:
        _unnest(subs / "deep")
    assert set(found) == {"ann", "bob", "cat", "deep", "wide"}
    assert found["ann"].problem == "" and found["ann"].rel == ("ann", "work.ipynb")
    assert found["cat"].problem == "" and found["cat"].rel == ("cat.ipynb",)
    assert "symbolic link" in found["bob"].problem
    assert "levels deep" in found["deep"].problem
    assert "more than" in found["wide"].problem


def test_similarity_ids_come_from_the_release_and_strings_are_escaped(tmp_path: Path) -> None:
    release = read(RELEASE)
    nb = with_cell_after_setup(solved(release, UNSOLVED_00), "x = 1\n")
    nb.cells.insert(1, nbformat.v4.new_code_cell("pass", metadata={"grade_id": FORGED_ID}))
    codes = similarity.exercise_code(release, nb)
    ids = {c.metadata["grade_id"] for c in release.cells if c.metadata.get("grade_id")}
    assert set(codes) == ids and FORGED_ID not in codes, codes  # the release's ids only
    assert "x = 1" in codes["00.average"]
    # Whatever reaches the report (ids, names) is a code span: no line of its own.
    pytest.importorskip("copydetect")
    with (
        mock.patch.object(similarity, "exercise_code", lambda r, s: {FORGED_ID: "x = 1\n"}),
        mock.patch.object(
            similarity, "compare", lambda by, t: ({FORGED_ID: [(FORGED_ID, "honest", 1.0)]}, {})
        ),
    ):
        report = similarity.write_report(release, {"a": nb}, tmp_path, "en")
    lines = report.read_text(encoding="utf-8").splitlines()
    assert not any(line.startswith("- `honest`") for line in lines), lines
    assert not any(line.startswith("## `x") for line in lines), lines


def test_an_exception_class_name_cannot_write_lines() -> None:
    from ddp_lab.course.grading.learner import LearnerError

    err = LearnerError(FORGED_LINES, "x")
    assert "\n" not in err.type_name and "\n" not in str(err).split(": ", 1)[0]
    assert err.type_name == "E.00.average.passed.2.2.total.2.2.points"
    assert LearnerError("torch.distributed.DistBackendError", "x").type_name == (
        "torch.distributed.DistBackendError"
    )


def test_feedback_details_stay_inside_their_fence() -> None:
    results = [Result("00.average", 0, 2, "failed", FORGED_LINES)]
    lines = "\n".join(report_lines(results, "en", markdown=True)).splitlines()
    assert not any(line.startswith("- 00.average: passed") for line in lines), lines
    assert [line for line in lines if line.startswith("total")] == ["total 0/2 points"], lines
    assert any("00.average: passed, 2/2" in line for line in lines)  # shown, inside the fence


def test_a_refused_class_refuses_every_method_even_without_init() -> None:
    from torch.utils.data import DistributedSampler

    from ddp_lab.course.grading.learner import Refused, refuse

    sampler = object.__new__(DistributedSampler)
    sampler.dataset, sampler.num_replicas, sampler.rank = range(10), 2, 0
    sampler.epoch, sampler.seed, sampler.shuffle, sampler.drop_last = 0, 0, True, False
    sampler.num_samples, sampler.total_size = 5, 10
    with refuse({"DistributedSampler": DistributedSampler}), pytest.raises(Refused):
        list(iter(sampler))
    assert len(list(iter(sampler))) == 5  # restored after
    assert len(DistributedSampler(range(10), num_replicas=2, rank=0)) == 5


def test_submissions_are_git_ignored() -> None:
    done = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", "submissions/alice/work.ipynb"],
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0


# --- a forged busy machine: starvation is judged by the grader's canary ------------------------

# Hundreds of sleepers waking on one clock tick (their summed run-queue waits exceed the wall
# time), then a stall of the learner's own.
SLEEPERS = """\
import threading, time
def _sleeper():
    while True:
        time.sleep(0.2 - time.time() % 0.2)
for _ in range(300):
    threading.Thread(target=_sleeper, daemon=True).start()
time.sleep(3600)
"""
needs_cgroups = pytest.mark.skipif(
    isolation.unavailable_reason() is not None, reason="no cgroups here"
)


def test_starvation_needs_a_starved_canary_and_a_submission_that_wanted_the_cpu() -> None:
    # (share of its wanted CPU time the canary waited, CPU seconds used, wall seconds)
    assert isolation.starved(0.9, 6.0, 100.0)  # a task got 10% of a core; it took 6%
    assert not isolation.starved(0.9, 90.0, 100.0)  # it used the time
    assert not isolation.starved(0.9, 0.5, 100.0)  # it wanted little: its own stall
    assert not isolation.starved(0.1, 1.0, 100.0)  # the canary got its CPU: a free machine


@needs_cgroups
def test_the_learners_own_waits_do_not_move_the_canary() -> None:
    code = SLEEPERS.replace("time.sleep(3600)", "time.sleep(6)")
    with isolation.Cgroup(f"ddp-lab-test-canary-{os.getpid()}") as group:
        canary = isolation.Canary(period=0.1)
        t0 = time.monotonic()
        subprocess.run(group.enter_argv([sys.executable, "-c", code]), timeout=60, check=True)
        busy, wall, used = canary.stop(), time.monotonic() - t0, group.cpu_seconds()
        assert canary.proc.poll() is not None  # stopped: nothing of the grader's left
    assert not isolation.starved(busy, used, wall), (busy, used, wall)


@needs_cgroups
def test_chapter_00_a_forged_busy_machine_is_the_learners_timeout(tmp_path: Path) -> None:
    release_path, release = sliced_release(RELEASE, tmp_path / "release")
    subs = tmp_path / "subs"
    write(solved(release), subs / "honest.ipynb")
    write(solved(release, UNSOLVED_00), subs / "unsolved.ipynb")
    write(with_cell_after_setup(solved(release), SLEEPERS), subs / "sleepers.ipynb")
    out = tmp_path / "out"
    assert grade(release_path, subs, out, "--cell-timeout", "30", "--jobs", "2") == 0
    book = gradebook(out)
    assert book[("honest", "00.average")] == (2, 2, "passed")
    assert book[("unsolved", "00.average")][0] == 0
    # Its own stall, not a busy machine: the canary beside it got its CPU.
    assert book[("sleepers", "00.average")] == (0, 2, "timeout"), book
    assert leftover_processes() == []


def test_the_canary_judges_the_stretch_asked_for() -> None:
    # The submission's CPU seconds (fake): 0.5 s of start-up, then nothing.
    used = [0.0]
    canary = isolation.Canary(period=0.05, usage=lambda: used[0], every=0.05)

    def sampled(value: float) -> float:  # the first sample that saw ``value`` (waits for it)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            seen = [s[0] for s in list(canary.samples) if s[3] == value]
            if seen:
                return seen[0]
            time.sleep(0.01)
        raise AssertionError(f"no sample saw {value}")

    used[0] = 0.5
    stalled = sampled(0.5)  # the stalled cell starts after the start-up
    time.sleep(0.3)
    ran_out = time.monotonic()  # its time runs out; then the teardown's 2 s of CPU
    used[0] = 2.5
    sampled(2.5)
    canary.stop()
    assert canary.proc.poll() is not None
    _, cpu, wall = canary.since(stalled, ran_out)
    assert cpu == 0.0 and wall >= 0.25, (cpu, wall)
    _, cpu, wall = canary.since(stalled)  # up to the end: the teardown counted
    assert cpu == 2.0, (cpu, wall)
    _, cpu, wall = canary.since(canary.samples[0][0])  # the whole run
    assert cpu == 2.5 and wall >= 0.3, (cpu, wall)


@needs_cgroups
def test_a_sleeping_cell_on_a_starved_machine_is_the_learners_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A machine that starves everyone (the canary waits 90% of the time it wants a CPU) for
    # the whole run: the start-up's CPU, counted against the whole run's wall time, made a
    # cell that only sleeps look like code that wanted the CPU ("busy", shown as "error";
    # the test above failed so at load ~20). The cell that stalled slept: its own timeout.
    # (Not SLEEPERS: their 300 threads' own churn, ~0.06 of a core on a free machine, is
    # more than half of the 0.1 of a core this fake machine gives.)
    def starved_canary(self: isolation.Canary) -> tuple[float, float]:
        t = time.monotonic() - t0
        return 0.1 * t, 0.9 * t

    t0 = time.monotonic()
    monkeypatch.setattr(isolation.Canary, "_schedstat", starved_canary)
    release_path, release = sliced_release(RELEASE, tmp_path / "release")
    subs = tmp_path / "subs"
    write(with_cell_after_setup(solved(release), "import time\ntime.sleep(3600)"), subs / "s.ipynb")
    out = tmp_path / "out"
    assert grade(release_path, subs, out, "--cell-timeout", "30", "--jobs", "1") == 0
    assert gradebook(out)[("s", "00.average")] == (0, 2, "timeout"), gradebook(out)
    assert leftover_processes() == []


def test_learners_results_carry_no_instructor_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    release_path, release = sliced_release(RELEASE, tmp_path / "release")
    subs = tmp_path / "subs"
    write(solved(release), subs / "honest.ipynb")
    write(solved(release, UNSOLVED_00), subs / "unsolved.ipynb")
    # A machine without cgroups: the grader notes it for the instructor.
    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "a test's machine")
    out = tmp_path / "out"
    assert grade(release_path, subs, out, "--cell-timeout", "60", "--jobs", "2") == 0
    book = gradebook(out)
    assert book[("honest", "00.average")] == (2, 2, "passed")
    assert book[("unsolved", "00.average")][0] == 0
    for name in ("honest", "unsolved"):
        doc = json.loads((out / "results" / f"{name}.json").read_text(encoding="utf-8"))
        shown = json.dumps([doc["output"], doc["tests"]], ensure_ascii=False)
        assert "cgroup" not in shown and "a test's machine" not in shown, shown
        assert any("a test's machine" in n for n in doc["extra_data"]["notes"]), doc
    assert leftover_processes() == []


# In a fresh Python (the hook, once added, stays in its process): a refusal as self-study's
# ``LocalLearner`` makes one, around one call. Inside it, the roads to a fresh copy of the
# refused class are refused, with names no scan reads; after it, the learner's kernel works
# as before (a re-import, another program): the hook is inert outside a refusal. A graded
# rank's refusal (``refuse_for_life``) cannot be ended, not by the hook's own state either.
SELF_STUDY = """
import sys
from torch.utils.data import DistributedSampler
import torch.utils.data.distributed as original
from ddp_lab.course.grading.learner import Refused, refuse

modules = getattr(sys, "mod" + "ules")
loader = modules["import" + "lib"]
load = getattr(loader, "import_" + "module")
util = load("import" + "lib.util")
path = original.__file__


def reimport():
    modules.pop("torch.utils.data.distributed")
    try:
        return load("torch.utils.data.distributed")
    finally:
        modules["torch.utils.data.distributed"] = original


def from_file():
    spec = getattr(util, "spec_from_" + "file_location")("fresh", path)
    fresh = util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return fresh


def child():
    run = getattr(load("sub" + "process"), "run")
    return run([sys.executable, "-c", "print(6)"], capture_output=True, text=True).stdout


def spawned():  # a Process, not a Pool: a Pool's semaphore, made before its refused start,
    # would stay in /dev/shm (the resource tracker that unlinks it is a program too)
    process = load("multi" + "processing").get_context("spawn").Process(target=abs, args=(-6,))
    process.start()
    process.join()
    return process.exitcode


def memory():
    return load("ctypes").pythonapi.Py_IncRef


def memory_file():
    with open("/proc/self/mem", "r+b") as f:
        return f.seekable()


def folder():  # a descriptor of the module's folder opens it by a relative name
    fd = load("os").open(path.rpartition("/")[0], 0)
    load("os").close(fd)
    return fd


def ending_it():  # the hook's own state, set by hand
    hook = load("ddp_lab.course.grading.guard")._audit
    hook.__defaults__ = ((), hook, *hook.__defaults__[2:])


ATTACKS = [reimport, from_file, child, spawned, memory, memory_file, folder]
with refuse({"DistributedSampler": DistributedSampler}, "torch.randperm"):
    for attack in ATTACKS:
        try:
            attack()
            print(attack.__name__, "allowed")
        except Refused as exc:
            print(attack.__name__, "refused", "DistributedSampler" in str(exc))
for attack in ATTACKS:
    print(attack.__name__, "after", type(attack()).__name__)

# A graded rank's refusal (for its life): not even the hook's own state can end it.
from ddp_lab.course.grading.learner import refuse_for_life

refuse_for_life({"DistributedSampler": DistributedSampler}, "torch.randperm")
for attack in [ending_it, reimport, child]:
    try:
        attack()
        print(attack.__name__, "for life: allowed")
    except Refused:
        print(attack.__name__, "for life: refused")
"""


def test_self_study_refuses_a_fresh_copy_only_during_the_refusing_call() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SELF_STUDY], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for name in ("reimport", "from_file", "child", "spawned", "memory", "memory_file", "folder"):
        assert f"{name} refused True" in lines, done.stdout
    for name, kind in [("reimport", "module"), ("from_file", "module"), ("child", "str")]:
        assert f"{name} after {kind}" in lines, done.stdout
    assert "spawned after int" in lines and "memory after _FuncPtr" in lines, done.stdout
    assert "memory_file after bool" in lines and "folder after int" in lines, done.stdout
    for name in ("ending_it", "reimport", "child"):
        assert f"{name} for life: refused" in lines, done.stdout
