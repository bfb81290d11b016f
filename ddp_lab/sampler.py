"""``DistributedSampler``'s arithmetic, written out, and the assignment grid behind the widget.

A teaching version of ``torch.utils.data.DistributedSampler``: same arguments, same
``num_samples``, ``total_size``, ``set_epoch`` and the same indices (the tests compare them
with torch for every length, world size, rank, seed and epoch). How it differs from
PyTorch's: it checks its arguments with bilingual messages (for ``num_replicas=0`` torch
says "Invalid rank 0, rank should be in the interval [0, -1]"), exposes the padded list
before striding (``padded_indices``), and takes ``dataset`` as anything with a length
(``range(n)`` is enough).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler

from ddp_lab.i18n import _t


def _check_int(name: str, value: Any) -> int:
    # bool is an int subclass, but rank=True is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(_t("{name} must be an int, got {value!r}.", name=name, value=value))
    return value


def check_arguments(dataset_len: int, num_replicas: int, rank: int | None = None) -> None:
    """Raise a clear error for a negative length, no replicas or a rank out of range."""
    if _check_int("dataset_len", dataset_len) < 0:
        raise ValueError(_t("dataset_len must be 0 or more, got {value}.", value=dataset_len))
    if _check_int("num_replicas", num_replicas) < 1:
        raise ValueError(
            _t("num_replicas must be at least 1 (one per rank), got {value}.", value=num_replicas)
        )
    if rank is not None and not 0 <= _check_int("rank", rank) < num_replicas:
        raise ValueError(
            _t(
                "rank must be in [0, {last}] for num_replicas={replicas}, got {value}.",
                last=num_replicas - 1,
                replicas=num_replicas,
                value=rank,
            )
        )


def num_samples_for(dataset_len: int, num_replicas: int, drop_last: bool = False) -> int:
    """How many indices each rank gets: ``ceil(n / R)``, or ``floor(n / R)`` with drop_last.

    torch writes the drop_last case as ``ceil((n - R) / R)``, which equals ``n // R``
    whenever ``n % R != 0`` (and ``n // R`` is also right when it divides).
    """
    check_arguments(dataset_len, num_replicas)
    if drop_last and dataset_len % num_replicas != 0:
        return math.ceil((dataset_len - num_replicas) / num_replicas)
    return math.ceil(dataset_len / num_replicas)


def permutation(dataset_len: int, seed: int = 0, epoch: int = 0, shuffle: bool = True) -> list[int]:
    """The order every rank agrees on: ``randperm`` from a generator seeded with seed + epoch."""
    if not shuffle:
        return list(range(dataset_len))
    # A private generator: the global RNG differs between ranks (and between calls),
    # but this one gives every rank the same permutation for the same seed + epoch.
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(dataset_len, generator=g).tolist()


def pad_or_trim(indices: list[int], total_size: int) -> list[int]:
    """Repeat indices from the start up to ``total_size`` (cycling if needed), or cut the tail."""
    if len(indices) >= total_size:
        return indices[:total_size]  # drop_last: the tail of the (shuffled) order is dropped
    padding = total_size - len(indices)
    # One copy of the head is enough when padding <= len; otherwise the whole list cycles.
    repeats = math.ceil(padding / len(indices))
    return indices + (indices * repeats)[:padding]


class DistributedSampler(Sampler[int]):
    """Teaching version of ``torch.utils.data.DistributedSampler`` (same indices, same API)."""

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        check_arguments(len(dataset), num_replicas, rank)
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, _check_int("seed", seed), drop_last
        self.epoch = 0
        self.num_samples = num_samples_for(len(dataset), num_replicas, drop_last)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Change the seed of the next permutation to ``seed + epoch`` (call it every epoch)."""
        self.epoch = _check_int("epoch", epoch)

    def padded_indices(self) -> list[int]:
        """The ``total_size`` indices shared by all ranks, before each rank takes its stride."""
        order = permutation(len(self.dataset), self.seed, self.epoch, self.shuffle)
        return pad_or_trim(order, self.total_size)

    def __iter__(self) -> Iterator[int]:
        # Striding (rank, rank + R, ...) rather than contiguous blocks: padding then lands
        # one index on each of the last ranks instead of piling up on one rank.
        return iter(self.padded_indices()[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


@dataclass
class Assignment:
    """Which sample every rank reads, position by position: what the widget draws."""

    dataset_len: int
    num_replicas: int
    num_samples: int
    order: list[int]  # the padded (or trimmed) list of total_size sample ids
    shards: list[list[int]]  # shards[r]: the ids rank r reads, in order
    is_padding: list[list[bool]]  # is_padding[r][j]: shards[r][j] repeats an earlier id
    dropped: list[int] = field(default_factory=list)  # ids no rank reads (drop_last)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def owners(self, sample: int) -> list[int]:
        """The ranks that read ``sample`` (two or more when padding repeats it)."""
        return [r for r, shard in enumerate(self.shards) for s in shard if s == sample]


def assignment_grid(
    dataset_len: int,
    num_replicas: int,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    epoch: int = 0,
) -> Assignment:
    """Compute which sample goes to which rank (the ``DistributedSampler`` of every rank)."""
    check_arguments(dataset_len, num_replicas)
    num_samples = num_samples_for(dataset_len, num_replicas, drop_last)
    total = num_samples * num_replicas
    order = pad_or_trim(
        permutation(dataset_len, _check_int("seed", seed), _check_int("epoch", epoch), shuffle),
        total,
    )
    shards = [order[r:total:num_replicas] for r in range(num_replicas)]
    # Position p of the padded list is padding when p >= dataset_len; rank r, slot j is p.
    is_padding = [
        [j * num_replicas + r >= dataset_len for j in range(num_samples)]
        for r in range(num_replicas)
    ]
    dropped = sorted(set(range(dataset_len)) - set(order))
    return Assignment(dataset_len, num_replicas, num_samples, order, shards, is_padding, dropped)


def draw_assignment(a: Assignment, highlight_rank: int | None = None, fig: Any = None) -> Any:
    """Draw ``a``: one row per rank (what it reads, in order) and the dataset strip below."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if fig is None:
        fig = plt.figure(figsize=(9, 1.2 + 0.45 * a.num_replicas + 1.2))
    fig.clear()
    top, bottom = fig.subplots(2, 1, height_ratios=[max(a.num_replicas, 1), 1.6])
    colors = plt.get_cmap("tab10")

    def alpha(r: int) -> float:
        return 1.0 if highlight_rank is None or r == highlight_rank else 0.25

    for r, shard in enumerate(a.shards):
        y = a.num_replicas - 1 - r
        for j, sample in enumerate(shard):
            pad = a.is_padding[r][j]
            top.add_patch(
                Rectangle(
                    (j, y),
                    0.95,
                    0.9,
                    facecolor=colors(r % 10),
                    alpha=alpha(r),
                    hatch="///" if pad else None,
                    edgecolor="black",
                )
            )
            top.text(
                j + 0.47,
                y + 0.45,
                str(sample),
                ha="center",
                va="center",
                fontsize=9,
                fontweight="bold" if pad else "normal",
            )
    top.set_xlim(0, max(a.num_samples, 1))
    top.set_ylim(0, max(a.num_replicas, 1))
    top.set_yticks(
        [a.num_replicas - 1 - r + 0.45 for r in range(a.num_replicas)],
        [f"rank {r}" for r in range(a.num_replicas)],
    )
    top.set_xticks([])
    top.set_title(
        _t(
            "What each rank reads: num_samples={num_samples}, "
            "total_size={total_size} (hatched: padding, a repeated sample)",
            num_samples=a.num_samples,
            total_size=a.total_size,
        ),
        fontsize=10,
    )

    counts = [0] * a.dataset_len
    for shard in a.shards:
        for sample in shard:
            counts[sample] += 1
    for sample in range(a.dataset_len):
        ranks = a.owners(sample)
        face = "lightgrey" if not ranks else colors(ranks[0] % 10)
        bottom.add_patch(
            Rectangle(
                (sample, 0),
                0.95,
                0.9,
                facecolor=face,
                alpha=alpha(ranks[0]) if ranks else 1.0,
                edgecolor="black",
            )
        )
        label = (
            "x"
            if not ranks
            else (str(sample) if counts[sample] == 1 else f"{sample}×{counts[sample]}")
        )
        bottom.text(sample + 0.47, 0.45, label, ha="center", va="center", fontsize=8)
    bottom.set_xlim(0, max(a.dataset_len, 1))
    bottom.set_ylim(0, 1)
    bottom.set_xticks([])
    bottom.set_yticks([])
    bottom.set_title(
        _t(
            "The dataset, coloured by rank: {dropped} dropped (x, grey), "
            "{total_size} padded slots (×k: read k times)",
            dropped=len(a.dropped),
            total_size=a.total_size - a.dataset_len + len(a.dropped),
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def sampler_widget(dataset_len: int = 10, num_replicas: int = 4, max_len: int = 40) -> Any:
    """Sliders and checkboxes for every sampler argument, redrawing the assignment grid."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    check_arguments(dataset_len, num_replicas)
    style = {"description_width": "initial"}
    n = W.IntSlider(dataset_len, 0, max_len, description=_t("dataset length"), style=style)
    replicas = W.IntSlider(num_replicas, 1, 8, description="num_replicas", style=style)
    rank = W.IntSlider(
        0,
        -1,
        num_replicas - 1,
        description=_t("highlight rank (-1: all)"),
        style=style,
    )
    shuffle = W.Checkbox(True, description="shuffle")
    drop_last = W.Checkbox(False, description="drop_last")
    seed = W.IntText(0, description="seed", style=style)
    epoch = W.IntSlider(0, 0, 9, description="epoch (set_epoch)", style=style)
    out = W.Output()
    controls = W.VBox([W.HBox([n, replicas, rank]), W.HBox([shuffle, drop_last, seed, epoch])])
    box = W.VBox([controls, out])

    def redraw(_: Any = None) -> None:
        rank.max = replicas.value - 1
        a = assignment_grid(
            n.value, replicas.value, shuffle.value, drop_last.value, seed.value, epoch.value
        )
        box.assignment = a  # what is on screen, for tests and for curious learners
        with out:
            out.clear_output(wait=True)
            fig = draw_assignment(a, None if rank.value < 0 else rank.value)
            plt.show()
            plt.close(fig)

    for w in (n, replicas, rank, shuffle, drop_last, seed, epoch):
        w.observe(redraw, names="value")
    redraw()
    return box
