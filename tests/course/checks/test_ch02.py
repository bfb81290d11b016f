"""Chapter 02's checker (02.place) through a learner handle: the reference passes, typical
wrong solutions fail with feedback, and results that are not data fail cleanly."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from cheats import EqualsAnyList, EqualsAnything, verdict, verdict_here

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


def _tuple_of_rows(counts, cvds, gpus):  # one dict per process, in order: what the text asks
    return tuple(_reference(counts, cvds, gpus))


def _wrong_skips_invalid(counts, cvds, gpus):  # skips an invalid entry instead of stopping
    def gpus_of(cvd):
        if cvd is None:
            return list(range(gpus))
        return [int(t) for t in cvd.split(",") if t.strip().isdigit() and int(t) < gpus]

    out = _reference(counts, cvds, gpus)
    for d in out:
        seen = gpus_of(cvds[d["node_rank"]])
        ok = d["local_rank"] < len(seen)
        d["gpu"] = seen[d["local_rank"]] if ok else None
        d["device"] = f"cuda:{d['local_rank']}" if ok else None
    return out


def _wrong_empty_is_unset(counts, cvds, gpus):  # CUDA_VISIBLE_DEVICES="" read as unset
    return _reference(counts, [None if c == "" else c for c in cvds], gpus)


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


@pytest.mark.parametrize("right", [_reference, _tuple_of_rows])
def test_checker_accepts_reference(torchrun_cached: None, right: Callable) -> None:
    passed, line = _verdict(right)
    assert passed, line


@pytest.mark.parametrize(
    ("wrong", "feedback"),
    [
        (_wrong_homogeneous, "rank should be"),
        (_wrong_ignores_visible, "should be"),
        (_wrong_global_rank_as_device, "device should be"),
        (_wrong_local_world_size, "world_size should be"),
    ],
)
def test_checker_rejects_typical_wrong_solutions(
    torchrun_cached: None, wrong: Callable, feedback: str
) -> None:
    passed, line = _verdict(wrong)
    assert not passed
    assert "FAIL 02.place" in line and feedback in line


def _torchrun_model(counts, cvds, **_):
    """torchrun's rows as the model has them (node i is group rank i): enough for cases 2-4,
    which do not run torchrun."""
    rows, base = [], 0
    for node, (n, cvd) in enumerate(zip(counts, cvds, strict=True)):
        rows += [
            {
                "RANK": base + local,
                "LOCAL_RANK": local,
                "GROUP_RANK": node,
                "WORLD_SIZE": sum(counts),
                "LOCAL_WORLD_SIZE": n,
                "CUDA_VISIBLE_DEVICES": cvd,
            }
            for local in range(n)
        ]
        base += n
    return rows


@pytest.mark.parametrize("wrong", [_wrong_skips_invalid, _wrong_empty_is_unset])
def test_no_seed_lets_a_wrong_visibility_rule_pass(
    wrong: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each edge case holds both of its forms, so the rule fails under every seed, not only
    under the seeds that happen to draw the form that tells it apart. The cases are what is
    asked here: the probe runs in this process (``verdict_here``); the ranks' way is above."""
    monkeypatch.setattr(ranks, "torchrun_assignment", _torchrun_model)
    for seed in range(30):
        monkeypatch.setenv("DDP_LAB_GRADE_SEED", str(seed))
        assert verdict_here("02.place", _reference)[0]
        passed, line = verdict_here("02.place", wrong)
        assert not passed and "device should be None" in line, (seed, line)


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
