"""Verdict lines read as sentences (issue 44): after a full stop, the next sentence starts
with a capital letter in English, and the Chinese line has no space after "。" and no
lowercase English sentence after it. Every kind of verdict line the checkers and the
verdict process can build is rendered here, in both languages."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

from ddp_lab.course.grading import checkers
from ddp_lab.course.grading.checkers import (
    CaseFailed,
    Checker,
    NotAttempted,
    judge,
    note,
    sentences,
)
from ddp_lab.course.grading.learner import LearnerError, LocalLearner

# A sentence that starts lowercase after a full stop ("points. hidden case ..."), or a
# Chinese full stop followed by a space or a lowercase word.
LOWER_AFTER_STOP = re.compile(r"\.\s+[a-z]|\u3002\s*[a-z]|\u3002 ")


def _checker(body: Any) -> Checker:
    """A checker of 2 cases whose second case does ``body`` (raise, or nothing: passes)."""

    def fn(rng: Any, learner: Any) -> Iterator[str]:
        yield 2
        yield "first"
        body(learner)
        yield "second"

    return Checker("99.kinds", 3, fn)


def _raise(exc: BaseException) -> Any:
    def body(learner: Any) -> None:
        raise exc

    return body


def _note(learner: Any) -> None:
    note(learner, "99.kinds: the grader could not observe the ranks here.")
    note(learner, "the second note starts lowercase.")


KINDS = {
    "passed": _checker(lambda learner: None),
    "passed-with-notes": _checker(_note),
    "stub": _checker(_raise(NotImplementedError())),
    "stub-in-ranks": _checker(_raise(LearnerError("NotImplementedError", "your code here"))),
    "not-attempted": _checker(_raise(NotAttempted("not answered: 1, 2 (of 2)", "-"))),
    "case-failed": _checker(_raise(CaseFailed("expected 1, got 2", "world 2"))),
    "learner-raised": _checker(_raise(LearnerError("ValueError", "oops. and more"))),
    "other-error": _checker(_raise(KeyError("k"))),
}


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_verdict_line_reads_as_sentences(kind: str, lang: str) -> None:
    status, line = judge(KINDS[kind], LocalLearner(()), lang)
    expected = {"passed": "passed", "stub": checkers.NOT_ATTEMPTED, "not-": checkers.NOT_ATTEMPTED}
    assert status == next((v for k, v in expected.items() if kind.startswith(k)), "failed"), line
    # The learner's own text ("oops. and more") is quoted as it is: look at ours only.
    ours = line.replace("oops. and more", "oops")
    assert not LOWER_AFTER_STOP.search(ours), line
    if lang == "en" and kind != "passed":
        assert re.search(r"points?\. [A-Z0-9]", line), line
    if kind == "passed-with-notes":
        stop = "\u3002" if lang == "zh" else ". "
        assert f"points{stop}99.kinds: the grader" in line.replace("得分 3/3", "points"), line
        assert line.endswith("The second note starts lowercase."), line


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_verdict_process_own_lines_read_as_sentences(lang: str) -> None:
    from ddp_lab.course.grading.verdict import _judge

    registry = checkers.load_checkers(["00.average"])
    for error in ("ValueError: bad input", "NotImplementedError: your code here"):
        got = _judge(registry, "00.average", error, None, lang, math.inf)  # type: ignore[arg-type]
        assert got["status"] in ("failed", checkers.NOT_ATTEMPTED), got
        assert not LOWER_AFTER_STOP.search(got["detail"]), got
        if lang == "en":
            assert re.search(r"0/2 points\. (Hidden case 1 of \?|The exercise)", got["detail"])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_concept_check_with_nothing_answered_reads_as_sentences(lang: str) -> None:
    chk = checkers.load_checkers(["00.concepts"])["00.concepts"]
    status, line = judge(chk, LocalLearner(({},)), lang)
    assert status == checkers.NOT_ATTEMPTED, line
    assert not LOWER_AFTER_STOP.search(line), line
    if lang == "en":
        assert "0/2 points. Not answered: 1, 2" in line, line


def test_sentences_capitalise_end_and_join_by_language() -> None:
    assert sentences("en", "FAIL 1: 0/2 points.", "hidden case 1", "") == (
        "FAIL 1: 0/2 points. Hidden case 1"
    )
    assert sentences("en", "PASS 1: 2/2 points", "05.ring: a note.", "more") == (
        "PASS 1: 2/2 points. 05.ring: a note. More"
    )
    assert sentences("zh", "通过 1：得分 2/2", "05.ring：说明。", "第 1 个") == (
        "通过 1：得分 2/2\u300205.ring：说明。第 1 个"
    )
    assert sentences("en", "head") == "head"  # the head itself is never changed
