"""parallel_apply: threads, order, devices, grad mode, and errors from a replica."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from ddp_lab.parallel import current_device, get_device, parallel_apply


class Probe(nn.Module):
    """Records which thread and simulated device ran it."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.seen: list[tuple[str, int]] = []

    def forward(self, x: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
        self.seen.append((threading.current_thread().name, current_device()))
        return x * self.scale + offset


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise KeyError("bad key in this replica")


def test_outputs_in_replica_order_on_their_devices() -> None:
    mods = [Probe(float(i)) for i in range(3)]
    xs = [torch.ones(2) for _ in range(3)]
    outs = parallel_apply(mods, xs, [{"offset": 10.0}] * 3, devices=[0, 1, 2])
    assert [o.tolist() for o in outs] == [[10.0, 10.0], [11.0, 11.0], [12.0, 12.0]]
    assert [get_device(o) for o in outs] == [0, 1, 2]
    assert [m.seen for m in mods] == [[(f"replica-{i}", i)] for i in range(3)]


def test_exception_names_the_replica() -> None:
    with pytest.raises(KeyError, match="in replica 1 on device 1"):
        parallel_apply([Probe(1.0), Boom(), Probe(1.0)], [torch.ones(1)] * 3)


def test_grad_mode_reaches_the_threads() -> None:
    w = torch.ones(1, requires_grad=True)
    mods = [Probe(1.0), Probe(2.0)]
    xs = [(w * 1,), (w * 2,)]
    assert all(o.requires_grad for o in parallel_apply(mods, xs))
    with torch.no_grad():
        assert not any(o.requires_grad for o in parallel_apply(mods, xs))


def test_single_replica_runs_in_the_caller() -> None:
    m = Probe(1.0)
    parallel_apply([m], [torch.ones(1)])
    assert m.seen[0][0] == threading.current_thread().name


@pytest.mark.parametrize("kwargs", [{"kwargs_tup": [{}]}, {"devices": [0]}])
def test_length_mismatch(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="not equal"):
        parallel_apply([Probe(1.0), Probe(1.0)], [torch.ones(1)] * 2, **kwargs)
    with pytest.raises(ValueError, match="not equal"):
        parallel_apply([Probe(1.0)], [torch.ones(1)] * 2)
