"""Every chapter's checkers speak Chinese to a zh learner: a wrong answer to each graded
exercise of chapters 00-11, graded in zh, gets feedback without English prose.

Values and identifiers stay as they are (``dist.all_reduce``, ``world_size=3``, numbers),
and so do the English words the glossary keeps (rank, world size); what may not appear is a
plain English word, in a message or in a hidden case's label. Each answer is graded in en
too, and the same detector must find English there: had a zh message been left in English,
this test would see it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cheats import verdict
from test_ch01 import _wrong_ignores_cpu_build
from test_ch02 import _wrong_local_world_size, torchrun_cached  # noqa: F401  (a fixture)
from test_ch03 import Averaged, notes_rule
from test_ch04_ch05 import ag_forgets_own, ar_reduce_only, ring_full_buffer
from test_ch06 import ignores_epoch, naive_mean
from test_ch07 import SumsBuckets, SumsDDP
from test_ch08 import make_fit
from test_ch09 import accuracy_mean_of_ranks, safe_raise_alone
from test_ch10 import _variant, all_reduce_grad, sums_hook
from test_ch11 import make_resume

from ddp_lab.course.grading import load_checkers, run_checker
from ddp_lab.course.grading.checks import ch09
from ddp_lab.course.grading.learner import LocalLearner


def own_value(tensor: torch.Tensor) -> torch.Tensor:  # 00: forgets to all-reduce
    return tensor


def sums_instead_of_mean(tensor: torch.Tensor) -> torch.Tensor:  # 00: forgets to divide
    dist.all_reduce(tensor)
    return tensor


# grade id -> a wrong answer whose feedback comes from the checker's own messages
WRONG: list[tuple[str, Any]] = [
    ("00.average", own_value),
    ("00.average", sums_instead_of_mean),
    ("01.diagnose", _wrong_ignores_cpu_build),
    ("02.place", _wrong_local_world_size),
    ("03.balanced_chunks", notes_rule),
    ("03.gather", Averaged),
    ("04.all_reduce", ar_reduce_only),
    ("04.all_gather", ag_forgets_own),
    ("05.ring", ring_full_buffer),
    ("06.indices", ignores_epoch),
    ("06.accuracy", naive_mean),
    ("07.naive_ddp", SumsDDP),
    ("07.bucketed", SumsBuckets),
    ("08.fit", make_fit("no_set_epoch")),
    ("08.fit", make_fit("save_wrapper")),
    ("09.global_accuracy", accuracy_mean_of_ranks),
    ("09.safe_all_reduce", safe_raise_alone),
    ("10.sharded_optimizer", _variant("forgets to share")),
    ("10.bf16_hook", sums_hook),
    ("10.fsdp_reduce", all_reduce_grad),
    ("11.resume", make_resume("rng")),
    ("11.resume", make_resume("optimizer")),
    # Concept checks: a wrong letter to question 1, the rest unanswered.
    *[(f"{c:02d}.concepts", {1: "z"}) for c in range(13)],
]


def graded(grade_id: str, wrong: Any, lang: str) -> tuple[bool, str]:
    """``verdict``, also for an exercise that takes several objects (a tuple of them)."""
    if isinstance(wrong, tuple):  # 11.resume: (save_state, load_state)
        return run_checker(load_checkers()[grade_id], LocalLearner(wrong), lang)
    return verdict(grade_id, wrong, lang)


# English kept in Chinese prose: the glossary's "rank" and "world size", and program names
KEPT = {"rank", "world", "size", "torch", "torchrun", "gloo", "nccl"}


def english_prose(line: str) -> list[str]:
    """The plain English words of ``line`` (not ``KEPT``), after quoted reprs are left out.

    Identifiers (``dist.all_reduce``, ``world_size=3``, ``bfloat16``, ``AdamW``, ``MLP``) and
    values are not plain words: they hold ``_ . ( ) =`` or digits, or capitals inside.
    """
    text = re.sub(r"`[^`]*`|'[^']*'|\"[^\"]*\"", " ", line)
    tokens = re.split(r"[\s\u0080-\uffff]+", text)  # Chinese and its punctuation split words
    words = (re.sub(r"^[(\[]+|[,.:;!?)\]]+$", "", token) for token in tokens)
    return [w for w in words if re.fullmatch(r"[A-Za-z][a-z]+", w) and w.lower() not in KEPT]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("rank 1 returned a float, not a tensor", ["returned", "float", "not", "tensor"]),
        ("rank 1 返回的是 float，不是张量", ["float"]),
        ("（共 3 个；world_size=2, uneven shards）", ["uneven", "shards"]),
        ("除以 world size、全归约，再复制回 bucket.buffer()，用 AdamW 和 MLP", []),
        ("请用 dist.reduce_scatter_single（归约散发）", []),
        ("world_size=3, dtype=float32：期望 [1.0, 2.0]，torchrun，2 个节点", []),
        ("每个 rank 都调用 sampler.set_epoch(epoch)", []),
        (
            "call sampler.set_epoch(epoch) at the start",
            ["call", "at", "the", "start"],
        ),
    ],
)
def test_the_detector(text: str, found: list[str]) -> None:
    assert english_prose(text) == found


def test_every_exercise_of_chapters_00_to_11_is_covered() -> None:
    """And every chapter's concept check (chapter 12's exercises are not covered yet)."""
    graded = {
        g
        for g in load_checkers()
        if g[:2].isdigit() and (int(g[:2]) <= 11 or g.endswith(".concepts"))
    }
    assert graded == {g for g, _ in WRONG}


@pytest.mark.parametrize(
    ("grade_id", "wrong"), WRONG, ids=[f"{g}-{i}" for i, (g, _) in enumerate(WRONG)]
)
@pytest.mark.usefixtures("torchrun_cached")
def test_zh_feedback_has_no_english_prose(
    grade_id: str, wrong: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ch09, "HANG_TIMEOUT_S", 5.0)  # a correct case takes < 1 s
    passed, zh = graded(grade_id, wrong, "zh")
    assert not passed, zh
    assert re.search(r"[\u4e00-\u9fff]", zh), zh
    assert english_prose(zh) == [], zh
    passed, en = graded(grade_id, wrong, "en")
    assert not passed, en
    assert english_prose(en) != [], f"the detector misses the English of {en!r}"


if __name__ == "__main__":  # print every verdict line, both languages
    ch09.HANG_TIMEOUT_S = 5.0
    for grade_id, wrong in WRONG:
        for lang in ("zh", "en"):
            print(graded(grade_id, wrong, lang)[1])
