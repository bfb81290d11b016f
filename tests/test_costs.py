"""Tests of ddp_lab.costs: the alpha-beta-gamma models, checked against counted traffic."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import ddp_lab as dl
from ddp_lab import costs, ring

matplotlib.use("Agg")


def _ps_all_reduce_bytes(rank: int, numel: int) -> int:
    """Reduce + broadcast through rank 0 with send/recv; return the bytes this rank sent."""
    n, sent = dist.get_world_size(), 0
    x = torch.ones(numel)
    if rank == 0:
        buf = torch.empty(numel)
        for peer in range(1, n):
            dist.recv(buf, peer)
            x += buf
        for peer in range(1, n):
            dist.send(x, peer)
            sent += x.numel() * 4
    else:
        dist.send(x, 0)
        sent += x.numel() * 4
        dist.recv(x, 0)
    assert torch.all(x == n)
    return sent


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_bytes_sent_match_real_traffic(world_size):
    numel = 120
    ps = dl.spawn(
        _ps_all_reduce_bytes, args=(numel,), nprocs=world_size, backend="gloo", quiet=True
    )
    assert max(ps) == costs.bytes_sent("parameter server", world_size, numel * 4)
    traces = dl.spawn(
        ring.traced_run, args=(world_size, numel), nprocs=world_size, backend="gloo", quiet=True
    )
    ring_bytes = max(sum(s["sent_numel"] for s in t) * 8 for t in traces)
    assert ring_bytes == costs.bytes_sent("ring", world_size, numel * 8)


@given(
    n=st.integers(2, 256),
    size=st.floats(1e3, 1e10),
    alpha=st.floats(0, 1e-3),
    bw=st.floats(1e8, 1e12),
)
def test_ring_never_loses_to_the_parameter_server(n, size, alpha, bw):
    beta = 1 / bw
    assert costs.ring(n, size, alpha, beta) <= costs.parameter_server(n, size, alpha, beta) * (
        1 + 1e-12
    )


def test_bandwidth_terms():
    s, beta = 1e9, 1e-9
    # Ring and halving-doubling are bandwidth optimal: 2(N-1)/N S beta, below 2 S beta.
    for n in (2, 4, 64, 1024):  # powers of two: halving-doubling needs no extra steps
        assert costs.ring(n, s, 0, beta) == pytest.approx(2 * (n - 1) / n * s * beta)
        assert costs.halving_doubling(n, s, 0, beta) == pytest.approx(costs.ring(n, s, 0, beta))
    # Butterfly moves the whole buffer log2 N times; the parameter server 2(N-1) times.
    assert costs.butterfly(8, s, 0, beta) == pytest.approx(3 * s * beta)
    assert costs.parameter_server(8, s, 0, beta) == pytest.approx(14 * s * beta)
    # The notes' formula 2(alpha + S/B) would not grow with N at all.
    assert costs.parameter_server(16, s, 0, beta) > 7 * costs.parameter_server(2, s, 0, beta)


def test_latency_terms_and_non_powers_of_two():
    assert costs.ring(8, 0, 1.0, 0) == 14
    assert costs.halving_doubling(8, 0, 1.0, 0) == 6
    assert costs.binomial_tree(5, 0, 1.0, 0) == 2 * math.ceil(math.log2(5))
    # halving-doubling on 6 = 4 + 2 ranks: 2 log2 4 steps plus one in and one out
    assert costs.halving_doubling(6, 0, 1.0, 0) == 2 * 2 + 2
    s, beta, gamma = 1e9, 1e-9, 1e-10
    assert costs.halving_doubling(6, s, 0, beta, gamma) == pytest.approx(
        costs.halving_doubling(4, s, 0, beta, gamma) + 2 * s * beta + s * gamma
    )
    assert costs.bytes_sent("halving-doubling", 6, s) == pytest.approx(1.5 * s + s)


def test_segments_trade_latency_for_hidden_reduction():
    n, s, alpha, beta, gamma = 4, 2**26, 1e-5, 1e-10, 1e-9
    one = costs.segmented_ring(n, s, alpha, beta, gamma, segments=1)
    assert one == pytest.approx(costs.ring(n, s, alpha, beta, gamma))
    assert costs.segmented_ring(n, s, alpha, beta, gamma, segments=8) < one
    tiny = 1024  # small messages: more segments only add latency
    assert costs.segmented_ring(n, tiny, alpha, beta, gamma, 8) > costs.ring(
        n, tiny, alpha, beta, gamma
    )


def test_curves_validate_and_draw():
    with pytest.raises(ValueError):
        costs.curves([2, 4], size=0, alpha=1e-6, bandwidth=1e9)
    c = costs.curves([2, 4, 8], 2**20, 1e-5, 1e9)
    assert set(c) == set(costs.ALGORITHMS) and all(len(v) == 3 for v in c.values())
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    costs.plot_curves(ax, 8, 2**20, 1e-5, 1e9)
    assert len(ax.lines) == len(costs.ALGORITHMS)
    box = costs.cost_widget()
    box.children[0].children[0].value = 4  # moving a slider redraws


def test_legend_speaks_the_notebook_language():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddp_lab import i18n

    assert set(costs.ALGORITHM_NAMES_ZH) == set(costs.ALGORITHMS)
    before = i18n.get_language()
    try:
        zh = [costs.ALGORITHM_NAMES_ZH[name] for name in costs.ALGORITHMS]
        for lang, names in (("en", list(costs.ALGORITHMS)), ("zh", zh)):
            i18n.set_language(lang)
            _, ax = plt.subplots()
            costs.plot_curves(ax, 8, 2**20, 1e-5, 1e10)
            assert [line.get_label() for line in ax.get_lines()] == names
    finally:
        i18n.set_language(before)


def test_gloo_models_follow_gloos_algorithms():
    mib = 1 << 20
    # gloo/allreduce.cc ring: max(ceil(S / 1 MiB), 2N) segments, rounded up to a multiple of N
    assert [costs.gloo_segments(2, s) for s in (4, 4 * mib, 8 * mib)] == [2, 2, 4]
    assert costs.gloo_segments(4, 9 * mib) == 3  # 9 -> 12 segments, 3 per chunk
    # all-reduce: 2(N-1) p messages; reduce_scatter is the same all-reduce of the whole input
    assert costs.gloo_cpu("all_reduce", 4, 0, 1.0, 0) == 2 * 3 * 2
    assert costs.gloo_cpu("reduce_scatter", 4, mib, 1e-6, 1e-9) == costs.gloo_cpu(
        "all_reduce", 4, mib, 1e-6, 1e-9
    )
    # broadcast: a binomial tree, ceil(log2 N) whole-buffer rounds
    assert [costs.gloo_cpu("broadcast", n, 0, 1.0, 0) for n in (2, 4, 5)] == [1, 2, 3]
    assert costs.gloo_cpu("broadcast", 4, mib, 0, 1e-9) == pytest.approx(2 * mib * 1e-9)
    # all-gather: 2(N-1) half-inputs, so every rank passes on N-1 whole inputs
    assert costs.gloo_cpu("all_gather", 4, mib, 1.0, 0) == 6
    assert costs.gloo_cpu("all_gather", 4, mib, 0, 1e-9) == pytest.approx(3 * mib * 1e-9)
    with pytest.raises(ValueError, match="gather"):
        costs.gloo_cpu("gather", 4, mib, 0, 1e-9)
