"""The similarity report's cost is bounded per learner (issue 41, item 6): 1.5 MiB of trivial
lines is "not compared (too large)", a learner past their CPU budget "not compared (took too
long)", and the fingerprints are computed in a child process, never in the grader's."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_grader import RELEASE, read, solved, with_cell_after_setup

from ddp_lab.course.grading import similarity

pytest.importorskip("copydetect")

TRIVIAL = "x = 1\n" * (3 * 2**18)  # 1.5 MiB of trivial lines (the issue's)
OWN = "def helper(values):\n    total = 0\n    for v in values:\n        total += v * v\n" * 3


def test_a_huge_learner_is_not_compared_and_the_work_is_done_in_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copydetect

    def here(*args, **kwargs):
        raise AssertionError("fingerprints computed in the grader's own process")

    monkeypatch.setattr(copydetect, "CodeFingerprint", here)  # the child has its own
    release = read(RELEASE)
    subs = {
        "ann": with_cell_after_setup(solved(release), OWN),
        "bob": with_cell_after_setup(solved(release), OWN),  # ann's code: a pair
        "huge": with_cell_after_setup(solved(release), TRIVIAL),
    }
    text = similarity.write_report(release, subs, tmp_path, "en").read_text(encoding="utf-8")
    assert "- `ann` ~ `bob`: 100%" in text, text  # compared, in the child
    assert "- `huge`: not compared (too large)" in text, text
    assert not any("`huge` ~" in line or "~ `huge`" in line for line in text.splitlines())
    zh = similarity.write_report(release, subs, tmp_path, "zh").read_text(encoding="utf-8")
    assert "- `huge`: 未比较（过大）" in zh, zh


def test_a_learner_past_the_cpu_budget_is_cut_alone() -> None:
    codes = {"00.average": {"ann": OWN, "bob": OWN, "slow": TRIVIAL}}
    found, cut = similarity.compare(codes, max_chars=10**9, cpu_seconds=1)
    assert cut == {"slow": similarity.TOO_SLOW}, cut  # its 1 s of CPU ran out, in the child
    assert found == {"00.average": [("ann", "bob", 1.0)]}, found
