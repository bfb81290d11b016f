"""ranks: the rank arithmetic against real torchrun launches, CUDA_VISIBLE_DEVICES (chapter 02's
checker: tests/course/checks/test_ch02.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddp_lab.tools import ranks


def _model_from_torchrun(seen: list[dict], gpus: int = 4) -> list[ranks.Proc]:
    nodes = sorted(
        {(r["GROUP_RANK"], r["LOCAL_WORLD_SIZE"], r["CUDA_VISIBLE_DEVICES"]) for r in seen}
    )
    return ranks.assign(
        [n for _, n, _ in nodes], cuda_visible_devices=[c for _, _, c in nodes], gpus_per_node=gpus
    )


@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_assign_matches_torchrun_two_nodes_of_different_sizes(rdzv: str) -> None:
    """Oracle: torchrun --nnodes=2 on localhost, one agent per simulated node."""
    seen = ranks.torchrun_assignment([2, 3], ["3,1", None], rdzv_backend=rdzv)
    model = _model_from_torchrun(seen)
    assert [
        (p.rank, p.local_rank, p.node_rank, p.world_size, p.local_world_size) for p in model
    ] == [
        (r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"], r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"])
        for r in seen
    ]
    assert len(seen) == 5 and {r["WORLD_SIZE"] for r in seen} == {5}
    if rdzv == "static":  # node ranks are the --node_rank we gave
        assert [r["GROUP_RANK"] for r in seen] == [r["agent"] for r in seen]
    # torchrun passes CUDA_VISIBLE_DEVICES through unchanged; the GPU is the local_rank-th entry
    for p, r in zip(model, seen, strict=True):
        if r["CUDA_VISIBLE_DEVICES"] == "3,1":
            assert p.gpu == [3, 1][p.local_rank]


def test_visible_gpus_rules() -> None:
    assert ranks.visible_gpus(None, 4) == [0, 1, 2, 3]
    assert ranks.visible_gpus("", 4) == []
    assert ranks.visible_gpus("-1", 4) == []
    assert ranks.visible_gpus("2,0", 4) == [2, 0]
    assert ranks.visible_gpus("1,7,2", 4) == [1]  # stops at the first invalid entry
    assert ranks.visible_gpus("GPU-8a3f,1", 4) == ["GPU-8a3f", 1]


@given(st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_assign_ranks_are_a_permutation_and_contiguous_per_node(counts: list[int]) -> None:
    procs = ranks.assign(counts)
    assert [p.rank for p in procs] == list(range(sum(counts)))
    for node, n in enumerate(counts):
        mine = [p for p in procs if p.node_rank == node]
        assert [p.local_rank for p in mine] == list(range(n))
        assert mine[0].rank == sum(counts[:node])
        assert all(p.world_size == sum(counts) and p.local_world_size == n for p in mine)


def test_assign_more_processes_than_visible_gpus() -> None:
    procs = ranks.assign(3, nnodes=1, cuda_visible_devices="5,6", gpus_per_node=8)
    assert [p.gpu for p in procs] == [5, 6, None]
    assert [p.device for p in procs] == ["cuda:0", "cuda:1", None]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(nproc_per_node=0),
        dict(nproc_per_node=2, nnodes=0),
        dict(nproc_per_node=[2, 2], nnodes=3),
        dict(nproc_per_node=2, nnodes=2, cuda_visible_devices=["0"]),
        dict(nproc_per_node=True),
    ],
)
def test_assign_rejects_bad_input(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ranks.assign(**kwargs)


def _sleep_on_rank_1() -> None:
    import os
    import time

    time.sleep(0.4 if os.environ["RANK"] == "1" else 0.0)


def _sleep() -> None:
    import time

    time.sleep(0.3)


def _arrive_slowly() -> Callable[[], None]:
    import time

    time.sleep(0.5)
    return _sleep


class _SlowToArrive:
    """The 0.3 s job, which takes 0.5 s to arrive in each rank (to be unpickled there, before
    the rank's function runs): a start of the ranks at least that long, whatever the launcher's
    speed (from its zygote a launch can take less than 0.2 s)."""

    def __call__(self) -> None:
        _sleep()

    def __reduce__(self) -> tuple:
        return (_arrive_slowly, ())


def test_timed_in_processes_counts_the_job_not_the_start_of_the_ranks() -> None:
    """Chapter 02's "2 processes" time: a 0.3 s job on both ranks is 0.3 s, however long the
    ranks take to start (the start is not in it, and is not subtracted either)."""
    import time

    start = time.perf_counter()
    seconds = ranks.timed_in_processes(_SlowToArrive(), nprocs=2)
    launch = time.perf_counter() - start
    assert launch >= 0.5 + 0.3  # the ranks' start took at least 0.5 s ...
    assert 0.3 <= seconds < 0.3 + 0.25, seconds  # ... and is not in the time
    # the slower rank decides
    assert ranks.timed_in_processes(_sleep_on_rank_1, nprocs=2) >= 0.4
