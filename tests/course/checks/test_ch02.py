"""Chapter 02's checker (02.place) through a learner handle: the reference passes, typical
wrong solutions fail with feedback, and results that are not data fail cleanly."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from cheats import EqualsAnyList, EqualsAnything, verdict

from ddp_lab.course.grading.checks import ch02
from ddp_lab.tools import ranks


def _verdict(fn: Callable, lang: str = "en") -> tuple[bool, str]:
    return verdict("02.place", fn, lang)


def _reference(counts, cvds, gpus):
    return [
        {k: getattr(p, k) for k in ch02.KEYS}
        for p in ranks.assign(counts, cuda_visible_devices=cvds, gpus_per_node=gpus)
    ]


def _wrong_homogeneous(counts, cvds, gpus):  # rank = node * nproc + local
    out = _reference(counts, cvds, gpus)
    for d in out:
        d["rank"] = d["node_rank"] * counts[d["node_rank"]] + d["local_rank"]
    return out


def _wrong_ignores_visible(counts, cvds, gpus):
    return [
        d | {"gpu": d["local_rank"], "device": f"cuda:{d['local_rank']}"}
        for d in _reference(counts, cvds, gpus)
    ]


def _wrong_global_rank_as_device(counts, cvds, gpus):
    return [d | {"device": f"cuda:{d['rank']}"} for d in _reference(counts, cvds, gpus)]


def _wrong_local_world_size(counts, cvds, gpus):  # world_size = processes on this node
    return [d | {"world_size": counts[d["node_rank"]]} for d in _reference(counts, cvds, gpus)]


def _wrong_tuple_of_rows(counts, cvds, gpus):
    return tuple(_reference(counts, cvds, gpus))


@pytest.fixture(scope="module")
def torchrun_cached() -> Iterator[None]:
    """Run the torchrun oracle once for this module, then replay it (keeps tests short)."""
    real = ranks.torchrun_assignment
    cache: dict = {}

    def cached(counts, cvds, **kw):
        key = (tuple(counts), tuple(cvds))
        if key not in cache:
            cache[key] = real(counts, cvds, **kw)
        return cache[key]

    ranks.torchrun_assignment = cached
    yield
    ranks.torchrun_assignment = real


def test_checker_accepts_reference(torchrun_cached: None) -> None:
    passed, line = _verdict(_reference)
    assert passed, line


@pytest.mark.parametrize(
    ("wrong", "feedback"),
    [
        (_wrong_homogeneous, "rank should be"),
        (_wrong_ignores_visible, "should be"),
        (_wrong_global_rank_as_device, "device should be"),
        (_wrong_local_world_size, "world_size should be"),
        (_wrong_tuple_of_rows, "expected a list of"),
    ],
)
def test_checker_rejects_typical_wrong_solutions(
    torchrun_cached: None, wrong: Callable, feedback: str
) -> None:
    passed, line = _verdict(wrong)
    assert not passed
    assert "FAIL 02.place" in line and feedback in line


def test_feedback_in_chinese(torchrun_cached: None) -> None:
    passed, line = _verdict(_wrong_local_world_size, "zh")
    assert not passed and "world_size 应为" in line and "torchrun，2 个节点" in line


def test_checker_rejects_stub(torchrun_cached: None) -> None:
    def stub(*_):
        raise NotImplementedError

    passed, line = _verdict(stub)
    assert not passed and "points. The exercise is not solved yet" in line, line


@pytest.mark.parametrize(
    ("cheat", "feedback"),
    [
        (lambda *_: EqualsAnything(), "got EqualsAnything"),
        (lambda c, v, g: [EqualsAnything() for _ in _reference(c, v, g)], "got EqualsAnything"),
        (
            lambda c, v, g: [
                dict.fromkeys(ch02.KEYS, EqualsAnything()) for _ in _reference(c, v, g)
            ],
            "got <EqualsAnything>",
        ),
        (lambda *a: EqualsAnyList(), "got 0"),
    ],
)
def test_a_result_that_is_not_data_fails_cleanly(
    torchrun_cached: None, cheat: Callable, feedback: str
) -> None:
    passed, line = _verdict(cheat)
    assert not passed
    assert feedback in line
