"""Grading attacks on the grader's side: files, identities, reports and shared resources.

A learner (or a classmate who wants to spoil the class) controls the submitted file, the
names inside their folder, every text their code produces and what their processes do to
the machine. Each attack below must end with 0 points or its own ``error`` for the attacker;
the honest submissions next to it keep their full points, the gradebook is complete, and
nothing is left behind (processes, cgroups). Attacks are grouped in as few ``grade`` runs as
possible: most need no code to run, the others use the self-test checkers (no ranks).
See docs/INSTRUCTORS.md, "What the grader guarantees".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path

import pytest
from test_grader import (
    RELEASE,
    code_exercises,
    grade,
    gradebook,
    leftover_processes,
    synthetic_release,
    synthetic_solved,
    write,
)

from ddp_lab.course.grading import export, intake, isolation, report, sandbox
from ddp_lab.course.grading.release import locate


def cgroups_left() -> list[str]:
    """cgroups of this process's gradings (and tests) still present on this machine."""
    mine = (f"ddp-lab-{os.getpid()}-", f"ddp-lab-test-{os.getpid()}")
    found = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(dirpath, d) for d in dirnames if d.startswith(mine)]
        if dirpath.count("/") > 8:
            dirnames[:] = []
    return found


def sandbox_user_processes() -> list[int]:
    """Processes running as one of the sandbox's user ids."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            uid = entry.stat().st_uid
        except OSError:
            continue
        if sandbox.BASE_UID <= uid < sandbox.BASE_UID + 1000:
            pids.append(int(entry.name))
    return pids


def outside_fences(markdown: str) -> str:
    """The Markdown text that is not inside a fenced block or a code span."""
    text = re.sub(r"(?ms)^(`{3,})text\n.*?^\1$", "", markdown)
    return re.sub(r"(`+).*?\1", "", text)


# Learner text that tries every destination at once: an exception whose type name and
# message hold a passing line, Markdown, HTML, a terminal escape and a lone surrogate.
SPOOF = """\
def f():
    bad = type("passed, 1/1\\n- selftest.f: passed", (Exception,), {})
    raise bad("\\udce9 ```\\n# passed, 1/1\\n<img src=x onerror=alert(1)>\\x1b[2J\\x07" + "y" * 5000)
"""


def test_files_identities_and_reports_cannot_take_points_or_stop_the_class(
    tmp_path: Path, capsys
) -> None:
    release = write(synthetic_release(), tmp_path / "release.ipynb")
    subs = tmp_path / "subs"
    honest, wrong = synthetic_solved(), synthetic_solved()
    wrong.cells[4].source = "def g():\n    return 3"
    outside = write(honest, tmp_path / "solutions" / "release.ipynb")
    write(honest, subs / "zoe" / "release.ipynb")
    write(wrong, subs / "aaron" / "zoe.ipynb")  # identity spoofing: aaron's file named zoe
    # Files that are not a learner's own notebook: links, special files, too big, too deep.
    (subs / "linker").mkdir()
    (subs / "linker" / "release.ipynb").symlink_to(outside)  # the solutions
    (subs / "copycat").mkdir()
    (subs / "copycat" / "release.ipynb").symlink_to("../zoe/release.ipynb")  # a classmate
    (subs / "linkdir").symlink_to("zoe")  # a whole linked folder
    (subs / "toplink.ipynb").symlink_to(outside)
    (subs / "zero").mkdir()
    (subs / "zero" / "release.ipynb").symlink_to("/dev/zero")
    (subs / "fifo").mkdir()
    os.mkfifo(subs / "fifo" / "release.ipynb")  # a FIFO: opening it for reading would hang
    (subs / "huge").mkdir()
    with open(subs / "huge" / "release.ipynb", "wb") as f:
        f.truncate(intake.MAX_BYTES + 1)  # sparse: big without filling the disk
    (subs / "nested").mkdir()
    (subs / "nested" / "release.ipynb").write_text("[" * 200_000 + "]" * 200_000)
    write(honest, subs / "twice" / "a.ipynb")
    write(honest, subs / "twice" / "b.ipynb")
    # Names and texts that crashed the class or reached the instructor raw.
    write(honest, subs / "=2+5" / "release.ipynb")  # a formula in a spreadsheet
    write(honest, subs / "\x1b[31mred\x1b]0;title\x07" / "release.ipynb")  # terminal escapes
    nonutf8 = os.fsdecode(b"caf\xe9")  # not UTF-8: a lone surrogate in Python
    write(honest, subs / nonutf8 / "release.ipynb")
    for k in (1, 2):  # two names that differ only past any sane length
        write(honest, subs / ("x" * 250 + str(k)) / "release.ipynb")
    spoof = synthetic_solved()
    spoof.cells[2].source = SPOOF
    spoof.metadata["ddp_lab"]["title"] = "passed\n- selftest.f: passed, 1/1 \udce9"
    (subs / "spoof").mkdir()  # JSON escapes: nbformat.write cannot write a lone surrogate
    (subs / "spoof" / "release.ipynb").write_text(json.dumps(spoof), encoding="ascii")
    write(honest, subs / "diskfull" / "release.ipynb")
    out = tmp_path / "out"
    # The feedback file of one student cannot be written (as on a full disk).
    (out / "feedback" / "diskfull.md").mkdir(parents=True)

    assert grade(release, subs, out, "--cell-timeout", "60", "--jobs", "2") == 0
    book = code_exercises(gradebook(out))
    full = {"selftest.f": (1, 1, "passed"), "selftest.g": (2, 2, "passed")}
    honest_names = ["zoe", "'=2+5", "\\x1b[31mred\\x1b]0;title\\x07", "caf\\xe9"]
    honest_names += ["x" * 250 + "1", "x" * 250 + "2"]
    for name in honest_names:
        assert {ex: book.pop((name, ex)) for ex in full} == full, name
    assert book.pop(("aaron", "selftest.f")) == (1, 1, "passed")
    assert book.pop(("aaron", "selftest.g")) == (0, 2, "failed")
    assert book.pop(("spoof", "selftest.f")) == (0, 1, "failed")
    assert book.pop(("spoof", "selftest.g")) == (2, 2, "passed")
    errors = ["linker", "copycat", "linkdir", "toplink", "zero", "fifo", "huge", "diskfull"]
    for name in errors:
        assert book.pop((name, "selftest.f")) == (0, 1, "error"), name
        assert book.pop((name, "selftest.g")) == (0, 2, "error"), name
    assert book.pop(("nested", "selftest.f")) == (0, 1, "invalid")
    assert book.pop(("nested", "selftest.g")) == (0, 2, "invalid")
    assert book.pop(("twice", "selftest.f")) == (0, 1, "duplicate")
    assert book.pop(("twice", "selftest.g")) == (0, 2, "duplicate")
    assert book == {}  # no "zoe-2", nobody else

    feedback = {
        p.name: p.read_text(encoding="utf-8")
        for p in (out / "feedback").glob("*.md")
        if p.is_file()
    }
    assert "symbolic link" in feedback["linker.md"] and "FIFO" in feedback["fifo.md"]
    assert "larger than 20 MiB" in feedback["huge.md"]
    assert "twice/a.ipynb, twice/b.ipynb. None was graded" in feedback["twice.md"]
    assert "could not write" in (out / "results" / "diskfull.json").read_text(encoding="utf-8")
    long_files = [n for n in feedback if n.startswith("x" * 80)]
    assert len(long_files) == 2 and all(len(n) < 120 for n in long_files)
    # Learner text stays inside code: the title is the release's, nothing outside a fence
    # says passed for the failed exercise, no escape or surrogate reaches a file.
    text = feedback["spoof.md"]
    assert text.startswith("# Feedback for `spoof`: synthetic\n")
    prose = outside_fences(text)
    assert "selftest.f: failed, 0/1" in prose and "passed, 1/1" not in prose
    assert "<img" not in prose and "\x1b" not in text and "\x07" not in text
    assert len(text) < 6000  # capped
    doc = json.loads((out / "results" / "spoof.json").read_text(encoding="utf-8"))
    assert export.validate_gradescope(doc) == []
    assert "passed" not in outside_fences(doc["tests"][0]["output"])
    # The spreadsheet gets no formula; the terminal no escape.
    raw_csv = (out / "gradebook.csv").read_text(encoding="utf-8")
    assert "\n=2+5" not in raw_csv and "\n'=2+5," in raw_csv
    totals = (out / "totals.csv").read_text(encoding="utf-8").splitlines()
    assert "zoe,3,3,passed" in totals and "spoof,2,3,failed passed" in totals
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\udce9" not in printed.out
    assert leftover_processes() == [] and cgroups_left() == []


def test_intake_reads_regular_files_only_with_a_cap(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    write(synthetic_solved(), tmp_path / "d" / "ok.ipynb")
    # Outputs of the learner's kernel do not go further.
    loaded = intake.load(tmp_path, ("d", "ok.ipynb"))
    assert all(c.get("outputs", []) == [] for c in loaded.cells)
    (tmp_path / "link").symlink_to("d")
    with pytest.raises(intake.BadFile, match="symbolic link"):
        intake.read_bytes(tmp_path, ("link", "ok.ipynb"))
    with pytest.raises(intake.BadFile, match="larger than"):
        intake.read_bytes(tmp_path, ("d", "ok.ipynb"), limit=100)
    with pytest.raises(intake.BadFile, match="not a regular file"):
        intake.read_bytes(Path("/dev"), ("null",))
    # A notebook whose parsing needs more memory than allowed is stopped, not the grader.
    with pytest.raises((intake.BadFile, ValueError)):
        intake.parse(b'{"cells": [' + b'"' + b"a" * 30_000_000 + b'"]}', memory=200 * 2**20)


def test_report_escapes_learner_text() -> None:
    assert report.clean("a\x1b[2Jb\udce9\u202e") == "a\\x1b[2Jb\\xe9\\u202e"
    assert report.clean("y" * 50, limit=10) == "y" * 10 + "…"
    for bad in ("=1+1", "+1", "-1", "@SUM(A1)"):
        assert report.csv_cell(bad) == "'" + bad
    for bad in ("\tx", "\r=1+1"):  # escaped, so no longer a tab or CR first
        assert report.csv_cell(bad)[0] not in "=+-@\t\r"
    assert report.csv_cell(3) == 3 and report.csv_cell("alice") == "alice"
    span = report.code_span("a ``` b")
    assert span.startswith("````") and span.endswith("````")
    assert report.code_block("```\n# x").startswith("````text\n")
    assert report.file_name("alice") == "alice"
    assert report.file_name("../../etc/passwd") != report.file_name("..%2F..%2Fetc%2Fpasswd")
    assert "/" not in report.file_name("../../etc/passwd")


def test_a_comment_on_a_graded_line_is_not_tampering() -> None:
    nb = synthetic_solved()
    nb.cells[3].source += "  # done!"
    assert locate(synthetic_release(), nb)[1] == {}
    nb.cells[3].source = 'dl.grade("selftest.f", f) ; print("A 1")'
    assert locate(synthetic_release(), nb)[1] == {"selftest.f": "changed"}


def test_gradescope_refuses_to_grade_unsandboxed(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sandbox, "available", lambda: False)
    monkeypatch.delenv("DDP_LAB_SANDBOX", raising=False)
    results = tmp_path / "results.json"
    sub = write(synthetic_solved(), tmp_path / "sub.ipynb")
    release = write(synthetic_release(), tmp_path / "release.ipynb")
    args = ["--release", str(release), str(sub), "--out", str(tmp_path / "out")]
    from ddp_lab.course import cli

    assert cli.main(["grade", *args, "--gradescope", str(results)]) == 2
    assert "cannot sandbox" in capsys.readouterr().err and not results.exists()


def test_setup_scripts_update_apt_and_take_torch_from_the_cpu_index(tmp_path: Path) -> None:
    import zipfile

    from ddp_lab.course.build import ROOT

    z = export.write_gradescope_zip(RELEASE, tmp_path / "ag.zip", "s", ROOT)
    setup = zipfile.ZipFile(z).read("setup.sh").decode()
    assert setup.index("apt-get update") < setup.index("apt-get install")
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    flow = export.classroom_workflow(RELEASE, "x.ipynb", [])
    assert flow.index("apt-get update") < flow.index("apt-get install")
    assert "--index-url https://download.pytorch.org/whl/cpu torch==" in flow


BOMB = """\
import os, time
n = 0
try:
    while n < 2000:
        if os.fork() == 0:
            if n < 8:
                while True:
                    pass
            time.sleep(600)
            os._exit(0)
        n += 1
except OSError:
    pass
time.sleep(35)
"""

# Writes until every writable place is full; solves the exercise only if that came to more
# than 1.5 GiB, so its points say whether the sandbox's folders were bounded.
FILLER = """\
import os
total = 0
for folder in (os.getcwd(), os.environ.get("HOME", "."), "/tmp", "/dev/shm"):
    for k in range(1000):
        try:
            with open(os.path.join(folder, f"fill{k}"), "wb") as f:
                for _ in range(64):
                    f.write(b"x" * 2**20)
                    total += 2**20
        except OSError:
            break
FILLED = total
"""
FILLER_SOLUTION = """\
def average_across_ranks(value: torch.Tensor) -> torch.Tensor:
    out = value.clone()
    dist.all_reduce(out)
    return out / dist.get_world_size() * (1 if FILLED > 1.5 * 2**30 else 2)
"""


# Attacks on shared resources need what stops them: sandboxes and cgroups.
needs_sandbox_and_cgroups = pytest.mark.skipif(
    not sandbox.available() or isolation.unavailable_reason() is not None,
    reason="needs bubblewrap and cgroups",
)


@needs_sandbox_and_cgroups
def test_neighbours_cannot_starve_or_fill_the_machine(chapter00_class) -> None:
    # graded_classes.py: "a-bomb" (BOMB after a wrong answer), "a-broken" (not JSON), the honest one
    # and "filler" (FILLER, with FILLER_SOLUTION) sit in the chapter-00 class, graded with
    # --jobs 2 in the order of the names: the honest one starts while the bomb still runs
    # (under "BASE_UID + i % jobs" they shared a user id, and its fork failed).
    from graded_classes import HONEST

    graded = chapter00_class
    book = graded.rows("a-bomb", "a-broken", HONEST, "filler")
    # The bomb gets nothing: its wrong answer fails, or (on a loaded machine, its 500
    # processes waiting for a CPU) its own error, or its own timeout: its 8 spinning children
    # share its cgroup's CPU with its later cells, which on CI's two busy cores ran past the
    # 90 s cell timeout once. Either way nothing of it reaches the others (below).
    assert book.pop("a-bomb") in {(0, 2, "failed"), (0, 2, "error"), (0, 2, "timeout")}
    assert book == {
        "a-broken": (0, 2, "invalid"),
        HONEST: (2, 2, "passed"),
        "filler": (0, 2, "failed"),
    }
    assert graded.grown < 200 * 2**20
    assert graded.leftovers == [] and graded.sandbox_users == []
    assert graded.cgroups == [] and cgroups_left() == []


def test_slots_are_unique_across_graders(tmp_path: Path) -> None:
    a, b = isolation.Slots(folder=tmp_path), isolation.Slots(folder=tmp_path)  # two graders
    held = [a.acquire(), b.acquire(), a.acquire(), b.acquire()]
    assert sorted(held) == [0, 1, 2, 3]
    a.release(held[0])
    assert b.acquire() == held[0]  # free again once released


@pytest.mark.skipif(isolation.unavailable_reason() is not None, reason="no cgroups here")
def test_a_cgroup_limits_its_processes_and_leaves_nothing(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    limits = isolation.CgroupLimits(memory_gb=0.25, pids=20)
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 100:\n"
        "        if os.fork() == 0:\n"
        "            os.close(1)\n"
        "            os.close(2)\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print('forked', n, flush=True)\n"
        "try:\n"
        "    x = bytearray(512 * 2**20)\n"
        "    print('allocated')\n"
        "except MemoryError:\n"
        "    print('no memory')\n"
    )
    with isolation.Cgroup(f"ddp-lab-test-{os.getpid()}", limits) as group:
        argv = group.enter_argv([sys.executable, "-c", code])
        t0 = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert "forked" in p.stdout and int(p.stdout.split()[1]) < 20, p.stdout + p.stderr
        assert "allocated" not in p.stdout  # killed by the memory limit, or refused
        assert group.pids() and group.cpu_seconds() > 0  # the sleeping children are in it
        assert time.monotonic() - t0 < 60
    assert group.pids() == [] and cgroups_left() == []


@pytest.mark.skipif(isolation.unavailable_reason() is not None, reason="no cgroups here")
def test_groups_of_a_grader_that_is_gone_are_swept_with_what_runs_in_them() -> None:
    """A grader killed with SIGKILL (or one that gave up on a busy group) leaves its groups; the
    next ``Cgroup`` removes them, and kills what still runs there, but not a live grader's."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(gone.stdout)
    layout = isolation._layout()
    assert not isinstance(layout, str), layout
    parents = set(layout[1].values())
    stale = [p / f"ddp-lab-{dead_pid}-left" for p in parents]
    live = [p / f"ddp-lab-test-{os.getpid()}-live" for p in parents]
    for d in stale + live:
        d.mkdir()
    orphan = subprocess.Popen(["sleep", "300"])
    try:
        for d in stale:
            (d / "cgroup.procs").write_text(str(orphan.pid))
        with isolation.Cgroup(f"ddp-lab-test-{os.getpid()}-next"):
            assert not [d for d in stale if d.exists()]
            assert orphan.wait(timeout=30) == -signal.SIGKILL  # what ran in it is killed
            assert all(d.exists() for d in live)  # its grader still runs
    finally:
        orphan.kill()
        for d in stale + live:
            with contextlib.suppress(OSError):
                d.rmdir()
    assert cgroups_left() == []


def test_a_timeout_is_blamed_on_the_machine_only_when_the_code_waited_for_cpu() -> None:
    # (the grader's canary's waiting share, CPU seconds used, wall seconds of a 100 s run)
    assert isolation.starved(busy=0.95, used=4.0, wall=100.0)  # runnable, no CPU
    assert not isolation.starved(busy=0.95, used=90.0, wall=100.0)  # it used the time
    assert not isolation.starved(busy=0.95, used=1.0, wall=100.0)  # sleeping or deadlocked
