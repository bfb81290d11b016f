"""Pipeline schedules on paper and on ranks against one process and the bubble formula."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddp_lab.pipeline import (
    ScheduleError,
    bubble,
    bubble_formula,
    gpipe_order,
    measured_bubble,
    peak_in_flight,
    pipeline_demo,
    simulate,
)
from ddp_lab.pipeline_1f1b import one_f_one_b_order
from ddp_lab.runtime.launcher import spawn


@given(st.integers(1, 8), st.integers(1, 16), st.sampled_from([(1.0, 1.0), (1.0, 2.0), (2.0, 3.0)]))
def test_both_schedules_have_the_formula_bubble(p, m, times):
    for make in (gpipe_order, one_f_one_b_order):
        orders = [make(s, p, m) for s in range(p)]
        assert bubble(simulate(orders, m, *times)) == pytest.approx(bubble_formula(p, m))


@given(st.integers(1, 8), st.integers(1, 16))
def test_activations_held(p, m):
    for s in range(p):
        assert peak_in_flight(gpipe_order(s, p, m)) == m
        assert peak_in_flight(one_f_one_b_order(s, p, m)) == min(p - s, m)


def test_bad_orders_are_refused():
    with pytest.raises(ScheduleError, match=r"stage 0: B\(0\) is missing"):
        simulate([[("F", 0)], [("F", 0), ("B", 0)]], 1)
    with pytest.raises(ScheduleError, match=r"stage 0: F\(1\) appears 2 times"):
        simulate([[("F", 0), ("F", 1), ("F", 1), ("B", 0), ("B", 1)]], 2)
    with pytest.raises(ScheduleError, match=r"stage 0: F\(2\) is not a pass of this step"):
        simulate([[("F", 0), ("F", 2), ("B", 0), ("B", 1)]], 2)
    with pytest.raises(ScheduleError, match="before F"):
        simulate([[("B", 0), ("F", 0)]], 1)
    # stage 0 runs B(0) before F(1), stage 1 runs F(1) before B(0): each waits for the other
    stuck = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(stuck, 2)


def test_neighbours_run_their_micro_batches_in_the_same_order():
    """recv takes messages in the order they were sent: an order that passes every other rule
    on paper, but would pair stage 1's forward with another micro-batch's activation."""
    swapped = [[("F", 0), ("F", 2), ("F", 1), ("B", 0), ("B", 1), ("B", 2)],
               [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]]  # fmt: skip
    with pytest.raises(ScheduleError, match=r"stage 1 runs F\(1\) where stage 0 sends F\(2\)"):
        simulate(swapped, 3)
    backwards = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("F", 1), ("B", 1), ("B", 0)]]
    with pytest.raises(ScheduleError, match=r"stage 0 runs B\(0\) where stage 1 sends B\(1\)"):
        simulate(backwards, 2)
    # the same permutation on every stage is fine: messages still pair up
    same = [[("F", 1), ("F", 0), ("B", 1), ("B", 0)]] * 2
    assert simulate(same, 2)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_pipeline_on_ranks_matches_one_process(name):
    out = spawn(pipeline_demo, args=(name, 4, 8, 0.01), nprocs=3, backend="gloo", quiet=True)
    for s, r in enumerate(out):
        assert r["max_grad_diff"] < 1e-12
        assert [(k, i) for _, k, i, _, _ in r["events"]] == (
            gpipe_order if name == "gpipe" else one_f_one_b_order
        )(s, 3, 4)
        assert r["peak"] == (4 if name == "gpipe" else 3 - s)
    assert 0.0 < measured_bubble(out) < 1.0  # its value is a measurement: chapter 12 shows it


def test_torch_schedules_run_our_orders_and_match_one_process():
    """torch's ScheduleGPipe and Schedule1F1B, as they ran (not their pipeline_order IR),
    against gpipe_order / one_f_one_b_order, and their gradients against one process."""
    from ddp_lab.pipeline import torch_pipeline_runs

    out = spawn(torch_pipeline_runs, args=(6,), nprocs=3, backend="gloo", quiet=True)
    for s, r in enumerate(out):
        assert r["gpipe"]["order"] == gpipe_order(s, 3, 6)
        assert r["1f1b"]["order"] == one_f_one_b_order(s, 3, 6)
        assert r["gpipe"]["max_grad_diff"] < 1e-12 and r["1f1b"]["max_grad_diff"] < 1e-12
        # torch's 1F1B refuses m < p; the exercise's order (min(p - s, m)) does not need to
        assert "must be greater than or equal to the number of stages" in r["fewer_micro"]
