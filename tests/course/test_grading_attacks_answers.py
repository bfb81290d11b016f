"""Grading, round 3 (issue 41): no answer by another road.

A learner who reads every line of the package looks for the answer where the grader keeps it:
the reference implementation's source (read from the installed package and ``exec``'d, then
shipped by value into the ranks), the concept checks' key, the checkers' oracles. Each class
is graded in one ``ddp-lab grade`` run beside an honest submission (full points) and an
unsolved one (nothing); the package view (``course.grading.view``) is also tested directly.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_grader import grade, gradebook, leftover_processes, read, write

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
print(all(f.stat().st_size == 0 for f in (p / "__pycache__").glob("ring.*.pyc")))
from ddp_lab import ring
print(ring.chunk_bounds(10, 2) == [(0, 5), (5, 10)])
for name in ("course.grading.checks.concepts", "course.grading.checks.ch01", "course.grading.grader"):
    try:
        __import__("ddp_lab." + name)
        print("imported")
    except ImportError:
        print("hidden")
import ddp_lab.course.grading.checks.ch05, ddp_lab.course.grading.runner
print("probes")
"""
RANK_LOOKS = """\
for name in ("ring", "tensor_parallel", "course.grading.runner", "course.grading.checks.concepts"):
    try:
        __import__("ddp_lab." + name)
        print("imported")
    except ImportError:
        print("hidden")
import ddp_lab.course.grading.rankhost, ddp_lab.course.grading.checks.probes, ddp_lab.pipeline
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
    assert runner == ["stub", "True", "True", "True", "hidden", "hidden", "hidden", "probes"]
    # A rank: the reference modules and the runner hidden whole; rankhost (which imports the
    # view module), the probes and the modules the probes run import.
    assert _in_view(RANK_LOOKS, tmp_path, rank=True) == ["hidden"] * 4 + ["rankhost"]


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
def test_chapter_05_the_reference_read_and_execd_earns_nothing(tmp_path: Path) -> None:
    path, release, solution = _exercise("05")
    marker = "def ring_all_reduce"
    subs = tmp_path / "subs"
    write(_with(release, marker, _solution_cell(solution, marker)), subs / "honest.ipynb")
    write(release, subs / "unsolved.ipynb")
    attacks = {"exec_reference": EXEC_REFERENCE}
    for name, source in attacks.items():
        write(_with(release, marker, source), subs / f"{name}.ipynb")
    out = tmp_path / "out"
    assert grade(path, subs, out, "--cell-timeout", "120", "--jobs", "2") == 0
    book = gradebook(out)
    assert book[("honest", "05.ring")] == (5, 5, "passed")
    assert book[("unsolved", "05.ring")][0] == 0
    got = {name: book[(name, "05.ring")] for name in attacks}
    assert all(points == 0 for points, _, _ in got.values()), got
    assert leftover_processes() == []


# The concept checks' key, imported in the learner's own cell.
KEY_READER = """\
from ddp_lab.course.grading.checks import concepts
my_answers = {i: q.key for i, q in enumerate(concepts.QUIZZES["00"], 1)}
"""


@needs_sandbox
def test_chapter_00_the_concept_key_is_not_within_reach(tmp_path: Path) -> None:
    path, release, solution = _exercise("00")
    marker = "my_answers = {"
    subs = tmp_path / "subs"
    write(_with(release, marker, _solution_cell(solution, marker)), subs / "honest.ipynb")
    write(release, subs / "unsolved.ipynb")
    write(_with(release, marker, KEY_READER), subs / "key_reader.ipynb")
    out = tmp_path / "out"
    assert grade(path, subs, out, "--cell-timeout", "120", "--jobs", "2") == 0
    book = gradebook(out)
    assert book[("honest", "00.concepts")] == (2, 2, "passed")
    assert book[("unsolved", "00.concepts")][0] == 0
    assert book[("key_reader", "00.concepts")][0] == 0, book
    assert leftover_processes() == []
