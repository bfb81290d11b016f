"""Tests of ``ddp-lab check`` and ``ddp-lab grade`` (ddp_lab/course/grading/: the pipeline).

The slow tests grade real submissions end to end (sandbox, runner, probes, verdict):
chapter 00's released exercise notebook with its real checker (the oracle is
dist.all_reduce), and small synthetic releases graded by the self-test checkers
(``ddp_lab.course.grading.checks.selftest``), which start no ranks.
"""

from __future__ import annotations

import copy
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_lab.course import cli
from ddp_lab.course.build import grade_pass_line
from ddp_lab.course.grading import execute, grader, intake
from ddp_lab.course.grading.needed import needed_cells
from ddp_lab.course.grading.release import locate
from ddp_lab.i18n import set_language

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "exercises" / "en" / "00_quickstart.ipynb"

SOLUTION = """\
def average_across_ranks(value: torch.Tensor) -> torch.Tensor:
    out = value.clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()
"""
# The typical mistake: all_reduce sums, and the division by the world size is forgotten.
WRONG = """\
def average_across_ranks(value: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(value)
    return value
"""


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def stub_index(nb: nbformat.NotebookNode) -> int:
    """The exercise cell that defines the learner's function (stub or solution)."""
    return next(i for i, c in enumerate(nb.cells) if "def average_across_ranks" in c.source)


def graded_index(nb: nbformat.NotebookNode) -> int:
    return next(i for i, c in enumerate(nb.cells) if "grade_id" in c.metadata)


def sliced(release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The release with only the code cells its exercise and graded cells need (and the kernel
    check): ``course.grading.needed``'s slice, what ``ddp-lab check`` runs; markdown kept.

    ``ddp-lab grade`` runs every cell of a submission, the lesson's demos too: chapter 00's
    launches cost a submission about 10 of its 32 CPU seconds here, and no attack or honest
    answer of the grading tests goes through them. The classes of those tests are built from
    this and graded against it; ``test_grade_chapter00_submissions_in_one_call`` grades the
    release as it is.
    """
    code = [i for i, c in enumerate(release.cells) if c.cell_type == "code"]
    wanted = {"grade", "exercise", "kernel-check"}
    targets = [
        k for k, i in enumerate(code) if wanted & set(release.cells[i].metadata.get("tags", []))
    ]
    kept = needed_cells([release.cells[i].source for i in code], targets)
    assert kept is not None, "the graded cells' slice of a release is known"
    keep = {code[k] for k in kept}
    nb = copy.deepcopy(release)
    nb.cells = [c for i, c in enumerate(nb.cells) if c.cell_type != "code" or i in keep]
    return nb


def sliced_release(path: Path, folder: Path) -> tuple[Path, nbformat.NotebookNode]:
    """``sliced`` of the release at ``path``, written under ``folder`` (as its file name)."""
    nb = sliced(read(path))
    return write(nb, folder / path.name), nb


def solved(release: nbformat.NotebookNode, code: str = SOLUTION) -> nbformat.NotebookNode:
    nb = copy.deepcopy(release)
    nb.cells[stub_index(nb)].source = code
    return nb


def leftover_processes(grader_pid: int | None = None) -> list[int]:
    """Processes started by the grading runs of a process (this one) that are still alive."""
    prefix = f"{execute.TOKEN_VAR}={grader_pid or os.getpid()}-".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(prefix) for v in env):
            pids.append(int(entry.name))
    return pids


def gradebook(out: Path) -> dict[tuple[str, str], tuple[int, int, str]]:
    with open(out / "gradebook.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student", "exercise", "points", "max_points", "status"]
    return {
        (r["student"], r["exercise"]): (int(r["points"]), int(r["max_points"]), r["status"])
        for r in rows
    }


def code_exercises(
    book: dict[tuple[str, str], tuple[int, int, str]],
) -> dict[tuple[str, str], tuple[int, int, str]]:
    """``book`` without the concept checks' rows (``NN.concepts``: graded on their own, see
    tests/course/test_learner_loop.py); the attacks in these tests aim at the code exercises."""
    return {k: v for k, v in book.items() if not k[1].endswith(".concepts")}


# --- synthetic releases: two exercises whose graded cells only print -----------------------


def code(source: str, cid: str, **meta: object) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source, id=cid)
    cell.metadata.update(meta)
    return cell


def graded(source: str, gid: str, points: int, line: str, cid: str) -> nbformat.NotebookNode:
    cell = code(source, cid, tags=["grade", "nbval-check-output"], grade_id=gid, points=points)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=line + "\n")]
    cell.execution_count = 1
    return cell


def synthetic_release(lang: str = "en") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["ddp_lab"] = {"lang": lang, "kind": "exercises", "title": "synthetic"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# synthetic", id="md-0"),
        code("import ddp_lab as dl", "setup"),
        code("def f():\n    raise NotImplementedError", "ex-a", tags=["exercise"]),
        graded('dl.grade("selftest.f", f)', "selftest.f", 1, "A 1", "gr-a"),
        code("def g():\n    raise NotImplementedError", "ex-b", tags=["exercise"]),
        graded('dl.grade("selftest.g", g)', "selftest.g", 2, "B 2", "gr-b"),
    ]
    return nb


def synthetic_solved() -> nbformat.NotebookNode:
    nb = synthetic_release()
    nb.cells[2].source = "def f():\n    return 1"
    nb.cells[4].source = "def g():\n    return 2"
    return nb


def tampered(nb: nbformat.NotebookNode) -> dict[str, str]:
    return locate(synthetic_release(), nb)[1]


# --- tampering, without running anything ----------------------------------------------------


def test_untouched_and_solved_notebooks_are_not_tampered() -> None:
    assert tampered(synthetic_release()) == {}
    assert tampered(synthetic_solved()) == {}
    found, bad = locate(read(RELEASE), solved(read(RELEASE)))
    assert bad == {} and list(found) == ["00.average", "00.concepts"]


def test_changed_deleted_moved_and_copied_graded_cells() -> None:
    nb = synthetic_solved()
    nb.cells[3].source = "print('A 1')"  # hard-codes the expected line
    assert tampered(nb) == {"selftest.f": "changed"}
    nb = synthetic_solved()
    del nb.cells[5]
    assert tampered(nb) == {"selftest.g": "deleted"}
    nb = synthetic_solved()
    nb.cells.insert(4, nb.cells.pop(5))  # graded B above its exercise cell
    assert tampered(nb) == {"selftest.g": "moved"}
    nb = synthetic_solved()
    nb.cells[3], nb.cells[5] = nb.cells[5], nb.cells[3]
    assert tampered(nb) == {"selftest.f": "moved", "selftest.g": "moved"}
    nb = synthetic_solved()
    nb.cells.append(copy.deepcopy(nb.cells[3]))
    assert tampered(nb) == {"selftest.f": "dup:2"}
    nb = synthetic_solved()
    # A graded cell turned into text does not run.
    nb.cells[5] = nbformat.v4.new_markdown_cell(nb.cells[5].source, metadata=nb.cells[5].metadata)
    assert tampered(nb) == {"selftest.g": "deleted"}


def test_graded_cell_found_by_its_code_when_metadata_was_dropped() -> None:
    nb = synthetic_solved()
    nb.cells[3].metadata = {}
    found, bad = locate(synthetic_release(), nb)
    assert bad == {} and found == {"selftest.f": 3, "selftest.g": 5}


@settings(max_examples=60, deadline=None)
@given(
    inserts=st.lists(st.tuples(st.integers(0, 20), st.text(max_size=30)), max_size=6),
    spaces=st.sampled_from(["", "\n", "  \n\n", " "]),
    op=st.sampled_from(["none", "change", "delete", "move", "swap"]),
    victim=st.sampled_from(["selftest.f", "selftest.g"]),
)
def test_learner_cells_and_whitespace_never_count_as_tampering(
    inserts: list[tuple[int, str]], spaces: str, op: str, victim: str
) -> None:
    nb = synthetic_solved()
    for pos, text in inserts:  # learners add their own cells anywhere
        nb.cells.insert(min(pos, len(nb.cells)), nbformat.v4.new_code_cell(text))
    for cell in nb.cells:
        if "grade_id" in cell.metadata:
            cell.source += spaces  # an editor's trailing whitespace is not tampering
    idx = {c.metadata.get("grade_id"): i for i, c in enumerate(nb.cells)}
    ex = {c.get("id"): i for i, c in enumerate(nb.cells)}
    expected = {}
    if op == "change":
        nb.cells[idx[victim]].source = "print('A 1')"
        expected = {victim: "changed"}
    elif op == "delete":
        del nb.cells[idx[victim]]
        expected = {victim: "deleted"}
    elif op == "move":  # above the exercise cell it checks
        cell = nb.cells.pop(idx[victim])
        nb.cells.insert(ex["ex-a" if victim == "selftest.f" else "ex-b"], cell)
        expected = {victim: "moved"}
    elif op == "swap":
        a, b = idx["selftest.f"], idx["selftest.g"]
        nb.cells[a], nb.cells[b] = nb.cells[b], nb.cells[a]
        expected = {"selftest.f": "moved", "selftest.g": "moved"}
    assert tampered(nb) == expected


def test_identities_come_from_the_instructors_layout(tmp_path: Path) -> None:
    for rel in [
        "alice.ipynb",
        "bob/00_quickstart.ipynb",
        "sub/alice.ipynb",
        "carol/deep/work.ipynb",
        ".ipynb_checkpoints/alice-checkpoint.ipynb",
        "bob/.ipynb_checkpoints/00_quickstart-checkpoint.ipynb",
        "notes.txt",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    subs = intake.find([str(tmp_path), str(tmp_path / "alice.ipynb")], "00_quickstart", "en")
    # The folder under the submissions folder names the student; a file directly in it, its
    # file name (the instructor's export put it there); a file named twice is one submission.
    assert [(s.identity, "/".join(s.rel), s.problem) for s in subs] == [
        ("alice", "alice.ipynb", ""),
        ("bob", "bob/00_quickstart.ipynb", ""),
        ("carol", "carol/deep/work.ipynb", ""),
        ("sub", "sub/alice.ipynb", ""),
    ]


def test_bad_arguments_fail_before_anything_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DDP_LAB_LANG", "en")  # --lang zh sets it; restored after the test
    args = ["grade", "--release", str(tmp_path / "none.ipynb"), str(tmp_path)]
    assert cli.main(args) == 2
    assert "none.ipynb" in capsys.readouterr().err
    assert cli.main(["--lang", "zh", *args]) == 2
    assert "找不到文件" in capsys.readouterr().err
    set_language("en")
    lesson = ROOT / "notebooks" / "en" / "00_quickstart.ipynb"
    assert cli.main(["grade", "--release", str(lesson), str(RELEASE)]) == 2
    assert "no graded cells" in capsys.readouterr().err
    assert cli.main(["grade", "--release", str(RELEASE), "--timeout", "0", str(RELEASE)]) == 2
    assert "--timeout must be a positive number" in capsys.readouterr().err
    assert cli.main(["check", str(tmp_path / "none.ipynb")]) == 2
    assert not (tmp_path / "gradebook.csv").exists()


# --- running notebooks ----------------------------------------------------------------------


def grade(release: Path, subs: Path, out: Path, *options: str) -> int:
    return cli.main(["grade", "--release", str(release), str(subs), "--out", str(out), *options])


def with_cell_after_setup(nb: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    """A learner's own cell right after ``dl.setup()`` (what it does happens early: fast)."""
    at = next(i for i, c in enumerate(nb.cells) if "dl.setup()" in c.source) + 1
    nb.cells.insert(at, nbformat.v4.new_code_cell(source))
    return nb


def test_synthetic_partial_tampering_and_a_kernel_crash(tmp_path: Path) -> None:
    release = write(synthetic_release(), tmp_path / "release.ipynb")
    subs = tmp_path / "subs"
    write(synthetic_solved(), subs / "alice.ipynb")
    bob = synthetic_solved()
    bob.cells[3].source = "print('A 1')"
    write(bob, subs / "bob.ipynb")
    carol = synthetic_solved()  # the kernel dies after exercise A passed
    carol.cells[4].source = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    write(carol, subs / "carol.ipynb")
    dan = synthetic_solved()
    dan.cells[4].source = "def g():\n    return 3"
    write(dan, subs / "dan.ipynb")
    (subs / "erin.ipynb").write_text("{}", encoding="utf-8")  # JSON, but not a notebook
    out = tmp_path / "out"
    start = time.monotonic()
    assert grade(release, subs, out, "--cell-timeout", "300", "--jobs", "2") == 0
    elapsed = time.monotonic() - start
    assert gradebook(out) == {
        ("alice", "selftest.f"): (1, 1, "passed"),
        ("alice", "selftest.g"): (2, 2, "passed"),
        ("bob", "selftest.f"): (0, 1, "tampered-changed"),
        ("bob", "selftest.g"): (2, 2, "passed"),
        ("carol", "selftest.f"): (1, 1, "passed"),
        ("carol", "selftest.g"): (0, 2, "kernel-died"),
        ("dan", "selftest.f"): (1, 1, "passed"),
        ("dan", "selftest.g"): (0, 2, "failed"),
        ("erin", "selftest.f"): (0, 1, "invalid"),
        ("erin", "selftest.g"): (0, 2, "invalid"),
    }
    assert elapsed < 200  # a dead kernel is noticed at once, not after the 300 s cell timeout
    assert "g() returned 3, expected 2" in (out / "feedback" / "dan.md").read_text(encoding="utf-8")
    assert "os._exit" in (out / "feedback" / "carol.md").read_text(encoding="utf-8")
    assert leftover_processes() == []


def test_total_timeout_kills_every_process_the_notebook_started(tmp_path: Path) -> None:
    release = write(synthetic_release("zh"), tmp_path / "release.ipynb")
    nb = synthetic_solved()
    nb.metadata["ddp_lab"]["lang"] = "zh"
    marker = str(10**9 + os.getpid())  # a sleep only this test starts
    # A child in its own session escapes a process-group kill; SIGALRM and SIGINT are
    # ignored, so neither the runner's cell alarm nor an interrupt stops the loop: only the
    # total timeout can.
    nb.cells[2].source += (
        "\nimport signal, subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "while True:\n    time.sleep(0.1)\n"
    )
    write(nb, tmp_path / "subs" / "eve.ipynb")
    out = tmp_path / "out"
    start = time.monotonic()
    assert grade(release, tmp_path / "subs", out, "--cell-timeout", "300", "--timeout", "20") == 0
    assert time.monotonic() - start < 60
    assert gradebook(out) == {
        ("eve", "selftest.f"): (0, 1, "timeout"),
        ("eve", "selftest.g"): (0, 2, "timeout"),
    }
    assert "20 秒内没有运行完" in (out / "feedback" / "eve.md").read_text(encoding="utf-8")
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    assert leftover_processes() == []


def test_the_sliced_release_keeps_what_grading_reads_and_drops_the_demos() -> None:
    from ddp_lab.course.grading.release import Release

    release = read(RELEASE)
    cut = sliced(release)
    ids = [e.grade_id for e in Release.of(release).exercises]
    assert [e.grade_id for e in Release.of(cut).exercises] == ids == ["00.average", "00.concepts"]
    sources = [c.source for c in cut.cells if c.cell_type == "code"]
    assert any("dl.setup()" in s for s in sources)  # what with_cell_after_setup follows
    assert not any("dl.start(" in s or "def hello(" in s for s in sources)  # the lesson's demos
    assert [c.source for c in cut.cells if c.cell_type == "markdown"] == [
        c.source for c in release.cells if c.cell_type == "markdown"
    ]


def test_grade_chapter00_submissions_in_one_call(tmp_path: Path) -> None:
    release = read(RELEASE)
    subs = tmp_path / "submissions"
    write(solved(release), subs / "correct.ipynb")
    write(solved(release, WRONG), subs / "wrong.ipynb")
    # A learner of the zh edition hard-codes the passing line (zh and en code are the same).
    nb = read(ROOT / "solutions" / "zh" / "00_quickstart.ipynb")
    nb.cells[graded_index(nb)].source = f"print({grade_pass_line('00.average', 2, 'zh')!r})"
    write(nb, subs / "changed.ipynb")
    nb = solved(release)
    del nb.cells[graded_index(nb)]
    write(nb, subs / "deleted.ipynb")
    nb = solved(release)
    nb.cells.insert(stub_index(nb), nb.cells.pop(graded_index(nb)))
    write(nb, subs / "moved.ipynb")
    # Loops forever and ignores the interrupt that nbval sends at the cell timeout.
    loop = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    write(with_cell_after_setup(solved(release), loop), subs / "runaway.ipynb")
    write(with_cell_after_setup(solved(release), "import os\nos._exit(3)"), subs / "exits.ipynb")
    (subs / "broken.ipynb").write_text('{"cells": [', encoding="utf-8")
    out = tmp_path / "out"
    assert grade(RELEASE, subs, out, "--cell-timeout", "20", "--timeout", "400", "--jobs", "2") == 0
    book = gradebook(out)
    assert {k: v for k, v in book.items() if k[1] == "00.average"} == {
        ("broken", "00.average"): (0, 2, "invalid"),
        ("changed", "00.average"): (0, 2, "tampered-changed"),
        ("correct", "00.average"): (2, 2, "passed"),
        ("deleted", "00.average"): (0, 2, "tampered-deleted"),
        ("exits", "00.average"): (0, 2, "kernel-died"),
        ("moved", "00.average"): (0, 2, "tampered-moved"),
        ("runaway", "00.average"): (0, 2, "timeout"),
        ("wrong", "00.average"): (0, 2, "failed"),
    }
    # The concept check: answered only in the solutions notebook ("changed" starts from it).
    concepts = {k[0]: v for k, v in book.items() if k[1] == "00.concepts"}
    assert concepts.pop("changed") == (2, 2, "passed")
    assert concepts.pop("broken") == (0, 2, "invalid")
    assert concepts.pop("exits") == (0, 2, "kernel-died")
    assert concepts.pop("runaway") == (0, 2, "timeout")
    # none answered: not attempted (a status of its own, not "failed")
    assert concepts == {
        n: (0, 2, "not-attempted") for n in ("correct", "deleted", "moved", "wrong")
    }
    feedback = (out / "feedback" / "wrong.md").read_text(encoding="utf-8")
    assert "FAIL 00.average" in feedback and "Hidden case 1 of 3" in feedback
    runaway = (out / "feedback" / "runaway.md").read_text(encoding="utf-8")
    # the cell that ran past its time, named by its place in the notebook and its first line
    at = [c.source for c in read(subs / "runaway.ipynb").cells].index(loop) + 1
    assert "20 s" in runaway and f"It was cell {at}, which begins `import signal`." in runaway
    assert "valid notebook" in (out / "feedback" / "broken.md").read_text(encoding="utf-8")
    assert "moved" in (out / "feedback" / "moved.md").read_text(encoding="utf-8")
    changed = (out / "feedback" / "changed.md").read_text(encoding="utf-8")
    assert "00 欢迎与快速上手" in changed and "评分单元被修改" in changed
    assert leftover_processes() == []


def test_saved_note_says_when_the_file_was_saved_in_both_languages() -> None:
    now = time.mktime((2026, 11, 25, 12, 7, 30, 0, 0, -1))  # local time, as the note shows
    note = grader.saved_note(Path("work/en/05_ring.ipynb"), now - 205, "en", now=now)
    assert note == (
        "Grading work/en/05_ring.ipynb as saved 3 min ago (12:04); unsaved edits in "
        "JupyterLab are not seen: save with Ctrl+S first."
    )
    note = grader.saved_note(Path("work/zh/05_ring.ipynb"), now - 205, "zh", now=now)
    assert "work/zh/05_ring.ipynb" in note and "3 分钟前，即 12:04" in note and "Ctrl+S" in note
    assert "12 s ago (12:07)" in grader.saved_note(Path("a"), now - 12, "en", now=now)
    assert "0 s ago" in grader.saved_note(Path("a"), now + 5, "en", now=now)  # clock skew
    assert "2 h ago (10:07)" in grader.saved_note(Path("a"), now - 7200, "en", now=now)
    days = grader.saved_note(Path("a"), now - 3 * 86400, "en", now=now)
    assert "3 d ago (2026-11-22 12:07)" in days


def test_check_solution_passes_and_says_which_save_it_graded(tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine.ipynb"  # the learner's copy, last saved 3 minutes ago
    mine.write_bytes((ROOT / "solutions" / "en" / "00_quickstart.ipynb").read_bytes())
    os.utime(mine, (time.time() - 200, time.time() - 200))
    assert cli.main(["check", str(mine)]) == 0
    out = capsys.readouterr().out
    assert "00.average: passed, 2/2" in out and "00.concepts: passed, 2/2" in out
    assert "total 4/4 points" in out
    note = out.splitlines()[0]  # said first: the learner can stop, save and check again
    assert note.startswith(f"Grading {mine} as saved 3 min ago (") and "Ctrl+S" in note, out


def test_check_unsolved_exercise_fails_in_its_language(capsys) -> None:
    assert cli.main(["check", str(ROOT / "exercises" / "zh" / "00_quickstart.ipynb")]) == 1
    out = capsys.readouterr().out
    assert "00.average: 未作答, 0/2" in out and "00.concepts: 未作答, 0/2" in out
    assert "总分 0/4" in out
    assert "NotImplementedError" in out
    assert "保存的版本" in out.splitlines()[0] and "Ctrl+S" in out.splitlines()[0], out


def test_check_compares_with_the_release_rebuilt_from_the_chapter(tmp_path: Path, capsys) -> None:
    # The learner's copy lives elsewhere and its graded cell now prints the passing line.
    nb = read(ROOT / "solutions" / "en" / "00_quickstart.ipynb")
    nb.cells[graded_index(nb)].source = f"print({grade_pass_line('00.average', 2, 'en')!r})"
    nb.cells[graded_index(nb)].outputs = []
    assert cli.main(["check", str(write(nb, tmp_path / "mine.ipynb"))]) == 1
    out = capsys.readouterr().out
    assert "00.average: graded cell changed, 0/2" in out and "copy it back" in out
    lesson = ROOT / "notebooks" / "zh" / "00_quickstart.ipynb"
    assert cli.main(["check", str(lesson)]) == 1
    assert "没有评分单元" in capsys.readouterr().err
    (tmp_path / "broken.ipynb").write_text("{", encoding="utf-8")
    assert cli.main(["check", str(tmp_path / "broken.ipynb")]) == 1
    assert "not a valid notebook" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_every_grading_run(tmp_path: Path, sig: int) -> None:
    release = write(synthetic_release(), tmp_path / "release.ipynb")
    for name in ("ann", "ben"):
        nb = synthetic_solved()
        nb.cells[2].source += "\nwhile True:\n    pass\n"
        write(nb, tmp_path / "subs" / f"{name}.ipynb")
    cmd = [
        sys.executable,
        "-m",
        "ddp_lab.course.cli",
        "grade",
        "--release",
        str(release),
        str(tmp_path / "subs"),
        "--out",
        str(tmp_path / "out"),
        "--jobs",
        "2",
    ]
    temp = Path(tempfile.gettempdir())
    folders = {*temp.glob("ddp-lab-sandbox-*"), *temp.glob("ddp-lab-verdict-*")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(leftover_processes(proc.pid)) < 2:
        time.sleep(0.5)  # wait until both notebooks run
    assert leftover_processes(proc.pid), "no grading run started within 60 s"
    time.sleep(2)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode != 0 and "KeyboardInterrupt" in out
    assert leftover_processes(proc.pid) == []
    assert not (tmp_path / "out" / "gradebook.csv").exists()
    # the verdicts were killed before their own cleanup: their sandbox folders went all the same
    assert {*temp.glob("ddp-lab-sandbox-*"), *temp.glob("ddp-lab-verdict-*")} == folders


def test_check_of_a_missing_copy_or_a_lesson_names_the_command_that_makes_the_copy(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """The lessons end with "check your work with `ddp-lab check work/en/00_...`"; a learner
    who has not run `ddp-lab exercise 00`, or who checks the lesson, is told how to get the
    copy (in the edition's language and with its --lang), not only "No such file"."""
    monkeypatch.setenv("DDP_LAB_LANG", "en")
    set_language("en")
    missing = tmp_path / "work" / "en" / "00_quickstart.ipynb"
    assert cli.main(["check", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "No such file" in err and "`ddp-lab exercise 00`" in err
    assert "work/en/00_quickstart.ipynb" in err
    lesson = ROOT / "notebooks" / "zh" / "03_data_parallel.ipynb"
    assert cli.main(["check", str(lesson)]) == 1
    err = capsys.readouterr().err
    assert "没有评分单元" in err and "`ddp-lab exercise 03 --lang zh`" in err
    assert "work/zh/03_data_parallel.ipynb" in err
    assert cli.main(["check", str(tmp_path / "mine.ipynb")]) == 2  # not a course name: no hint
    assert "ddp-lab exercise" not in capsys.readouterr().err
