"""Alpha-beta-gamma cost models of all-reduce algorithms, and an interactive plot of them.

The model: sending a message of ``m`` bytes between two ranks takes ``alpha + m * beta``
(alpha the latency, beta = 1 / bandwidth); reducing ``m`` bytes takes ``m * gamma``. A rank
can send one message and receive one message at the same time, over one link. For an
all-reduce of ``S`` bytes on ``N`` ranks:

- reduce + broadcast via one root (parameter server):
  2(N-1)(alpha + S beta) + (N-1) S gamma; the root sends (N-1) S
- binomial tree reduce + broadcast: 2 log2 N (alpha + S beta) + log2 N S gamma; root: log2 N S
- recursive halving + doubling: 2 log2 N alpha + 2(N-1)/N S beta + (N-1)/N S gamma;
  every rank sends 2(N-1)/N S (N a power of two; otherwise see ``halving_doubling``)
- butterfly (recursive doubling): log2 N (alpha + S beta + S gamma); every rank: log2 N S
- ring: 2(N-1) alpha + 2(N-1)/N S beta + (N-1)/N S gamma; every rank sends 2(N-1)/N S
- segmented ring (p segments per chunk): 2(N-1) p alpha + 2(N-1)/N S beta + (N-1)/N S gamma / p

How this differs from the source notes: their reduce + broadcast formula,
``2 (alpha + S/B) + N S C``, lets the root receive N-1 messages at once at full bandwidth;
with one link the root receives them one after the other, hence the factor N-1. log2 N is
rounded up when N is not a power of two (the tree and butterfly need extra steps then);
halving-doubling then folds the extra ranks into partners first: two extra steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ddp_lab.i18n import N_, _t


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def parameter_server(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Reduce to one root over its single link, then broadcast from it."""
    return 2 * (n - 1) * (alpha + size * beta) + (n - 1) * size * gamma


def binomial_tree(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Reduce up a binomial tree, broadcast down it: log2 N full-size rounds each way."""
    return 2 * _log2(n) * (alpha + size * beta) + _log2(n) * size * gamma


def halving_doubling(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling.

    N not a power of two is allowed, at a price (Thakur, Rabenseifner and Gropp, 2005): with
    p the largest power of two <= N, the N - p extra ranks first send their whole buffer to
    a partner, which reduces it (alpha + S beta + S gamma); the p ranks run the algorithm;
    the partners send the result back (alpha + S beta).
    """
    p = 1 << (n.bit_length() - 1) if n > 1 else 1
    frac = (p - 1) / p
    core = 2 * _log2(p) * alpha + 2 * frac * size * beta + frac * size * gamma
    if p == n:
        return core
    return core + 2 * (alpha + size * beta) + size * gamma


def butterfly(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Recursive doubling: log2 N rounds, each exchanging and reducing the whole buffer."""
    return _log2(n) * (alpha + size * beta + size * gamma)


def ring(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Reduce-scatter then all-gather around a ring: 2(N-1) steps of S/N bytes."""
    frac = (n - 1) / n
    return 2 * (n - 1) * alpha + 2 * frac * size * beta + frac * size * gamma


def segmented_ring(
    n: int, size: float, alpha: float, beta: float, gamma: float = 0.0, segments: int = 4
) -> float:
    """Ring with each chunk cut into ``segments`` pieces, reduced while the next one travels.

    More messages (latency grows p-fold) in exchange for hiding all but 1/p of the
    reduction behind the transfers: it pays off for large S, when S gamma >> alpha.
    """
    frac = (n - 1) / n
    return 2 * (n - 1) * segments * alpha + 2 * frac * size * beta + frac * size * gamma / segments


def tree_broadcast(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Broadcast down a binomial tree: ceil(log2 N) rounds, each moving the whole buffer."""
    return _log2(n) * (alpha + size * beta)


def ring_all_gather(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """All-gather around a ring in half-pieces: 2(N-1) messages of size/2, ``size`` = one input.

    Every rank passes on N-1 inputs, each as two halves (two messages in flight).
    """
    return 2 * (n - 1) * alpha + (n - 1) * size * beta


GLOO_OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
GLOO_MAX_SEGMENT = 1 << 20  # gloo/allreduce.h: AllreduceOptions kMaxSegmentSize


def gloo_segments(n: int, size: float) -> int:
    """Segments per chunk of gloo's ring all-reduce (``ring`` in gloo/allreduce.cc).

    The buffer is cut into at least 2N segments of at most 1 MiB, rounded up to a multiple
    of N: N chunks of ``segments`` each, so that one segment travels while another is reduced.
    """
    wanted = max(math.ceil(size / GLOO_MAX_SEGMENT), 2 * n)
    return math.ceil(wanted / n)


def gloo_cpu(op: str, n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """The model of what ProcessGroupGloo runs on CPU tensors for ``op`` (seconds).

    ``size``: the bytes of one rank's input tensor. Checked against the sources:

    - ``all_reduce``: ``gloo::allreduce`` with no algorithm set, which runs ``ring``
      (gloo/allreduce.cc): a segmented ring, ``segmented_ring`` with ``gloo_segments``;
    - ``broadcast``: ``gloo::broadcast`` (gloo/broadcast.cc): a binomial tree;
    - ``all_gather``: ``gloo::allgather`` (gloo/allgather.cc): a ring in half-pieces;
    - ``reduce_scatter``: ProcessGroupGloo's ``reduce_scatter_tensor_coalesced``
      (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) clones the whole input, all-reduces
      it and keeps its own chunk: a full ring all-reduce of ``size`` bytes, twice the bytes a
      real reduce-scatter sends.
    """
    if op in ("all_reduce", "reduce_scatter"):
        return segmented_ring(n, size, alpha, beta, gamma, gloo_segments(n, size))
    if op == "broadcast":
        return tree_broadcast(n, size, alpha, beta)
    if op == "all_gather":
        return ring_all_gather(n, size, alpha, beta)
    raise ValueError(f"no gloo model for {op!r}")


ALGORITHMS: dict[str, Callable[..., float]] = {
    "parameter server": parameter_server,
    "binomial tree": binomial_tree,
    "halving-doubling": halving_doubling,
    "butterfly": butterfly,
    "ring": ring,
    "segmented ring": segmented_ring,
}
# Legend names, shown in the notebook's language (zh: the terms chapter 04 uses, docs/GLOSSARY.md).
ALGORITHM_NAMES = {
    "parameter server": N_("parameter server"),
    "binomial tree": N_("binomial tree"),
    "halving-doubling": N_("halving-doubling"),
    "butterfly": N_("butterfly"),
    "ring": N_("ring"),
    "segmented ring": N_("segmented ring"),
}
ALGORITHM_NAMES_ZH = {name: _t(ALGORITHM_NAMES[name], "zh") for name in ALGORITHMS}


def _halving_doubling_bytes(n: int, size: float) -> float:
    p = 1 << (n.bit_length() - 1)
    # a partner of an extra rank also sends it the whole result back
    return 2 * (p - 1) / p * size + (size if p != n else 0)


def bytes_sent(algorithm: str, n: int, size: float) -> float:
    """The most bytes any single rank sends during one all-reduce of ``size`` bytes."""
    if n == 1:
        return 0.0
    per_rank = {
        "parameter server": (n - 1) * size,
        "binomial tree": _log2(n) * size,
        "halving-doubling": _halving_doubling_bytes(n, size),
        "butterfly": _log2(n) * size,
        "ring": 2 * (n - 1) / n * size,
        "segmented ring": 2 * (n - 1) / n * size,
    }
    return per_rank[algorithm]


def curves(
    ns: Sequence[int],
    size: float,
    alpha: float,
    bandwidth: float,
    gamma: float = 0.0,
    algorithms: Sequence[str] | None = None,
) -> dict[str, list[float]]:
    """Time of every algorithm for every N in ``ns`` (seconds): what ``cost_widget`` draws.

    Args:
        size: bytes to all-reduce. alpha: seconds per message. bandwidth: bytes per second.
        gamma: seconds per byte reduced.
    """
    if size <= 0 or alpha < 0 or bandwidth <= 0 or gamma < 0:
        raise ValueError("size and bandwidth must be > 0, alpha and gamma >= 0")
    beta = 1.0 / bandwidth
    names = list(algorithms or ALGORITHMS)
    return {name: [ALGORITHMS[name](n, size, alpha, beta, gamma) for n in ns] for name in names}


def plot_curves(
    ax: Any, max_n: int, size: float, alpha: float, bandwidth: float, gamma: float = 0.0
) -> Any:
    """Draw time against N for every algorithm on ``ax``."""

    ns = list(range(2, max_n + 1))
    for name, times in curves(ns, size, alpha, bandwidth, gamma).items():
        label = _t(ALGORITHM_NAMES[name])
        ax.plot(ns, [t * 1e3 for t in times], marker=".", label=label)
    ax.set_xlabel(_t("number of ranks N"))
    ax.set_ylabel(_t("time of one all-reduce (ms)"))
    ax.set_title(
        _t(
            "S = {size:g} MiB, alpha = {alpha:g} us, bandwidth = {bandwidth:g} GB/s",
            size=size / 2**20,
            alpha=alpha * 1e6,
            bandwidth=bandwidth / 1e9,
        )
    )
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def cost_widget() -> Any:
    """Sliders for N, message size, latency and bandwidth over a plot of time against N."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    style = {"description_width": "initial"}
    max_n = widgets.IntSlider(value=16, min=2, max=64, description=_t("max N"), style=style)
    size_mb = widgets.FloatLogSlider(
        value=64,
        base=2,
        min=-10,
        max=12,
        style=style,
        description=_t("size (MiB)"),
    )
    alpha_us = widgets.FloatLogSlider(
        value=10,
        base=10,
        min=-1,
        max=4,
        style=style,
        description=_t("latency (us)"),
    )
    bw_gb = widgets.FloatLogSlider(
        value=10,
        base=10,
        min=-1,
        max=3,
        style=style,
        description=_t("bandwidth (GB/s)"),
    )
    out = widgets.Output()

    def redraw(_: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(7, 4))
            plot_curves(
                ax, max_n.value, size_mb.value * 2**20, alpha_us.value * 1e-6, bw_gb.value * 1e9
            )
            plt.show()

    for w in (max_n, size_mb, alpha_us, bw_gb):
        w.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([widgets.HBox([max_n, size_mb]), widgets.HBox([alpha_us, bw_gb]), out])
    display(box)
    return box
