"""``not attempted`` is a status of its own (issue 41): an exercise whose stub still raises
NotImplementedError reads ``not attempted`` in the gradebook, the results and the learner's
feedback, a wrong answer ``failed``, an honest one ``passed``, in the same class run (the
chapter-00 class of graded_classes.py)."""

from __future__ import annotations

import json

from graded_classes import HONEST, Graded
from test_grader import leftover_processes

from ddp_lab.course.grading import checkers, load_checkers
from ddp_lab.course.grading.learner import LearnerError, LocalLearner


def test_unsolved_wrong_and_honest_in_one_class_run(chapter00_class: Graded) -> None:
    # graded_classes.py: "unsolved" and "unsolved_zh" are the released exercises, untouched.
    graded = chapter00_class
    names = (HONEST, "wrong", "unsolved", "unsolved_zh")
    assert graded.rows(*names) == {
        HONEST: (2, 2, "passed"),
        "wrong": (0, 2, "failed"),
        "unsolved": (0, 2, "not-attempted"),
        "unsolved_zh": (0, 2, "not-attempted"),
    }
    # No concept question answered in any of them: not attempted either.
    concepts = graded.rows(*names, exercise="00.concepts")
    assert set(concepts.values()) == {(0, 2, "not-attempted")}
    feedback = graded.feedback("unsolved")
    assert "- 00.average: not attempted, 0/2" in feedback, feedback
    assert "NOT ATTEMPTED 00.average: 0/2 points" in feedback and "failed" not in feedback
    zh_feedback = graded.feedback("unsolved_zh")
    assert "- 00.average: 未作答, 0/2" in zh_feedback and "未作答 00.average" in zh_feedback
    wrong = graded.feedback("wrong")
    assert "- 00.average: failed, 0/2" in wrong and "NOT ATTEMPTED 00.average" not in wrong
    doc = json.loads((graded.out / "results" / "unsolved.json").read_text(encoding="utf-8"))
    test = next(t for t in doc["tests"] if t["name"] == "00.average")
    # Gradebook tools know passed/failed only; the output says which kind of failure.
    assert test["status"] == "failed" and test["output"].startswith("not attempted")
    totals = (graded.out / "totals.csv").read_text(encoding="utf-8")
    assert "not-attempted" in totals
    assert graded.leftovers == [] and leftover_processes() == []


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
