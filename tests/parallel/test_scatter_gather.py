"""scatter / scatter_kwargs / gather against torch.chunk, torch.split and torch.cat."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_lab.parallel import gather, get_device, scatter, scatter_kwargs, trace


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 20), n=st.integers(1, 6), dim=st.integers(0, 1))
def test_scatter_matches_torch_chunk(rows: int, n: int, dim: int) -> None:
    x = torch.randn(rows, rows + 1) if dim == 0 else torch.randn(3, rows)
    chunks = scatter(x, list(range(n)), dim)
    expected = x.chunk(n, dim)  # the oracle: what torch's C++ scatter splits with
    assert isinstance(chunks, tuple)
    assert len(chunks) == len(expected) <= n
    for i, (c, e) in enumerate(zip(chunks, expected, strict=True)):
        assert torch.equal(c, e)
        assert get_device(c) == i


def test_batch_smaller_than_devices_uses_fewer_devices() -> None:
    assert len(scatter(torch.arange(3), [0, 1, 2, 3])) == 3
    # torch.chunk rounds the chunk size up: 6 rows on 4 devices give 3 chunks of 2
    assert [len(c) for c in scatter(torch.arange(6), [0, 1, 2, 3])] == [2, 2, 2]


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=5))
def test_scatter_with_chunk_sizes_matches_split(sizes: list[int]) -> None:
    x = torch.randn(sum(sizes), 2)
    chunks = scatter(x, list(range(len(sizes))), chunk_sizes=sizes)
    for c, e in zip(chunks, x.split(sizes), strict=True):
        assert torch.equal(c, e)


@pytest.mark.parametrize("sizes", [[2, 2], [4, 0, 1], [5], [2, 2, 2], [True, 4]])
def test_bad_chunk_sizes_fail_before_copying(sizes: list[int]) -> None:
    x = torch.randn(5, 2)
    with trace() as tr, pytest.raises(ValueError, match="chunk_sizes"):
        scatter(x, list(range(len(sizes) if len(sizes) != 1 else 2)), chunk_sizes=sizes)
    assert tr.copies() == []


Point = collections.namedtuple("Point", "x y")


def test_nested_inputs_follow_torch_rules() -> None:
    x, y = torch.arange(4.0), torch.arange(8.0).view(4, 2)
    flag = object()
    out = scatter((x, {"y": y, "flag": flag}, [x], Point(x, 3)), [0, 1])
    assert isinstance(out, list) and len(out) == 2
    for i, (xi, di, li, pi) in enumerate(out):
        assert torch.equal(xi, x.chunk(2)[i])
        assert torch.equal(di["y"], y.chunk(2)[i])
        assert di["flag"] is flag  # non-tensors are shared by reference, not copied
        assert isinstance(li, list) and torch.equal(li[0], x.chunk(2)[i])
        assert isinstance(pi, Point) and pi.y == 3
    # a non-tensor or an empty container is repeated once per device
    assert scatter(7, [0, 1, 2]) == [7, 7, 7]
    assert scatter((), [0, 1]) == [(), ()]


def test_scatter_kwargs_pads_the_shorter_side() -> None:
    x = torch.arange(6.0)
    inputs, kwargs = scatter_kwargs((x,), {}, [0, 1, 2])
    assert len(inputs) == 3 and kwargs == ({}, {}, {})
    inputs, kwargs = scatter_kwargs((), {"x": x}, [0, 1, 2])
    assert (
        inputs == ((), (), ())
        and [torch.equal(k["x"], c) for k, c in zip(kwargs, x.chunk(3), strict=True)] == [True] * 3
    )
    assert scatter_kwargs((), {}, [0, 1]) == ((), ())


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4), dim=st.integers(0, 1))
def test_gather_values_and_backward_match_cat(sizes: list[int], dim: int) -> None:
    shape = (lambda s: (s, 3)) if dim == 0 else (lambda s: (2, s))
    parts = [torch.randn(*shape(s), dtype=torch.float64, requires_grad=True) for s in sizes]
    for i, p in enumerate(parts):
        p._sim_device = i + 1
    weight = torch.randn(*shape(sum(sizes)), dtype=torch.float64)
    out = gather(parts, 0, dim)
    assert get_device(out) == 0
    (out * weight).sum().backward()
    got = [p.grad.clone() for p in parts]
    # the oracle: the same function computed with torch.cat on one device
    leaves = [p.detach().clone().requires_grad_() for p in parts]
    ref = torch.cat(leaves, dim)
    (ref * weight).sum().backward()
    assert torch.equal(out, ref)
    for g, leaf in zip(got, leaves, strict=True):
        assert torch.allclose(g, leaf.grad)


def test_scatter_backward_gathers_the_gradient() -> None:
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 3, dtype=torch.float64)
    with trace() as tr:
        chunks = scatter(x, [0, 1, 2])
        sum((c * wc).sum() for c, wc in zip(chunks, w.chunk(3), strict=True)).backward()
    assert torch.allclose(x.grad, w)
    # every chunk went host -> device, and every chunk's gradient came back to the host
    assert {(e.src, e.dst) for e in tr.copies("scatter")} == {(-1, 0), (-1, 1), (-1, 2)}
    assert {(e.src, e.dst) for e in tr.copies("gather_grad")} == {(0, -1), (1, -1), (2, -1)}


def test_gather_of_scalars_returns_a_vector_like_torch() -> None:
    losses = [torch.tensor(1.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = gather(losses, 0)
    assert out.shape == (2,) and any("scalars" in str(w.message) for w in caught)
    out.mean().backward()
    assert [loss.grad.item() for loss in losses] == [0.5, 0.5]
    assert losses[0].grad.shape == ()


def test_gather_structures() -> None:
    a = [{"y": torch.ones(1), "none": None}, {"y": torch.zeros(2), "none": None}]
    out = gather(a, 0)
    assert torch.equal(out["y"], torch.tensor([1.0, 0.0, 0.0])) and out["none"] is None
    with pytest.raises(ValueError, match="keys"):
        gather([{"a": torch.ones(1)}, {"a": torch.ones(1), "b": torch.ones(1)}], 0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for torch's scatter")
def test_same_chunks_as_torch_on_gpus() -> None:
    import torch.nn.parallel as tp

    x = torch.randn(7, 3)
    ours, theirs = scatter(x, [0, 1]), tp.scatter(x, [0, 1])
    assert [c.shape for c in ours] == [c.shape for c in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b.cpu())
