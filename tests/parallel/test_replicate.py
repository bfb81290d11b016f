"""replicate: replicas compute like the original; backward sums their gradients into it."""

from __future__ import annotations

import torch
from torch import nn

from ddp_lab.parallel import get_device, replicate, trace


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 2)).double()


def test_replicas_compute_like_the_original() -> None:
    net = _net().eval()
    x = torch.randn(6, 4, dtype=torch.float64)
    for replica in replicate(net, [0, 1, 2]):
        assert torch.equal(replica(x), net(x))


def test_first_replica_shares_storage_others_are_copies() -> None:
    net = _net()
    with trace() as tr:
        r0, r1 = replicate(net, [0, 1])
    w = net[0].weight
    assert r0[0].weight.data_ptr() == w.data_ptr()
    assert r1[0].weight.data_ptr() != w.data_ptr() and get_device(r1[0].weight) == 1
    # buffers without grad are shared on device 0: BatchNorm's in-place update survives
    assert r0[1].running_mean is net[1].running_mean
    assert r1[1].running_mean is not net[1].running_mean
    n_bytes = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])
    assert sum(e.nbytes for e in tr.copies("broadcast")) == n_bytes
    # replicas hold copies with a grad_fn, not leaf Parameters
    assert list(r1.parameters()) == [] and r1[0].weight.grad_fn is not None


def test_backward_sums_replica_gradients_into_the_original() -> None:
    net = _net()
    xs = [torch.randn(3, 4, dtype=torch.float64) for _ in range(3)]
    replicas = replicate(net, [0, 1, 2])
    sum(r(x).pow(2).sum() for r, x in zip(replicas, xs, strict=True)).backward()
    got = [p.grad.clone() for p in net.parameters()]
    # oracle: the same three forwards with the original module on one device
    net.zero_grad()
    sum(net(x).pow(2).sum() for x in xs).backward()
    for g, p in zip(got, net.parameters(), strict=True):
        assert torch.allclose(g, p.grad)


def test_detach_gives_plain_copies() -> None:
    net = _net()
    r = replicate(net, [0, 1], detach=True)[1]
    assert r[0].weight.grad_fn is None and not r[0].weight.requires_grad
    assert replicate(net, []) == []
