"""Attacks on the verdict's protocol and on what a rank receives (issue 26, classes 1, 2, 6).

A learner who reads the package tries to get points from the process that ran their code:
forging the runner's replies, patching the probes in the runner, reading the other ranks'
inputs from the probe's frames, importing the package's reference implementation, flooding the
protocol pipe. Each must get 0 (or be ``flagged`` for the instructor), while honest work gets
exactly its points and unsolved work 0. The per-rank mechanism (``course.rankhost``) is also
tested directly: rank r receives only its own input.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest
import torch
from graded_classes import HONEST, Graded
from test_grader import leftover_processes, read

from ddp_lab.course.grading import sandbox, scan, wire
from ddp_lab.course.grading.learner import LearnerError, RemoteLearner, RunnerGone
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.course.grading.release import exercises_of
from ddp_lab.runtime import _pickle

ROOT = Path(__file__).resolve().parents[2]

# A cell that writes the runner's "everything passed" replies on every pipe it holds.
FORGE = """\
import json, os
for name in os.listdir('/proc/self/fd'):
    try:
        if 'pipe' in os.readlink(f'/proc/self/fd/{name}'):
            os.write(int(name), (json.dumps({"ok": "null"}) + "\\n").encode())
    except OSError:
        pass
"""
# The probe machinery of the runner and of the checker, replaced in the learner's process.
PATCH_PROBES = """\
import ddp_lab.course.grading.checks.ch00 as ch00
import ddp_lab.course.grading.learner as learner
import ddp_lab.course.grading.runner as runner
ch00.probe_average = lambda rank, objects, *data: torch.zeros(())
learner.LocalLearner.spawn = lambda self, probe, *data, nprocs, timeout=60: []
runner.serve = lambda *a, **k: None
"""
# An "average" that sends nothing: it reads the other ranks' tensors from the probe's frame.
PEEK = """\
import sys
def average_across_ranks(value):
    frame = sys._getframe(1)
    while frame is not None:
        for name in ("values", "inputs", "data"):
            seen = frame.f_locals.get(name)
            if isinstance(seen, list) and seen and isinstance(seen[0], torch.Tensor):
                return sum(seen) / len(seen)
        frame = frame.f_back
    return value
"""
# A line that never ends, on every pipe: 80 MiB without a newline.
FLOOD = """\
import os
chunk = b"x" * (1 << 20)
for name in os.listdir('/proc/self/fd'):
    try:
        if 'pipe' in os.readlink(f'/proc/self/fd/{name}'):
            for _ in range(80):
                os.write(int(name), chunk)
    except OSError:
        pass
"""
UNSOLVED = "def average_across_ranks(value):\n    raise NotImplementedError\n"


def test_attacks_on_the_protocol_get_nothing_and_honest_work_its_points(
    chapter00_class: Graded,
) -> None:
    # graded_classes.py: "stub" is solved(release, UNSOLVED); "forge" and "patch" are that with FORGE
    # and PATCH_PROBES after dl.setup(), "peek" is PEEK, "flood" SOLUTION with FLOOD after it.
    graded = chapter00_class
    book = graded.rows(HONEST, "stub", "unsolved", "forge", "patch", "peek", "flood")
    assert book.pop(HONEST) == (2, 2, "passed")
    assert book.pop("stub") == (0, 2, "not-attempted")
    assert book.pop("unsolved") == (0, 2, "not-attempted")
    assert book.pop("patch") in [(0, 2, "failed"), (0, 2, "flagged")]
    # Reading /proc/self/fd and frames is flagged for the instructor, and earns nothing.
    assert book.pop("forge") in [(0, 2, "flagged"), (0, 2, "kernel-died")]
    assert book.pop("peek") == (0, 2, "flagged")
    assert book.pop("flood")[0] == 0
    assert book == {}
    assert "Similarity report" in (graded.out / "similarity.md").read_text(encoding="utf-8")
    peek = graded.feedback("peek")
    assert "_getframe" in peek and "the mean over ranks is" in peek, peek
    assert graded.leftovers == [] and leftover_processes() == []


# The package's reference ring, imported in place of the learner's (chapter 05's class,
# graded_classes.py).
IMPORT_REFERENCE = (
    "from ddp_lab.ring import ring_all_reduce as _theirs\n"
    "def ring_all_reduce(tensor):\n    return _theirs(tensor)\n"
)


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_the_reference_ring_is_not_importable_while_grading(chapter05_class) -> None:
    graded = chapter05_class
    book = graded.rows("honest", "unsolved", "import_reference", exercise="05.ring")
    assert book["honest"] == (5, 5, "passed")
    assert book["unsolved"] == (0, 5, "not-attempted")
    assert book["import_reference"] == (0, 5, "flagged")
    report = (graded.out / "similarity.md").read_text(encoding="utf-8")
    pairs = [line for line in report.splitlines() if line.startswith("- ")]
    assert not any("(ddp_lab)" in line for line in pairs), report  # the honest ring is its own
    feedback = graded.feedback("import_reference")
    assert "ddp_lab.ring" in feedback and "not available while grading" in feedback, feedback
    # The released solution's ring passes the bytes the grader counts (course/grading/traffic.py),
    # counted in the verdict process as ddp-lab grade runs it.
    feedback = graded.feedback("honest")
    assert "could not observe" not in feedback, feedback
    assert graded.leftovers == [] and leftover_processes() == []


# --- the per-rank mechanism, directly ---------------------------------------------------------


def _remote(objects: tuple) -> RemoteLearner:
    # As a notebook's functions are: by value (a rank cannot import this test module).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    blob = _pickle.dumps(objects)
    return RemoteLearner("00.average", None, None, lambda: None, blob, "en", 0, RankPool)  # type: ignore[arg-type]


def average(value: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    out = value.clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()


def lonely(value: torch.Tensor) -> torch.Tensor:
    return value  # sends nothing: right only if every rank had the same input


def test_each_rank_receives_only_its_own_input() -> None:
    from ddp_lab.course.grading.checks.ch00 import probe_average

    values = [torch.full((3,), float(r)) for r in range(3)]
    # what other programs on the machine have (another run's pools) is theirs to remove
    others = set(Path(tempfile.gettempdir()).glob("ddp-lab-ranks-*"))
    learner = _remote((average,))
    try:
        got = learner.ranks(probe_average, values, timeout=60)
        assert [g.tolist() for g in got] == [[1.0, 1.0, 1.0]] * 3
        # The same sandboxes serve the next case, on fewer ranks.
        two = learner.ranks(probe_average, values[:2], timeout=60)
        assert [g.tolist() for g in two] == [[0.5, 0.5, 0.5]] * 2
    finally:
        learner.close()
    learner = _remote((lonely,))
    try:
        alone = learner.ranks(probe_average, values, timeout=60)
        assert [a.tolist() for a in alone] == [v.tolist() for v in values]
    finally:
        learner.close()
    assert set(Path(tempfile.gettempdir()).glob("ddp-lab-ranks-*")) <= others


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_a_rank_cannot_import_the_answers() -> None:
    from ddp_lab.course.grading.checks.ch00 import probe_average

    def borrowed(value: torch.Tensor) -> torch.Tensor:
        from ddp_lab.ring import ring_all_reduce

        return ring_all_reduce(value)

    learner = _remote((borrowed,))
    with pytest.raises(LearnerError, match="not available while grading"):
        learner.ranks(probe_average, [torch.ones(2)] * 2, timeout=60)
    learner.close()


def test_protocol_reads_are_bounded() -> None:
    read_fd, write_fd = os.pipe()
    reader = wire.LineReader(read_fd, limit=1000)
    try:
        os.write(write_fd, b'{"a": 1}\n' + b"x" * 5000)
        assert reader.readline(5) == b'{"a": 1}'
        with pytest.raises(wire.LineTooLong):
            reader.readline(5)  # past the limit without a newline: refused, not read on
        assert len(reader.buf) <= 1000 + (1 << 16)
    finally:
        os.close(read_fd)
        os.close(write_fd)


# --- the static scan --------------------------------------------------------------------------


def test_scan_finds_what_honest_solutions_never_use() -> None:
    assert scan.findings("from ddp_lab.ring import ring_all_reduce") == [
        "`import ddp_lab.ring`",
        "`ddp_lab.ring.ring_all_reduce`",
    ]
    assert "`.ring_all_reduce`" in scan.findings("x = dl.ring.ring_all_reduce(t)")
    assert "`._getframe`" in scan.findings("import sys\nf = sys._getframe(1).f_locals")
    assert scan.findings("print(open('/proc/self/fd/3').read())")
    assert scan.findings("import gc\nobjs = gc.get_objects()")
    # review 8: the grader's wrappers keep their record and the real method in a closure
    wrapper = "torch._C._distributed_c10d.Work.wait"
    assert "`.__closure__`" in scan.findings(f"cells = {wrapper}.__closure__")
    assert scan.findings(f"c = getattr({wrapper}, '__closure__')[0].cell_contents")
    assert scan.findings(f"g = {wrapper}.__globals__")
    # memory at a raw address without ctypes (tests/_lock_ways.py: the lock's registration)
    assert scan.findings("class A:\n    __array_interface__ = {'data': (0, False)}")
    assert scan.findings("a.__array_interface__ = {'data': (0, False)}")
    assert scan.findings("s = torch._C._construct_storage_from_data_pointer(0, dev, 8)")
    assert scan.findings("import importlib\nimportlib.import_module('ddp_lab.zero')")
    assert scan.findings("%%ddp -n 2\nx = torch.ones(2)") == []
    assert scan.findings("def f(t):\n    return t.view(-1).tensor_split(2)") == []


@pytest.mark.parametrize(
    "chapter", sorted(p.name for p in (ROOT / "solutions" / "en").glob("*.ipynb"))
)
def test_scan_flags_no_released_notebook_and_no_solution(chapter: str) -> None:
    for lang in ("en", "zh"):
        release = read(ROOT / "exercises" / lang / chapter)
        solution = read(ROOT / "solutions" / lang / chapter)
        found = {
            ex.grade_id: i
            for i, c in enumerate(solution.cells)
            for ex in exercises_of(release)
            if c.metadata.get("grade_id") == ex.grade_id
        }
        assert scan.flags_by_exercise(release, release, found) == {}
        assert scan.flags_by_exercise(release, solution, found) == {}, chapter


def test_a_pool_dropped_without_close_removes_its_folder() -> None:
    import gc

    from ddp_lab.course.grading.checks.ch00 import probe_average

    learner = _remote((average,))
    learner.ranks(probe_average, [torch.zeros(1), torch.ones(1)], timeout=60)
    base = learner._pool.base
    assert base is not None and base.exists()
    for proc in learner._pool.procs:  # what close() does first; the folder is left to the GC
        proc.kill()
        proc.wait()
    if learner._pool.holder is not None:
        learner._pool.holder.kill()
        learner._pool.holder.wait()
    learner._pool = None
    gc.collect()
    assert not base.exists()


# 06.indices refuses torch's DistributedSampler (the oracle) in the learner's rank by changing
# the class already imported. A fresh copy of it, by importing its module again after taking
# it out of ``sys.modules`` or in a new Python started with ``subprocess`` (where no refusal
# exists), got 4/4 with nothing for the scan to find; the scan flags them now, and the
# refusal's audit hook refuses them (the same with names the scan cannot read:
# test_grading_attacks_ranks.py).
SAMPLER_REIMPORTED = """\
import sys


def distributed_indices(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,
                        drop_last=False):
    sys.modules.pop("torch.utils.data.distributed", None)
    import torch.utils.data.distributed as fresh

    made = getattr(fresh, "Distributed" + "Sampler")
    s = made(range(dataset_len), num_replicas=num_replicas, rank=rank, shuffle=shuffle,
             seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s)
"""
SAMPLER_IN_A_CHILD = """\
import json
import subprocess
import sys

CHILD = '''
import json, sys
import torch.utils.data.distributed as d
n, r, k, e, seed, sh, dl = json.loads(sys.argv[1])
s = getattr(d, "Distributed" + "Sampler")(range(n), num_replicas=r, rank=k, shuffle=sh,
                                          seed=seed, drop_last=dl)
s.set_epoch(e)
print(json.dumps(list(s)))
'''


def distributed_indices(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,
                        drop_last=False):
    args = json.dumps([dataset_len, num_replicas, rank, epoch, seed, shuffle, drop_last])
    done = subprocess.run([sys.executable, "-c", CHILD, args], capture_output=True, text=True)
    return json.loads(done.stdout)
"""


def test_scan_finds_a_fresh_import_and_another_program() -> None:
    assert scan.findings(SAMPLER_REIMPORTED) == ["`sys.modules`"]
    assert scan.findings(SAMPLER_IN_A_CHILD) == ["`import subprocess`"]
    assert scan.findings("from sys import modules") == ["`sys.modules`"]
    assert scan.findings("import os\nos.system('python -c 1')") == ["`os.system`"]
    assert scan.findings("from os import execv") == ["`os.execv`"]
    assert scan.findings("f = eval('exe' + 'c')") == ["`eval`"]
    # What honest code writes with the same names is not flagged.
    assert scan.findings("model.eval()\nfor m in net.modules():\n    pass") == []
    assert scan.findings("import os\nos.path.join('a', 'b')") == []


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap here")
@pytest.mark.parametrize("attack", [SAMPLER_REIMPORTED, SAMPLER_IN_A_CHILD], ids=["fresh", "child"])
def test_chapter_06_a_fresh_oracle_is_flagged(attack: str) -> None:
    import copy

    from ddp_lab.course.grading import grader

    name = "06_distributed_sampler.ipynb"
    release = read(ROOT / "exercises" / "en" / name)
    nb = copy.deepcopy(release)
    at = next(
        i for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and "def distributed_indices" in c.source
    )  # fmt: skip
    nb.cells[at].source = attack
    graded = grader.grade_one(release, nb, 120, 600, needed_only=True)
    (indices,) = [r for r in graded.results if r.grade_id == "06.indices"]
    # The checker's own verdict stays in the line: the fresh copy (a re-import, another
    # Python) is refused at run time too (course.grading.guard's audit hook), so no case passes.
    assert indices.status == "flagged" and indices.points == 0, indices
    assert "FAIL 06.indices" in indices.detail and "Refused" in indices.detail, indices
    assert leftover_processes() == []


# A protocol line nested deeper than the JSON parser's recursion limit: json.loads raises
# RecursionError, not ValueError. The verdict process died of it, and every exercise of the
# submission (00.average's final "passed" too) became "error", the grader's fault.
DEEP = b"[" * 50_000 + b"\n"  # under a pipe's 64 KiB: written before it is read
DEEP_AFTER_GRADING = "import os\nos.write(4, b'[' * 100_000 + b'\\n')  # the runner's protocol fd"


class _Alive:
    def poll(self) -> None:
        return None


def test_a_line_nested_past_the_parser_is_not_the_protocols() -> None:
    from ddp_lab.course.grading import verdict

    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, DEEP + b'{"cell": 3}\n')
        reader = wire.LineReader(read_fd)
        assert verdict._next_message(reader, _Alive(), time.monotonic() + 10) == {"cell": 3}
        os.write(write_fd, DEEP)
        handle = RemoteLearner("00.average", open(os.devnull, "wb"), reader, lambda: None)
        with pytest.raises(RunnerGone, match="garbage"):
            handle.call(scan.findings)  # any module-level function of ddp_lab names a probe
    finally:
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap here")
def test_a_deep_line_after_a_graded_cell_leaves_its_verdict_final() -> None:
    import nbformat
    from test_grader import SOLUTION, solved

    from ddp_lab.course.grading import grader

    release = read(ROOT / "exercises" / "en" / "00_quickstart.ipynb")
    nb = solved(release, SOLUTION)
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("grade_id") == "00.average")
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(DEEP_AFTER_GRADING))
    graded = grader.grade_one(release, nb, 120, 600)
    by_id = {r.grade_id: r for r in graded.results}
    assert by_id["00.average"].status == "passed", by_id
    assert by_id["00.concepts"].status == "not-attempted", by_id
    assert leftover_processes() == []


# A cell that IPython's own transformer fails on (IndexError in its assignment-magic rule):
# the scan reads cells through that transformer, and the error killed the verdict process,
# so every exercise became "error" (a flagged cheat's finding unseen, final verdicts lost).
TRANSFORMER_BREAKER = '""""""=%\\'


def test_the_scan_reads_a_cell_ipython_cannot_transform() -> None:
    assert scan.findings(TRANSFORMER_BREAKER) == []
    assert scan.findings(TRANSFORMER_BREAKER + "\nimport sys\nsys.modules.pop('x')") == []
    assert scan.findings("%time import subprocess") == ["`import subprocess`"]


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap here")
@pytest.mark.parametrize("needed_only", [False, True], ids=["grade", "check"])
def test_a_cell_ipython_cannot_transform_leaves_the_verdicts_to_the_checker(
    needed_only: bool,
) -> None:
    """``ddp-lab grade`` (the scan) and ``ddp-lab check`` (the scan, and the cells the graded
    cells need: ``course.grading.needed`` reads cells the same way)."""
    import nbformat
    from test_grader import SOLUTION, solved

    from ddp_lab.course.grading import grader

    release = read(ROOT / "exercises" / "en" / "00_quickstart.ipynb")
    nb = solved(release, SOLUTION)
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("grade_id") == "00.average")
    nb.cells.insert(at - 1, nbformat.v4.new_code_cell(TRANSFORMER_BREAKER))
    graded = grader.grade_one(release, nb, 120, 600, needed_only=needed_only)
    by_id = {r.grade_id: r for r in graded.results}
    assert by_id["00.average"].status == "passed", by_id
    assert leftover_processes() == []


def test_scan_finds_the_grader_s_modules_pickle_hooks_and_patched_attributes() -> None:
    # Review 10's routes to a graded rank's globals, none of which the scan flagged.
    assert "`.course`" in scan.findings("ch = dl.course.grading.checks.ch07")
    assert scan.findings("from ddp_lab import course") == ["`import ddp_lab.course`"]
    assert "`cd.watch_c10d =`" in scan.findings(
        "import ddp_lab.comm_debug as cd\ncd.watch_c10d = quiet"
    )
    assert "`__reduce__`" in scan.findings(
        "class R:\n    def __reduce__(self):\n        return (arm, ())"
    )
    assert scan.findings("import copyreg") == ["`import copyreg`"]
    assert scan.findings("torch.Tensor.detach = lambda self: self") == ["`torch.Tensor.detach =`"]
    assert scan.findings("setattr(dist, 'all_reduce', f)") == ["`dist.<setattr> =`"]
    assert scan.findings("vars(mod)['x'] = 1") == ["`__dict__[...] =`"]
    # what honest code does with attributes: its own objects, and torch's settings
    honest = "torch.backends.cudnn.allow_tf32 = False\nself.w = 1\nmodel.fc.bias = None\n"
    assert scan.findings(honest + "ctx.shapes = [t.shape for t in inputs]") == []
