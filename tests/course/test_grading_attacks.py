"""Grading as a security boundary: a learner who reads the package's source and wants points.

Each submission below tries one way to get its verdict decided by its own code, or to reach
the instructor's machine; it must get 0 for the exercise (or be stopped), while honest work
gets full points and the other submissions are graded normally (issue: "grading a class
can trust"). The verdicts come from ``course.verdict``; see docs/INSTRUCTORS.md for what the
grader guarantees and what it does not.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from test_grader import (
    RELEASE,
    WRONG,
    code_exercises,
    grade,
    gradebook,
    leftover_processes,
    read,
    solved,
    with_cell_after_setup,
    write,
)

from ddp_lab.course.build import grade_pass_line
from ddp_lab.course.grading import sandbox

PASS = grade_pass_line("00.average", 2, "en")

CHEATS = {
    # The one-liner of the issue: the in-notebook check replaced by a print.
    "patch_grade": f"import ddp_lab as dl\ndl.grade = lambda *a, **k: print({PASS!r})",
    # The checker, its registry and the verdict function, patched in the learner's process.
    "patch_checker": (
        "import ddp_lab.course.grading as g\n"
        "g.load_checkers()\n"
        "g.run_checker = lambda *a, **k: (True, 'PASS')\n"
        "for c in g.REGISTRY.values():\n"
        "    c.fn = lambda rng, learner: iter([1, 'x'])\n"
    ),
    # The oracle and the comparisons, patched in the learner's process.
    "patch_torch": (
        "import torch, torch.distributed as dist\n"
        "torch.allclose = lambda *a, **k: True\n"
        "torch.Tensor.__eq__ = lambda self, other: True\n"
        "dist.all_reduce = lambda t, *a, **k: None\n"
    ),
    # The graded cell rewritten on its way to the kernel.
    "input_transformer": (
        f"get_ipython().input_transformers_post.append(lambda lines: ['print({PASS!r})\\n'])"
    ),
    # Print the passing line, then stop before anything can check.
    "print_and_exit": f"print({PASS!r}, flush=True)\nimport os\nos._exit(0)",
}

ALWAYS_EQUAL = """\
class Anything:
    def __eq__(self, other):
        return True
    def __bool__(self):
        return True

def average_across_ranks(value: torch.Tensor):
    return Anything()
"""


def test_cheats_get_zero_and_honest_work_full_points(tmp_path: Path) -> None:
    release = read(RELEASE)
    subs = tmp_path / "subs"
    write(solved(release), subs / "honest.ipynb")
    for name, cell in CHEATS.items():
        write(with_cell_after_setup(solved(release, WRONG), cell), subs / f"{name}.ipynb")
    write(solved(release, ALWAYS_EQUAL), subs / "always_equal.ipynb")
    out = tmp_path / "out"
    assert grade(RELEASE, subs, out, "--cell-timeout", "60", "--jobs", "2") == 0
    book = code_exercises(gradebook(out))
    assert book.pop(("honest", "00.average")) == (2, 2, "passed")
    assert book.pop(("print_and_exit", "00.average")) == (0, 2, "kernel-died")
    # It imports the grading machinery: course.scan flags it for the instructor, with 0 points.
    assert book.pop(("patch_checker", "00.average")) == (0, 2, "flagged")
    assert book == {
        (name, "00.average"): (0, 2, "failed")
        for name in [*CHEATS, "always_equal"]
        if name not in ("print_and_exit", "patch_checker")
    }
    wrong = (out / "feedback" / "patch_grade.md").read_text(encoding="utf-8")
    assert "the mean over ranks is" in wrong  # the real checker's feedback, not the cheat's
    assert "not a tensor" in (out / "feedback" / "always_equal.md").read_text(encoding="utf-8")
    assert leftover_processes() == []


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_sandboxed_submissions_cannot_touch_the_host(tmp_path: Path) -> None:
    release = read(RELEASE)
    subs = tmp_path / "subs"
    target = tmp_path / "instructor" / "pwned.txt"
    target.parent.mkdir()
    secret = tmp_path / "instructor" / "seed.txt"
    secret.write_text("the-instructor-seed")
    accepted: list[object] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    attacks = {
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
    for name, cell in attacks.items():
        write(with_cell_after_setup(solved(release), cell), subs / f"{name}.ipynb")
    write(solved(release), subs / "bystander.ipynb")
    out = tmp_path / "out"
    try:
        assert grade(RELEASE, subs, out, "--cell-timeout", "60", "--jobs", "2") == 0
    finally:
        stop.set()
        thread.join()
        server.close()
    book = code_exercises(gradebook(out))
    assert not target.exists()
    assert accepted == []
    assert "the-instructor-seed" not in "".join(
        p.read_text(encoding="utf-8") for p in (out / "feedback").iterdir()
    )
    # The attacks failed inside their own sandbox; honest work around them is graded as usual.
    for name in ("writer", "reader", "network", "bystander"):
        assert book[(name, "00.average")] == (2, 2, "passed"), name
    assert leftover_processes() == []
