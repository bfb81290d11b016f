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


ROOT = Path(__file__).resolve().parents[2]


def _with_own_code(release, grade_id: str, code: str):
    """``release`` with ``code`` as the learner's exercise cell before ``grade_id``'s graded cell."""
    import copy

    nb = copy.deepcopy(release)
    graded = next(i for i, c in enumerate(nb.cells) if c.metadata.get("grade_id") == grade_id)
    stub = max(i for i, c in enumerate(nb.cells[:graded]) if c.cell_type == "code")
    nb.cells[stub].source = code
    return nb


def test_torch_source_pasted_into_a_cell_is_paired_with_torch_not_the_honest_solution(
    tmp_path: Path,
) -> None:
    """The audit hook refuses a fresh copy of torch's sampler (course/grading/guard.py), not its
    source text copied into a cell: that is the learner's code to the grader, and the report
    pairs it with ``(torch)``. The released solution, written from scratch, is not."""
    import inspect

    import torch.utils.data.distributed as torch_sampler

    release = read(ROOT / "exercises" / "en" / "06_distributed_sampler.ipynb")
    solution = read(ROOT / "solutions" / "en" / "06_distributed_sampler.ipynb")
    pasted = inspect.getsource(torch_sampler.DistributedSampler) + (
        "\n\ndef distributed_indices(dataset_len, num_replicas, rank, epoch=0, seed=0, "
        "shuffle=True, drop_last=False):\n"
        "    sampler = DistributedSampler(range(dataset_len), num_replicas, rank, shuffle, "
        "seed, drop_last)\n"
        "    sampler.set_epoch(epoch)\n"
        "    return list(sampler)\n"
    )
    subs = {
        "honest": solution,
        "pasted": _with_own_code(release, "06.indices", pasted),
    }
    text = similarity.write_report(release, subs, tmp_path, "en").read_text(encoding="utf-8")
    section = text.split("## `06.indices`", 1)[1].split("\n## ", 1)[0]
    assert "- `(torch)` ~ `pasted`:" in section, text
    assert "`(torch)` ~ `honest`" not in section, text  # the solution is written from scratch
    # ... and handed in as it is, it is the course's solution: a pair with (solution)
    assert "- `(solution)` ~ `honest`: 100%" in section, text
    assert "`(solution)` ~ `pasted`" not in section, text
    assert "`(torch)` torch's own" in text, text  # the report says what `(torch)` is
    zh = similarity.write_report(release, subs, tmp_path, "zh").read_text(encoding="utf-8")
    assert "`(torch)` 表示 torch 自己的实现" in zh and "`(solution)` 表示课程的参考答案" in zh, zh


def test_the_two_implementations_are_never_a_pair_and_every_torch_reference_reads() -> None:
    for grade_id in similarity.TORCH_REFERENCES:
        assert similarity.reference_code(grade_id, similarity.TORCH_REFERENCES), grade_id
    codes = {"10.bf16_hook": {similarity.REFERENCE: OWN, similarity.TORCH: OWN, "ann": "y = 2\n"}}
    found, _ = similarity.compare(codes, max_chars=10**9)
    assert found == {"10.bf16_hook": []}, found  # identical, and still no pair


def test_concept_answers_are_not_pairs(tmp_path: Path) -> None:
    # Walking a class through: every learner with the right concept answers was listed as a
    # 100% pair of every other (15 lines for a class of 6), above the one pair that mattered.
    release = read(RELEASE)
    subs = {
        "ann": with_cell_after_setup(solved(release), OWN),
        "bob": with_cell_after_setup(solved(release), OWN),
        "cy": solved(release),
    }
    text = similarity.write_report(release, subs, tmp_path, "en").read_text(encoding="utf-8")
    assert "- `ann` ~ `bob`: 100%" in text, text
    assert "## `00.concepts`" not in text, text  # ann, bob and cy answered alike
    assert "Concept checks are not compared" in text, text
    zh = similarity.write_report(release, subs, tmp_path, "zh").read_text(encoding="utf-8")
    assert "概念题不参与比较" in zh, zh


def test_two_long_names_alike_at_the_start_stay_two_learners(tmp_path: Path) -> None:
    # Review 10: the report keyed learners by their name cut to report.MAX_NAME characters,
    # so two whose names agree that far became one (the later one's notebook kept).
    from ddp_lab.course.grading import grade_class, report

    release = read(RELEASE)
    stem = "x" * report.MAX_NAME
    read_ = {
        f"{stem}-ann": with_cell_after_setup(solved(release), OWN),
        f"{stem}-bob": with_cell_after_setup(solved(release), OWN),
    }
    grade_class._similarity(release, read_, tmp_path, "en")
    text = (tmp_path / "similarity.md").read_text(encoding="utf-8")
    assert "100%" in text, text  # a pair: the two learners were both compared
