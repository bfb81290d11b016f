"""``not attempted`` is a status of its own (issue 41): an exercise whose stub still raises
NotImplementedError reads ``not attempted`` in the gradebook, the results and the learner's
feedback, a wrong answer ``failed``, an honest one ``passed``, in the same class run."""

from __future__ import annotations

import json
from pathlib import Path

from test_grader import RELEASE, WRONG, grade, gradebook, leftover_processes, read, solved, write

from ddp_lab.course.grading import checkers, load_checkers
from ddp_lab.course.grading.learner import LearnerError, LocalLearner

ROOT = Path(__file__).resolve().parents[2]


def test_unsolved_wrong_and_honest_in_one_class_run(tmp_path: Path) -> None:
    release = read(RELEASE)
    subs = tmp_path / "subs"
    write(solved(release), subs / "honest.ipynb")
    write(solved(release, WRONG), subs / "wrong.ipynb")
    write(release, subs / "unsolved.ipynb")  # the released exercise, untouched
    zh = read(ROOT / "exercises" / "zh" / "00_quickstart.ipynb")
    write(zh, subs / "unsolved_zh.ipynb")
    out = tmp_path / "out"
    assert grade(RELEASE, subs, out, "--cell-timeout", "120", "--jobs", "2") == 0
    book = gradebook(out)
    assert {k: v for k, v in book.items() if k[1] == "00.average"} == {
        ("honest", "00.average"): (2, 2, "passed"),
        ("wrong", "00.average"): (0, 2, "failed"),
        ("unsolved", "00.average"): (0, 2, "not-attempted"),
        ("unsolved_zh", "00.average"): (0, 2, "not-attempted"),
    }
    # No concept question answered in any of them: not attempted either.
    assert {v for k, v in book.items() if k[1] == "00.concepts"} == {(0, 2, "not-attempted")}
    feedback = (out / "feedback" / "unsolved.md").read_text(encoding="utf-8")
    assert "- 00.average: not attempted, 0/2" in feedback, feedback
    assert "NOT ATTEMPTED 00.average: 0/2 points" in feedback and "failed" not in feedback
    zh_feedback = (out / "feedback" / "unsolved_zh.md").read_text(encoding="utf-8")
    assert "- 00.average: 未作答, 0/2" in zh_feedback and "未作答 00.average" in zh_feedback
    wrong = (out / "feedback" / "wrong.md").read_text(encoding="utf-8")
    assert "- 00.average: failed, 0/2" in wrong and "NOT ATTEMPTED 00.average" not in wrong
    doc = json.loads((out / "results" / "unsolved.json").read_text(encoding="utf-8"))
    test = next(t for t in doc["tests"] if t["name"] == "00.average")
    # Gradebook tools know passed/failed only; the output says which kind of failure.
    assert test["status"] == "failed" and test["output"].startswith("not attempted")
    totals = (out / "totals.csv").read_text(encoding="utf-8")
    assert "not-attempted" in totals
    assert leftover_processes() == []


def test_the_stub_in_the_ranks_or_the_cell_is_not_attempted_any_other_error_failed() -> None:
    chk = load_checkers(["00.average"])["00.average"]

    def stub(value):
        raise NotImplementedError("your code here")

    def wrong(value):
        raise ValueError("oops")

    assert checkers.judge(chk, LocalLearner((stub,)), "en")[0] == checkers.NOT_ATTEMPTED
    assert checkers.judge(chk, LocalLearner((wrong,)), "en")[0] == "failed"

    class Remote:  # the graded call's NotImplementedError as a remote learner reports it
        def ranks(self, *args, **kwargs):
            raise LearnerError("NotImplementedError", "your code here")

        call = ranks

    status, line = checkers.judge(chk, Remote(), "zh")
    assert status == checkers.NOT_ATTEMPTED and line.startswith("未作答 00.average：得分 0/2"), line
