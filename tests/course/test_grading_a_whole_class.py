"""One ``ddp-lab grade`` run over a class with every kind of attack in it (issue 26, "done when").

The attack tests group their submissions by kind (``test_grading_attacks*.py``); here the same
attacks sit in one class next to honest and unsolved work, graded in one run with ``--jobs 2``,
as an instructor would meet them: the honest students keep exactly their points, every attack
gets nothing (or its own ``error``/``flagged`` status), the gradebook names everyone, and the
machine keeps its disk, processes and cgroups. The class is ``graded_classes.grade_chapter00``'s, graded
once for this test and the attack tests that assert on their own students in it.
"""

from __future__ import annotations

from graded_classes import HONEST, Graded
from test_grader import code_exercises, leftover_processes
from test_grading_attacks_intake import needs_sandbox_and_cgroups

# Class 2: the package's reference ring, imported to build the mean (hidden from the ranks).
BORROW = """\
from ddp_lab.ring import ring_all_reduce
def average_across_ranks(value):
    return ring_all_reduce(value.clone()) / dist.get_world_size()
"""
# Class 7: an exception whose type name and message write a passing line and Markdown.
SPOOF = """\
def average_across_ranks(value):
    bad = type("passed, 2/2\\n- 00.average: passed", (Exception,), {})
    raise bad("\\udce9 ```\\n# passed, 2/2\\n<img src=x onerror=alert(1)>\\x1b[2J")
"""


@needs_sandbox_and_cgroups
def test_a_class_with_every_attack_in_one_grading_run(chapter00_class: Graded) -> None:
    graded = chapter00_class
    book = code_exercises(graded.book)
    # one row per student, no "zoe-2", nobody else
    assert {student for student, _ in book} == graded.students
    assert {exercise for _, exercise in book} == {"00.average"}
    honest = {HONEST, "zoe", "'=2+5", "\\x1b[31mred\\x07", "caf\\xe9"}
    for name in honest:
        assert book[(name, "00.average")] == (2, 2, "passed"), name
    # Everyone else gets nothing, but the attacks on the host that solve the exercise around
    # their attack (test_grading_attacks.py; the fork bomb's ranks may not start at all).
    around = {"writer", "reader", "network", "forkbomb"}
    attacks = graded.rows(*(graded.students - honest - around))
    assert {
        "unsolved", "stub", "wrong", "forge", "patch", "peek", "patch_grade", "patch_torch",
        "print_and_exit", "borrow", "linker", "copycat", "fifo", "huge", "aaron", "spoof",
        "a-bomb", "filler", "flood",
    } <= set(attacks)  # fmt: skip
    assert all(points == 0 and most == 2 for points, most, _ in attacks.values()), attacks
    for name in ("linker", "copycat", "fifo", "huge"):
        assert attacks[name][2] == "error", (name, attacks[name])
    assert attacks["peek"][2] == "flagged" and attacks["spoof"][2] == "failed"
    spoof = graded.feedback("spoof")
    assert "\x1b" not in spoof and "00.average: failed, 0/2" in spoof
    assert graded.grown < 200 * 2**20
    assert graded.leftovers == [] and graded.sandbox_users == [] and graded.cgroups == []
    assert leftover_processes() == []
