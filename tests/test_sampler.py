"""ddp_lab.sampler against torch.utils.data.DistributedSampler (the 06.indices checker:
tests/course/checks/test_ch06.py)."""

from __future__ import annotations

import math

import matplotlib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler as TorchSampler

from ddp_lab import sampler as S

matplotlib.use("Agg")


def torch_shards(n, replicas, shuffle, drop_last, seed, epoch):
    out = []
    for rank in range(replicas):
        ts = TorchSampler(range(n), replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        ts.set_epoch(epoch)
        out.append((len(ts), ts.total_size, list(ts)))
    return out


# Seeds and epochs include negatives: torch accepts them (manual_seed wraps them).
params = dict(
    n=st.integers(0, 70),
    replicas=st.integers(1, 9),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(-(10**6), 10**9),
    epoch=st.integers(-5, 1000),
)


@settings(max_examples=300, deadline=None)
@given(**params)
def test_teaching_sampler_yields_what_torch_yields(n, replicas, shuffle, drop_last, seed, epoch):
    for rank, (length, total, indices) in enumerate(
        torch_shards(n, replicas, shuffle, drop_last, seed, epoch)
    ):
        ours = S.DistributedSampler(
            range(n), replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        ours.set_epoch(epoch)
        assert (len(ours), ours.total_size, list(ours)) == (length, total, indices)


@settings(max_examples=200, deadline=None)
@given(**params)
def test_assignment_grid_matches_torch_shards(n, replicas, shuffle, drop_last, seed, epoch):
    a = S.assignment_grid(n, replicas, shuffle, drop_last, seed, epoch)
    expected = torch_shards(n, replicas, shuffle, drop_last, seed, epoch)
    assert a.shards == [indices for _, _, indices in expected]
    assert a.num_samples == expected[0][0] and a.total_size == expected[0][1]
    read = [s for shard in a.shards for s in shard]
    # Padding: exactly total_size - n slots repeat a sample, and they are the ones flagged.
    flagged = sum(f for row in a.is_padding for f in row)
    assert flagged == max(0, a.total_size - n)
    # Every sample is read, except the dropped ones; dropped only happens with drop_last.
    assert set(read) | set(a.dropped) == set(range(n))
    assert not set(read) & set(a.dropped)
    assert len(a.dropped) == (n - a.total_size if drop_last else 0)
    # A flagged slot holds a sample that an unflagged slot also holds (a duplicate).
    real = {
        s for r, shard in enumerate(a.shards) for j, s in enumerate(shard) if not a.is_padding[r][j]
    }
    assert real == set(read)
    for sample in range(n):
        assert len(a.owners(sample)) == read.count(sample)


@pytest.mark.parametrize("n, replicas", [(0, 3), (5, 5), (10, 4), (2, 7), (1, 1), (13, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_num_samples_formula(n, replicas, drop_last):
    expected = TorchSampler(range(n), replicas, 0, drop_last=drop_last).num_samples
    assert S.num_samples_for(n, replicas, drop_last) == expected
    # The closed forms the chapter states.
    assert expected == (n // replicas if drop_last else math.ceil(n / replicas))


def test_same_seed_plus_epoch_same_order():
    # The permutation depends on seed + epoch only: (seed=0, epoch=1) == (seed=1, epoch=0).
    assert S.permutation(20, seed=0, epoch=1) == S.permutation(20, seed=1, epoch=0)
    a = TorchSampler(range(20), 2, 0, seed=0)
    a.set_epoch(1)
    assert list(a) == list(TorchSampler(range(20), 2, 0, seed=1))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(dataset_len=-1, num_replicas=2), ValueError),
        (dict(dataset_len=4, num_replicas=0), ValueError),
        (dict(dataset_len=4, num_replicas=2, rank=2), ValueError),
        (dict(dataset_len=4, num_replicas=2, rank=-1), ValueError),
        (dict(dataset_len=4, num_replicas=2.0), TypeError),
        (dict(dataset_len=4, num_replicas=2, rank=True), TypeError),
    ],
)
def test_bad_arguments_are_explained_in_both_languages(kwargs, error):
    from ddp_lab.i18n import get_language, set_language

    before = get_language()
    try:
        messages = []
        for lang in ("en", "zh"):
            set_language(lang)
            with pytest.raises(error) as info:
                S.check_arguments(**kwargs)
            messages.append(str(info.value))
        assert messages[0] != messages[1] and all("{" not in m for m in messages)
    finally:
        set_language(before)


def test_sampler_names_the_real_problem_with_zero_replicas():
    with pytest.raises(ValueError, match=r"interval \[0, -1\]"):  # torch blames the rank
        TorchSampler(range(4), num_replicas=0, rank=0)
    with pytest.raises(ValueError, match="num_replicas"):
        S.DistributedSampler(range(4), num_replicas=0, rank=0)


def test_draw_assignment_draws_one_cell_per_slot_and_sample():
    a = S.assignment_grid(10, 4, shuffle=False)
    fig = S.draw_assignment(a, highlight_rank=1)
    top, bottom = fig.axes
    assert len(top.patches) == a.total_size == 12
    assert len(bottom.patches) == 10
    hatched = [p for p in top.patches if p.get_hatch()]
    assert len(hatched) == 2
    assert [t.get_text() for t in bottom.texts].count("0×2") == 1
    a = S.assignment_grid(10, 4, shuffle=False, drop_last=True)
    fig = S.draw_assignment(a, fig=fig)
    assert [t.get_text() for t in fig.axes[1].texts].count("x") == 2


def test_widget_redraws_when_a_control_changes():
    w = S.sampler_widget(dataset_len=7, num_replicas=3)
    controls, out = w.children
    n, replicas, rank = controls.children[0].children
    shuffle, drop_last, seed, epoch = controls.children[1].children
    rank.value = 2
    replicas.value = 2
    assert rank.max == 1 and rank.value == 1
    drop_last.value, seed.value, epoch.value = True, 5, 3
    expected = S.assignment_grid(7, 2, shuffle=True, drop_last=True, seed=5, epoch=3)
    assert w.assignment.shards == expected.shards
    n.value = 0  # an empty dataset must draw, not crash
    assert w.assignment.shards == [[], []]
