"""Grading as a security boundary: a learner who reads the package's source and wants points.

Each submission below tries one way to get its verdict decided by its own code, or to reach
the instructor's machine; it must get 0 for the exercise (or be stopped), while honest work
gets full points and the other submissions are graded normally (issue: "grading a class
can trust"). The verdicts come from ``course.verdict``; see docs/INSTRUCTORS.md for what the
grader guarantees and what it does not.
"""

from __future__ import annotations

import pytest
from graded_classes import HONEST, Graded
from test_grader import leftover_processes

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


def test_cheats_get_zero_and_honest_work_full_points(chapter00_class: Graded) -> None:
    graded = chapter00_class  # graded_classes.py: these students sit in the chapter-00 class
    book = graded.rows(HONEST, *CHEATS, "always_equal")
    assert book.pop(HONEST) == (2, 2, "passed")
    assert book.pop("print_and_exit") == (0, 2, "kernel-died")
    # It imports the grading machinery, or sets an attribute of ddp_lab's or torch's: course.scan
    # flags it for the instructor, with 0 points (and the checker's own verdict beside it).
    flagged = ("patch_checker", "patch_grade", "patch_torch")
    for name in flagged:
        assert book.pop(name) == (0, 2, "flagged"), name
    assert book == {
        name: (0, 2, "failed")
        for name in [*CHEATS, "always_equal"]
        if name not in ("print_and_exit", *flagged)
    }
    wrong = graded.feedback("patch_grade")
    assert "the mean over ranks is" in wrong  # the real checker's feedback, not the cheat's
    assert "not a tensor" in graded.feedback("always_equal")
    assert graded.leftovers == [] and leftover_processes() == []


@pytest.mark.skipif(not sandbox.available(), reason="no bubblewrap/user namespaces here")
def test_sandboxed_submissions_cannot_touch_the_host(chapter00_class: Graded) -> None:
    # graded_classes.py: the class holds a writer to the instructor's file, a reader of the
    # instructor's seed, a client of a server this process listens with during the run, and
    # a fork bomb, each in a cell after dl.setup() of an honest solution.
    graded = chapter00_class
    assert graded.sandboxed
    assert not graded.target.exists()
    assert graded.accepted == []
    assert graded.secret not in "".join(
        p.read_text(encoding="utf-8") for p in (graded.out / "feedback").iterdir()
    )
    # The attacks failed inside their own sandbox; honest work around them is graded as usual.
    for name in ("writer", "reader", "network", HONEST):
        assert graded.book[(name, "00.average")] == (2, 2, "passed"), name
    assert graded.leftovers == [] and leftover_processes() == []
