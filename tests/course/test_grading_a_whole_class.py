"""One ``ddp-lab grade`` run over a class with every kind of attack in it (issue 26, "done when").

The attack tests group their submissions by kind (``test_grading_attacks*.py``); here the same
attacks sit in one class next to honest and unsolved work, graded in one run with ``--jobs 2``,
as an instructor would meet them: the honest students keep exactly their points, every attack
gets nothing (or its own ``error``/``flagged`` status), the gradebook names everyone, and the
machine keeps its disk, processes and cgroups.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from test_grader import (
    RELEASE,
    SOLUTION,
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
from test_grading_attacks import CHEATS
from test_grading_attacks_intake import (
    BOMB,
    FILLER,
    FILLER_SOLUTION,
    cgroups_left,
    needs_sandbox_and_cgroups,
    sandbox_user_processes,
)
from test_grading_attacks_verdict import FLOOD, FORGE, PATCH_PROBES, PEEK, UNSOLVED

from ddp_lab.course.grading import intake

NAME = RELEASE.name
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
def test_a_class_with_every_attack_in_one_grading_run(tmp_path: Path) -> None:
    release = read(RELEASE)
    subs = tmp_path / "subs"

    def student(name: str, nb: object) -> None:
        write(nb, subs / name / NAME)  # type: ignore[arg-type]

    honest = solved(release)
    for name in ("ann", "zoe", "=2+5", "\x1b[31mred\x07", os.fsdecode(b"caf\xe9")):
        student(name, honest)  # the last three: a formula, terminal escapes, not UTF-8
    student("unsolved", solved(release, UNSOLVED))
    student("wrong", solved(release, WRONG))
    # 1: data from the sandbox trusted; 2: the answers imported.
    student("forge", with_cell_after_setup(solved(release, UNSOLVED), FORGE))
    student("patch", with_cell_after_setup(solved(release, UNSOLVED), PATCH_PROBES))
    student("peek", solved(release, PEEK))
    for cheat in ("patch_grade", "patch_torch", "print_and_exit"):
        student(cheat, with_cell_after_setup(solved(release, WRONG), CHEATS[cheat]))
    student("borrow", solved(release, BORROW))
    # 3: files that are not the learner's own notebook.
    outside = write(honest, tmp_path / "solutions" / NAME)
    (subs / "linker").mkdir()
    (subs / "linker" / NAME).symlink_to(outside)
    (subs / "copycat").mkdir()
    (subs / "copycat" / NAME).symlink_to(f"../zoe/{NAME}")
    (subs / "fifo").mkdir()
    os.mkfifo(subs / "fifo" / NAME)
    (subs / "huge").mkdir()
    with open(subs / "huge" / NAME, "wb") as f:
        f.truncate(intake.MAX_BYTES + 1)
    # 4: identity from a name the learner picks (aaron's file named after zoe).
    write(solved(release, WRONG), subs / "aaron" / "zoe.ipynb")
    # 5 and 7: texts that crashed the class or reached the instructor raw.
    student("spoof", solved(release, SPOOF))
    # 6: shared resources: a fork bomb, a disk filler, a flood on the protocol pipe.
    student("bomb", with_cell_after_setup(solved(release, WRONG), BOMB))
    student("filler", with_cell_after_setup(solved(release, FILLER_SOLUTION), FILLER))
    student("flood", solved(release, SOLUTION + "\n" + FLOOD))
    free = shutil.disk_usage(tmp_path).free
    out = tmp_path / "out"

    assert grade(RELEASE, subs, out, "--cell-timeout", "90", "--jobs", "2") == 0
    book = code_exercises(gradebook(out))
    for name in ("ann", "zoe", "'=2+5", "\\x1b[31mred\\x07", "caf\\xe9"):
        assert book.pop((name, "00.average")) == (2, 2, "passed"), name
    attacks = {name: book.pop((name, "00.average")) for name, _ in list(book)}
    assert book == {}  # one row per student, no "zoe-2"
    assert set(attacks) == {
        "unsolved", "wrong", "forge", "patch", "peek", "patch_grade", "patch_torch",
        "print_and_exit", "borrow", "linker", "copycat", "fifo", "huge", "aaron", "spoof",
        "bomb", "filler", "flood",
    }  # fmt: skip
    assert all(points == 0 and most == 2 for points, most, _ in attacks.values()), attacks
    for name in ("linker", "copycat", "fifo", "huge"):
        assert attacks[name][2] == "error", (name, attacks[name])
    assert attacks["peek"][2] == "flagged" and attacks["spoof"][2] == "failed"
    spoof = (out / "feedback" / "spoof.md").read_text(encoding="utf-8")
    assert "\x1b" not in spoof and "00.average: failed, 0/2" in spoof
    assert shutil.disk_usage(tmp_path).free > free - 200 * 2**20
    assert leftover_processes() == [] and sandbox_user_processes() == []
    assert cgroups_left() == []
