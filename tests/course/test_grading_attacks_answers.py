"""Grading, round 3 (issue 41): no answer by another road, no built-in collective by another road.

A learner who reads every line of the package looks for the answer where the grader keeps it:
the reference implementation's source (read from the installed package and ``exec``'d, then
shipped by value into the ranks), the concept checks' key, the checkers' oracles. Each class
is graded in one ``ddp-lab grade`` run beside an honest submission (full points) and an
unsolved one (nothing); the package view (``course.grading.view``) is also tested directly.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_grader import grade, gradebook, leftover_processes, read, sliced_release, write

from ddp_lab.course.grading import sandbox, view

ROOT = Path(__file__).resolve().parents[2]
needs_sandbox = pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap here")


def _exercise(chapter: str) -> tuple[Path, nbformat.NotebookNode, nbformat.NotebookNode]:
    name = next(p.name for p in (ROOT / "exercises" / "en").glob(f"{chapter}_*.ipynb"))
    release = ROOT / "exercises" / "en" / name
    return release, read(release), read(ROOT / "solutions" / "en" / name)


def _with(release: nbformat.NotebookNode, marker: str, source: str) -> nbformat.NotebookNode:
    """The release with the (first) code cell that holds ``marker`` replaced by ``source``."""
    nb = copy.deepcopy(release)
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and marker in c.source)
    nb.cells[at].source = source
    return nb


def _solution_cell(solution: nbformat.NotebookNode, marker: str) -> str:
    return next(c.source for c in solution.cells if c.cell_type == "code" and marker in c.source)


# --- the package view, directly --------------------------------------------------------------

RUNNER_LOOKS = """\
import pathlib, ddp_lab
p = pathlib.Path(ddp_lab.__file__).parent
ns = {}
exec((p / "ring.py").read_text(), ns)
try:
    ns["ring_all_reduce"](None)
    print("reference")
except ImportError:
    print("stub")
print(len((p / "course" / "grading" / "checks" / "ch02.py").read_text()) < 300)
print(len((p / "course" / "grading" / "checks" / "concept_key" / "ch12.py").read_text()) < 300)
print(all(f.stat().st_size == 0 for f in (p / "__pycache__").glob("ring.*.pyc")))
from ddp_lab import ring
print(ring.chunk_bounds(10, 2) == [(0, 5), (5, 10)])
for name in (
    "course.grading.checks.concepts",
    "course.grading.checks.concept_key.ch04_07",
    "course.grading.checks.ch01",
    "course.grading.grader",
    "course.grading.judge",
):
    try:
        __import__("ddp_lab." + name)
        print("imported")
    except ImportError:
        print("hidden")
import ddp_lab.course.grading.checks.ch05, ddp_lab.course.grading.runner
print("probes")
"""
RANK_LOOKS = """\
for name in (
    "ring",
    "tensor_parallel",
    "course.grading.runner",
    "course.grading.checks.concepts",
    "course.grading.checks.concept_key.ch00_03",
):
    try:
        __import__("ddp_lab." + name)
        print("imported")
    except ImportError:
        print("hidden")
import ddp_lab.course.grading.rankhost, ddp_lab.course.grading.rankserve
import ddp_lab.course.grading.checks.probes, ddp_lab.course.grading.checks.ch10_fsdp
import ddp_lab.pipeline
print("rankhost")
"""


def _in_view(code: str, tmp_path: Path, rank: bool) -> list[str]:
    work = tmp_path / ("rank" if rank else "runner")
    work.mkdir()
    cmd, env = sandbox.wrap([sys.executable, "-c", code], work)
    cmd = view.insert(cmd, view.args(tmp_path / f"view-{rank}", rank=rank))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split()


@needs_sandbox
def test_the_package_view_has_no_answers_for_the_runner_or_the_ranks(tmp_path: Path) -> None:
    # The runner: the references stripped (the rest of each module stays for the lesson's
    # cells), the oracles, the key and the machinery hidden, the caches empty; its own
    # modules and the checkers' probes import.
    runner = _in_view(RUNNER_LOOKS, tmp_path, rank=False)
    assert runner == ["stub", "True", "True", "True", "True", *["hidden"] * 5, "probes"]
    # A rank: the reference modules and the runner hidden whole; rankhost (which imports the
    # view module), the probes and the modules the probes run import.
    assert _in_view(RANK_LOOKS, tmp_path, rank=True) == ["hidden"] * 5 + ["rankhost"]


def test_the_key_and_the_stages_are_in_the_hidden_list() -> None:
    # Every file of the concept key's package, and every stage that runs in the grader's
    # process, is hidden wherever learner code runs; a module added there must be listed.
    package = view.package_dir()
    key = {
        str(p.relative_to(package))
        for p in (package / "course/grading/checks/concept_key").glob("*.py")
    }
    assert key and key <= set(view.HIDDEN) and key <= set(view.RANK_HIDDEN)
    stages = {
        f"course/grading/{m}.py" for m in ("grader", "release", "execute", "judge", "feedback")
    }
    assert stages <= set(view.HIDDEN)
    for rel in view.HIDDEN:
        assert (package / rel).is_file(), rel  # a moved module's old path would hide nothing


def test_the_stripped_module_keeps_everything_but_the_answers() -> None:
    source = (view.package_dir() / "ring.py").read_text(encoding="utf-8")
    text = view.stripped(source, view.REFERENCES["ring.py"], "ddp_lab.ring")
    ns: dict = {}
    exec(compile(text, "ring.py", "exec"), ns)  # noqa: S102  # the grader's own module
    assert ns["chunk_bounds"](10, 2) == [(0, 5), (5, 10)]
    with pytest.raises(ImportError, match="not available while grading"):
        ns["ring_all_reduce"](None)
    assert "segment_bytes" not in text.split("def ring_all_reduce", 1)[1].split("\ndef ", 1)[0]
    for rel, names in view.REFERENCES.items():  # every answer named is where it is said to be
        tree = (view.package_dir() / rel).read_text(encoding="utf-8")
        for name in names:
            assert f"def {name}(" in tree or f"class {name}(" in tree or f"class {name}:" in tree


# --- the answer by another road, in a graded class ---------------------------------------------

# The reference's source read from the installed package (no import of it, names built at run
# time) and exec'd; cloudpickle ships the function by value into the ranks.
EXEC_REFERENCE = """\
import pathlib
import ddp_lab
_ns = {}
_src = pathlib.Path(ddp_lab.__file__).parent.joinpath("ri" + "ng.py").read_text()
exec(_src, _ns)
ring_all_reduce = _ns["ring_" + "all_reduce"]
"""


@needs_sandbox
def test_chapter_05_the_reference_read_and_execd_earns_nothing(chapter05_class) -> None:
    # graded_classes.py: the chapter-05 class, the attacks below in place of the ring's cell.
    graded = chapter05_class
    book = graded.book
    assert book[("honest", "05.ring")] == (5, 5, "passed")
    assert book[("unsolved", "05.ring")][0] == 0
    attacks = ("exec_reference", "magic_import", "group_method", "backwards_group")
    got = graded.rows(*attacks, exercise="05.ring")
    assert all(points == 0 for points, _, _ in got.values()), got
    # The scan reads the magic as IPython runs it, and sees the exec.
    assert got["magic_import"][2] == "flagged", got
    assert got["exec_reference"][2] == "flagged", got
    for name in ("group_method", "backwards_group"):  # locked in the rank, whatever the road
        feedback = graded.feedback(name)  # the lock names the collective, not the road
        assert "called dist.all_reduce: build it from" in feedback, feedback
    assert graded.leftovers == [] and leftover_processes() == []


# gloo's own all-reduce, through the process group's method (the guards wrap dist.* only).
GROUP_METHOD = """\
def ring_all_reduce(tensor):
    dist.group.WORLD.allreduce([tensor]).wait()
    return tensor
"""
# gloo's own all-reduce on a new group whose ranks are numbered backwards: it sends exactly
# an honest ring's bytes to the right neighbour.
BACKWARDS_GROUP = """\
import torch.distributed as _d
_groups = {}
def ring_all_reduce(tensor):
    n = _d.get_world_size()
    if n not in _groups:
        _groups[n] = _d.new_group(list(reversed(range(n))))
    _groups[n].allreduce([tensor]).wait()
    return tensor
"""
WORLD_ALL_REDUCE = """\
def reduce_broadcast_all_reduce(tensor):
    dist.group.WORLD.allreduce([tensor]).wait()
    return tensor
"""
WORLD_ALL_GATHER = """\
def send_recv_all_gather(tensor_list, tensor):
    dist.group.WORLD.allgather([tensor_list], [tensor]).wait()
"""


@needs_sandbox
def test_chapter_04_process_group_methods_are_not_a_way_around(tmp_path: Path) -> None:
    released, _, solution = _exercise("04")
    path, release = sliced_release(released, tmp_path / "release")
    reduce_, gather = "def reduce_broadcast_all_reduce", "def send_recv_all_gather"
    honest = _with(release, reduce_, _solution_cell(solution, reduce_))
    honest = _with(honest, gather, _solution_cell(solution, gather))
    subs = tmp_path / "subs"
    write(honest, subs / "honest.ipynb")
    write(release, subs / "unsolved.ipynb")
    attack = _with(_with(release, reduce_, WORLD_ALL_REDUCE), gather, WORLD_ALL_GATHER)
    write(attack, subs / "pg.ipynb")
    out = tmp_path / "out"
    assert grade(path, subs, out, "--cell-timeout", "120", "--jobs", "2") == 0
    book = gradebook(out)
    for exercise in ("04.all_reduce", "04.all_gather"):
        assert book[("honest", exercise)][2] == "passed", book
        assert book[("honest", exercise)][0] == book[("honest", exercise)][1] > 0
        assert book[("unsolved", exercise)][0] == 0
        assert book[("pg", exercise)][0] == 0, book
    assert leftover_processes() == []


# The concept checks' key, read in the learner's own cell: dl.quiz loads its module, which is
# then taken from sys.modules by a name built at run time (nothing the scan looks for).
KEY_READER = """\
import sys
my_answers = {}
dl.quiz("00", my_answers)
_key = sys.modules["ddp_lab.cour" + "se.grading.checks.concepts"]
my_answers = {i: q.key for i, q in enumerate(_key.QUIZZES["00"], 1)}
"""


@needs_sandbox
def test_chapter_00_the_concept_key_is_not_within_reach(chapter00_class) -> None:
    # graded_classes.py: "concepts" is the release with the solution's answers, "key_reader" with
    # KEY_READER in their place, "unsolved" the release.
    graded = chapter00_class
    book = graded.rows("concepts", "unsolved", "key_reader", exercise="00.concepts")
    assert book["concepts"] == (2, 2, "passed")
    assert book["unsolved"][0] == 0
    assert book["key_reader"][0] == 0, book
    assert graded.leftovers == [] and leftover_processes() == []


# --- built-in collectives, locked in a hand-written-collective rank -----------------------------

LOCKED_RANK = """\
import sys
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from ddp_lab.course.grading.checks import lockdown

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
lockdown.lock(frozenset(sys.argv[3].split(",")) - {""})
t = torch.ones(4)
roads = {
    "dist.all_reduce": lambda: dist.all_reduce(t),
    "dist.broadcast": lambda: dist.broadcast(t, 0),
    "dist.all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(8), t),
    "WORLD.allreduce": lambda: dist.group.WORLD.allreduce([t]).wait(),
    "WORLD.allgather": lambda: dist.group.WORLD.allgather([[t, t.clone()]], [t]).wait(),
    "backwards_group": lambda: dist.all_reduce(t, group=dist.new_group([1, 0])),
    "functional": lambda: funcol.all_reduce(t, "sum", dist.group.WORLD).wait(),
    "backend": lambda: dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([t]).wait(),
}
for name, road in roads.items():
    try:
        road()
        print(name, "ran")
    except lockdown.Forbidden:
        print(name, "forbidden")
    except Exception as exc:
        print(name, type(exc).__name__, str(exc)[:200].replace(" ", "_"))
if rank == 0:  # what a hand-written collective is built from still works
    dist.send(torch.full((2,), 7.0), 1)
else:
    got = torch.zeros(2)
    dist.recv(got, 0)
    print("p2p", got.tolist() == [7.0, 7.0])
dist.barrier()
print("barrier", "ok")
"""


def _locked_world(tmp_path: Path, allowed: str) -> list[dict[str, str]]:
    script = tmp_path / "rank.py"
    script.write_text(LOCKED_RANK, encoding="utf-8")
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(store), allowed],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},  # this package, not an installed one
        )
        for rank in range(2)
    ]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, out + err
            outs.append(dict(line.split(" ", 1) for line in out.splitlines()))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return outs


def test_no_built_in_collective_whatever_the_road(tmp_path: Path) -> None:
    ranks = _locked_world(tmp_path, "")  # 05.ring, 04.all_gather: send/recv only
    for got in ranks:
        roads = {k: v for k, v in got.items() if k not in ("p2p", "barrier")}
        assert len(roads) == 8 and set(roads.values()) == {"forbidden"}, got
        assert got["barrier"] == "ok", got
    assert ranks[1]["p2p"] == "True", ranks


def test_the_lock_leaves_what_the_exercise_allows(tmp_path: Path) -> None:
    for got in _locked_world(tmp_path, "broadcast_"):  # 04.all_reduce: reduce + broadcast
        assert got["dist.broadcast"] == "ran", got
        assert got["dist.all_reduce"] == got["WORLD.allreduce"] == "forbidden", got


# --- the scan reads cells as IPython runs them -------------------------------------------------

# An import the old scan never read (it blanked every line that starts with % or !).
MAGIC_IMPORT = """\
%time from ddp_lab.ring import ring_all_reduce as _theirs
def ring_all_reduce(tensor):
    return _theirs(tensor)
"""


def test_the_scan_reads_magics_as_ipython_runs_them() -> None:
    from ddp_lab.course.grading import scan

    assert scan.findings(MAGIC_IMPORT)
    assert scan.findings("%%time\nfrom ddp_lab.zero import ShardedOptimizer\n")
    assert scan.findings("%time %time import ddp_lab.fsdp")
    assert scan.findings("%load some_file.py")
    assert scan.findings("!cat somewhere")
    assert scan.findings(EXEC_REFERENCE)
    assert scan.findings("import importlib\nm = importlib.import_module('x')")
    assert scan.findings("import ddp_lab\nopen(ddp_lab.__file__).read()")
    assert scan.findings("import builtins\nbuiltins.exec('x = 1')")
    assert scan.findings("f = compile('x = 1', 'x', 'exec')")
    # A transformer rewrites every later cell before it runs: the scan would read one code and
    # the runner run another (here `from ddp_lab.rung import ...` would become `.ring`).
    rewrite = "lambda lines: [line.replace('rung', 'ring') for line in lines]"
    assert scan.findings(f"get_ipython().input_transformers_post.append({rewrite})")
    assert scan.findings(f"ip = get_ipython()\nip.input_transformers_cleanup.insert(0, {rewrite})")
    assert scan.findings("get_ipython().ast_transformers.append(Rewrite())")
    assert scan.findings("getattr(get_ipython(), 'ast_transformers').append(Rewrite())")
    # What honest cells do is not flagged.
    assert scan.findings("%time x = sum(range(10))") == []
    assert scan.findings("%%ddp -n 2\nprint(rank)") == []
    assert scan.findings("with open('data.txt') as f:\n    f.read()") == []
    assert scan.findings("import re\npattern = re.compile('a+')") == []
    assert scan.findings("import torch\nmodel = torch.compile(torch.nn.Linear(2, 2))") == []


# 08.fit's probe runs in the runner, which imports the checker's module for it: the oracle
# that module held (torch's DDP used correctly, with fit's very signature) was one attribute
# path away, with no import and no string the scan reads.
FIT_FROM_THE_ORACLE = """\
import ddp_lab
import torch
import torch.distributed as dist


def fit(model, dataset, epochs, batch_size, lr, checkpoint_path):
    checks = ddp_lab.course.grading.checks
    oracle = getattr(checks, "ch08_oracle", checks.ch08).reference_fit
    losses, _ = oracle(model, dataset, epochs, batch_size, lr)
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), checkpoint_path)
    dist.barrier()
    return losses
"""


@needs_sandbox
def test_chapter_08_the_checkers_oracle_is_not_within_reach() -> None:
    from ddp_lab.course.grading import grader

    _, release, solution = _exercise("08")
    marker = "def fit(model"
    for source, passes in ((_solution_cell(solution, marker), True), (FIT_FROM_THE_ORACLE, False)):
        graded = grader.grade_one(release, _with(release, marker, source), 120, 600,
                                  needed_only=True)  # fmt: skip
        (fit,) = [r for r in graded.results if r.grade_id == "08.fit"]
        assert (fit.status == "passed") is passes, fit
        assert (fit.points == fit.max_points) is passes, fit
        if not passes:
            assert "no attribute 'reference_fit'" in fit.detail, fit
    assert leftover_processes() == []
    # The folder 08.fit's ranks shared (ranknet.make_share) went with them: this file runs
    # alone (test.sh's phase 1), so no other grading of 08.fit has one meanwhile.
    assert sorted(Path("/dev/shm").glob("ddp-lab-share-*")) == []
