"""The classes that several grading test files assert on, each graded once per session.

Each submission that ``ddp-lab grade`` runs costs a sandbox, a runner that imports torch and
ranks that start in sandboxes of their own: seconds of CPU each, however small the notebook.
The attack tests (``test_grading_a_whole_class.py``, ``test_grading_attacks.py``,
``test_grading_attacks_intake.py``, ``test_grading_attacks_verdict.py``,
``test_grading_attacks_answers.py``, ``test_grading_status.py``) used to grade a class each,
with the same honest, wrong and unsolved work in most of them. Here every chapter-00
submission they need sits in one class (``grade_chapter00``), and every chapter-05 one in
another (``grade_chapter05``), each graded in one ``ddp-lab grade`` run with ``--jobs 2`` (as
an instructor meets them: the attacks next to one another and to honest work); each test
asserts on its own students in the shared result (the session fixtures ``chapter00_class``
and ``chapter05_class`` of tests/conftest.py).

Each submission still gets a sandbox, a verdict process and ranks of its own: sharing the run
shares nothing between the submissions that grading does not share in a real class.

Both classes are graded against their release without the lesson's demos
(``test_grader.sliced``: the cells the graded cells need); no student here goes through them.

The chapter-00 students come in tiers, each added only where what contains it exists:
``SAFE`` (graded anywhere, unsandboxed too, as their tests always were), ``SANDBOX`` (needs
bubblewrap) and ``CONTAINED`` (attacks on shared resources: bubblewrap and cgroups).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from test_grader import (
    RELEASE,
    ROOT,
    SOLUTION,
    WRONG,
    grade,
    gradebook,
    leftover_processes,
    read,
    sliced,
    sliced_release,
    solved,
    with_cell_after_setup,
    write,
)

from ddp_lab.course.grading import intake, isolation, sandbox

NAME = RELEASE.name
CELL_TIMEOUT = "90"
# The one honest submission of the class (the tests' "honest", "c-honest" and "bystander").
# The class is graded in the order of the names: "a-bomb", "a-broken" (not JSON: nothing to
# run) and this one come one after another, so this one starts while the bomb still runs
# (test_grading_attacks_intake.py: under "BASE_UID + i % jobs" they shared a user id).
HONEST = "a-honest"


@dataclass
class Run:
    """A class as graded: its gradebook, and the processes it left right after the run."""

    out: Path
    book: dict[tuple[str, str], tuple[int, int, str]]
    leftovers: list[int]  # leftover_processes() right after the run

    def rows(self, *names: str, exercise: str = "00.average") -> dict[str, tuple[int, int, str]]:
        """name -> (points, max_points, status) of ``exercise`` for these students."""
        return {n: self.book[(n, exercise)] for n in names}

    def feedback(self, name: str) -> str:
        return (self.out / "feedback" / f"{name}.md").read_text(encoding="utf-8")


@dataclass
class Graded(Run):
    """The chapter-00 class, and the machine's state right after its run."""

    students: set[str]  # every identity the class was made of, as the gradebook writes it
    sandboxed: bool  # the SANDBOX tier was in the class
    contained: bool  # the CONTAINED tier was in the class
    grown: int  # bytes the run added to the class's folder and the machine's temporary folders
    sandbox_users: list[int]  # processes of the sandbox's user ids right after the run
    cgroups: list[str]  # this process's gradings' cgroups right after the run
    target: Path  # the file the "writer" tries to write on the host
    secret: str  # the text of the file the "reader" tries to read on the host
    accepted: list[object] = field(default_factory=list)  # connections the "network" made


def _host_attacks(target: Path, secret: Path, port: int) -> dict[str, str]:
    """Cells that reach for the instructor's machine from inside the sandbox."""
    return {
        "writer": f"open({str(target)!r}, 'w').write('pwned')",
        "reader": f"print(open({str(secret)!r}).read())",
        "network": (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'hello')"
        ),
        "forkbomb": (
            "import os, time\n"
            "try:\n"
            "    while True:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(600)\n"
            "            os._exit(0)\n"
            "except OSError:\n"
            "    pass\n"
        ),
    }


def bytes_in_scratch(tmp: Path) -> int:
    """Bytes stored under ``tmp`` and where a grading may write outside it: the temporary folders.

    Not the disk's free space: that also moves with whatever else the machine writes meanwhile
    (test.sh installs the other Pythons' venvs beside these tests: 496 MiB less free once in CI).
    """
    roots = sorted(
        {Path(p).resolve() for p in (tmp, tempfile.gettempdir(), "/var/tmp", "/dev/shm")}
    )
    roots = [r for r in roots if r.is_dir() and not any(o in r.parents for o in roots)]
    total = 0
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except OSError:  # gone meanwhile
                    pass
    return total


def grade_chapter00(tmp: Path) -> Graded:
    """Write the class under ``tmp``, grade it once, and return what the tests look at."""
    from test_grading_a_whole_class import BORROW, SPOOF
    from test_grading_attacks import ALWAYS_EQUAL, CHEATS
    from test_grading_attacks_answers import KEY_READER, _solution_cell, _with
    from test_grading_attacks_intake import (
        BOMB,
        FILLER,
        FILLER_SOLUTION,
        cgroups_left,
        sandbox_user_processes,
    )
    from test_grading_attacks_verdict import FLOOD, FORGE, PATCH_PROBES, PEEK, UNSOLVED

    sandboxed = sandbox.available()
    contained = sandboxed and isolation.unavailable_reason() is None
    release_path, release = sliced_release(RELEASE, tmp / "release")
    subs = tmp / "subs"
    names: list[str] = []

    def student(name: str, nb: nbformat.NotebookNode, file: str = NAME) -> None:
        write(nb, subs / name / file)
        names.append(name)

    # As the gradebook writes the names that are not plain text (course.grading.report).
    shown = {"=2+5": "'=2+5", "\x1b[31mred\x07": "\\x1b[31mred\\x07"}
    shown[os.fsdecode(b"caf\xe9")] = "caf\\xe9"

    # SAFE: honest, wrong and unsolved work, and the attacks that need no containment.
    student(HONEST, solved(release))
    student("wrong", solved(release, WRONG))
    student("unsolved", release)  # the released exercise, untouched
    student("unsolved_zh", sliced(read(ROOT / "exercises" / "zh" / NAME)))
    for cheat, cell in CHEATS.items():  # the verdict decided by the learner's own code
        student(cheat, with_cell_after_setup(solved(release, WRONG), cell))
    student("always_equal", solved(release, ALWAYS_EQUAL))
    # Data from the sandbox trusted, the probes patched, the other ranks' inputs read, the
    # protocol pipe flooded.
    student("stub", solved(release, UNSOLVED))
    student("forge", with_cell_after_setup(solved(release, UNSOLVED), FORGE))
    student("patch", with_cell_after_setup(solved(release, UNSOLVED), PATCH_PROBES))
    student("peek", solved(release, PEEK))
    student("flood", solved(release, SOLUTION + "\n" + FLOOD))  # floods right before grading

    target = tmp / "instructor" / "pwned.txt"
    target.parent.mkdir(parents=True)
    seed = "the-instructor-seed"
    secret = tmp / "instructor" / "seed.txt"
    secret.write_text(seed)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    accepted: list[object] = []
    if sandboxed:
        # SANDBOX: the instructor's files and network, and the concept checks' key.
        attacks = _host_attacks(target, secret, server.getsockname()[1])
        for name, cell in attacks.items():
            student(name, with_cell_after_setup(solved(release), cell))
        marker = "my_answers = {"
        answers = _solution_cell(read(ROOT / "solutions" / "en" / NAME), marker)
        student("concepts", _with(release, marker, answers))
        student("key_reader", _with(release, marker, KEY_READER))
    if contained:
        # CONTAINED: names that crashed the class or reached the instructor raw, files that
        # are not the learner's own notebook, identities, and the shared resources.
        for name in ("zoe", "=2+5", "\x1b[31mred\x07", os.fsdecode(b"caf\xe9")):
            student(name, solved(release))  # the last three: a formula, escapes, not UTF-8
        student("borrow", solved(release, BORROW))
        student("spoof", solved(release, SPOOF))
        outside = write(solved(release), tmp / "solutions" / NAME)
        for name, link in (("linker", str(outside)), ("copycat", f"../zoe/{NAME}")):
            (subs / name).mkdir()
            (subs / name / NAME).symlink_to(link)
            names.append(name)
        (subs / "fifo").mkdir()
        os.mkfifo(subs / "fifo" / NAME)
        (subs / "huge").mkdir()
        with open(subs / "huge" / NAME, "wb") as f:
            f.truncate(intake.MAX_BYTES + 1)
        names += ["fifo", "huge"]
        student("aaron", solved(release, WRONG), "zoe.ipynb")  # aaron's file named after zoe
        # A fork bomb, first of the three: the honest one starts while it runs.
        student("a-bomb", with_cell_after_setup(solved(release, WRONG), BOMB))
        (subs / "a-broken").mkdir()
        (subs / "a-broken" / NAME).write_text("{", encoding="utf-8")
        names.append("a-broken")
        student("filler", with_cell_after_setup(solved(release, FILLER_SOLUTION), FILLER))

    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    before = bytes_in_scratch(tmp)
    out = tmp / "out"
    try:
        assert grade(release_path, subs, out, "--cell-timeout", CELL_TIMEOUT, "--jobs", "2") == 0
    finally:
        stop.set()
        thread.join()
        server.close()
    return Graded(
        out=out,
        book=gradebook(out),
        leftovers=leftover_processes(),
        students={shown.get(n, n) for n in names},
        sandboxed=sandboxed,
        contained=contained,
        grown=bytes_in_scratch(tmp) - before,
        sandbox_users=sandbox_user_processes(),
        cgroups=cgroups_left(),
        target=target,
        secret=seed,
        accepted=accepted,
    )


def grade_chapter05(tmp: Path) -> Run:
    """Chapter 05's class (``05.ring``), graded once: an honest ring, the released exercise,
    and the roads to the reference ring or to gloo's own all-reduce of
    ``test_grading_attacks_answers.py`` and ``test_grading_attacks_verdict.py``."""
    from test_grading_attacks_answers import (
        BACKWARDS_GROUP,
        EXEC_REFERENCE,
        GROUP_METHOD,
        MAGIC_IMPORT,
        _exercise,
        _solution_cell,
        _with,
    )
    from test_grading_attacks_verdict import IMPORT_REFERENCE

    released, _, solution = _exercise("05")
    path, release = sliced_release(released, tmp / "release")
    marker = "def ring_all_reduce"
    subs = tmp / "subs"
    write(_with(release, marker, _solution_cell(solution, marker)), subs / "honest.ipynb")
    write(release, subs / "unsolved.ipynb")
    attacks = {
        "exec_reference": EXEC_REFERENCE,
        "magic_import": MAGIC_IMPORT,
        "group_method": GROUP_METHOD,
        "backwards_group": BACKWARDS_GROUP,
        "import_reference": IMPORT_REFERENCE,
    }
    for name, source in attacks.items():
        write(_with(release, marker, source), subs / f"{name}.ipynb")
    out = tmp / "out"
    assert grade(path, subs, out, "--cell-timeout", "120", "--jobs", "2") == 0
    return Run(out=out, book=gradebook(out), leftovers=leftover_processes())
