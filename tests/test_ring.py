"""Tests of ddp_lab.ring: the hand-written ring against dist.all_reduce on real Gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import ddp_lab as dl
from ddp_lab import costs, ring

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


def _compare(rank: int, cases: list, segment_bytes: int | None) -> list[str]:
    """Run every case through the ring and through dist.all_reduce; list the mismatches."""
    bad = []
    for shape, dtype, seed in cases:
        gen = torch.Generator().manual_seed(seed + rank)
        x = torch.randint(0, 3, shape, generator=gen).to(dtype)  # small: exact in every dtype
        expected = x.clone()
        dist.all_reduce(expected)
        got = ring.ring_all_reduce(x, segment_bytes=segment_bytes)
        if got is not x or not torch.equal(x, expected):
            bad.append(
                f"{shape} {dtype}: {x.flatten()[:5].tolist()} != {expected.flatten()[:5].tolist()}"
            )
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_matches_all_reduce_on_awkward_sizes_and_every_dtype(world_size):
    n = world_size
    shapes = [(), (1,), (max(1, n - 1),), (n,), (n + 1,), (2 * n + 1,), (3, 5), (0,), (1001,)]
    cases = [(s, d, i) for i, (s, d) in enumerate((s, d) for s in shapes for d in DTYPES)]
    for bad in dl.spawn(_compare, args=(cases, None), nprocs=n, backend="gloo", quiet=True):
        assert bad == []


@settings(max_examples=8, deadline=None)
@given(
    world_size=st.integers(2, 4),
    numel=st.integers(1, 300),
    segment_bytes=st.one_of(st.none(), st.integers(1, 200)),
    dtype=st.sampled_from([torch.float32, torch.int64, torch.float16]),
)
def test_segmented_ring_matches_all_reduce(world_size, numel, segment_bytes, dtype):
    cases = [((numel,), dtype, 7)]
    results = dl.spawn(
        _compare, args=(cases, segment_bytes), nprocs=world_size, backend="gloo", quiet=True
    )
    assert all(bad == [] for bad in results)


def _non_contiguous(rank: int) -> bool:
    x = torch.arange(12.0).reshape(3, 4).t() * (rank + 1)  # a transposed view
    expected = x.clone()
    dist.all_reduce(expected)
    return torch.equal(ring.ring_all_reduce(x), expected)


def test_non_contiguous_tensor_is_reduced_in_place():
    assert dl.spawn(_non_contiguous, nprocs=3, backend="gloo", quiet=True) == [True] * 3


@settings(max_examples=30, deadline=None)
@given(numel=st.integers(0, 500), world_size=st.integers(1, 9))
def test_chunk_bounds_cut_like_tensor_split(numel, world_size):
    sizes = [b - a for a, b in ring.chunk_bounds(numel, world_size)]
    assert sizes == [len(c) for c in torch.tensor_split(torch.empty(numel), world_size)]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_trace_of_a_real_run_matches_the_simulation(world_size):
    traces = dl.spawn(
        ring.traced_run, args=(world_size,), nprocs=world_size, backend="gloo", quiet=True
    )
    assert ring.states_from_trace(traces) == ring.simulate(world_size)
    assert all(len(t) == 2 * (world_size - 1) for t in traces)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_each_rank_sends_2_n_minus_1_over_n_of_the_data(world_size):
    numel = 12 * 5  # divisible by 2, 3 and 4: the fraction is exact
    traces = dl.spawn(
        ring.traced_run, args=(world_size, numel), nprocs=world_size, backend="gloo", quiet=True
    )
    for trace in traces:
        sent_bytes = sum(step["sent_numel"] for step in trace) * 8  # float64
        assert sent_bytes == costs.bytes_sent("ring", world_size, numel * 8)


def test_simulation_ends_with_every_chunk_complete_and_owner_after_reduce_scatter():
    for n in range(2, 8):
        states = ring.simulate(n)
        assert len(states) == 2 * (n - 1) + 1
        full = frozenset(range(n))
        assert all(c == full for row in states[-1] for c in row)
        # After the reduce-scatter, rank r owns the finished chunk r + 1.
        assert all(states[n - 1][r][(r + 1) % n] == full for r in range(n))


def _no_group(rank: int) -> str:
    try:
        ring.ring_all_reduce(torch.ones(3))
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="torch.Tensor"):
        ring.ring_all_reduce([1, 2, 3])
    with pytest.raises(ValueError, match="segment_bytes"):
        ring.ring_all_reduce(torch.ones(3), segment_bytes=0)
    assert "init_process_group" in dl.spawn(_no_group, nprocs=1, quiet=True)[0]


def test_visualiser_draws_and_builds_a_widget():
    import matplotlib

    matplotlib.use("Agg")
    states = ring.simulate(3)
    ax = ring.draw_state(states, 2)
    assert len(ax.patches) == 9
    box = ring.ring_widget(3)
    step = box.children[0].children[1]
    assert step.max == 4
    step.value = 4  # redraws without error


def _batches(rank: int, backend: str, numel: int, segment_bytes: int | None) -> tuple:
    """Run the ring while dist.get_backend answers ``backend``; record every batch's ops."""
    from unittest import mock

    batches: list[list[str]] = []
    real = dist.batch_isend_irecv

    def recording(ops):
        batches.append(["send" if op.op is dist.isend else "recv" for op in ops])
        return real(ops)

    x = torch.arange(numel, dtype=torch.float64) * (rank + 1)
    expected = x.clone()
    dist.all_reduce(expected)
    with (
        mock.patch.object(dist, "get_backend", return_value=backend),
        mock.patch.object(dist, "batch_isend_irecv", recording),
    ):
        ring.ring_all_reduce(x, segment_bytes=segment_bytes)
    return batches, torch.equal(x, expected)


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("segment_bytes", [None, 40])
def test_nccl_schedule_pairs_every_send_with_a_receive(world_size, segment_bytes):
    # NCCL runs batched p2p on one stream per device (ProcessGroupNCCL.cpp, pointToPoint):
    # a batch holding only a receive blocks this rank's later send -> the ring deadlocks.
    numel = 12 * world_size + 1  # every chunk non-empty: every step sends and receives
    results = dl.spawn(
        _batches,
        args=("nccl", numel, segment_bytes),
        nprocs=world_size,
        backend="gloo",
        quiet=True,
    )
    nseg = 1 if segment_bytes is None else -(-13 * 8 // segment_bytes)
    for batches, correct in results:
        assert correct
        assert len(batches) == 2 * (world_size - 1) * nseg
        assert all(sorted(b) == ["recv", "send"] for b in batches), batches


def test_gloo_schedule_keeps_its_early_one_op_batches():
    results = dl.spawn(_batches, args=("gloo", 13, None), nprocs=3, backend="gloo", quiet=True)
    for batches, correct in results:
        assert correct
        assert all(len(b) == 1 for b in batches)
