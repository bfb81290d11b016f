"""Stress: many DDP launches from the preloaded zygote, and many persistent-group restarts.

The zygote preloads DDP's modules (torch._dynamo, sympy, ...) and forks the ranks from that
state; ranks keep the process groups they destroy (see ``_rank.keep_process_groups``). Either
could hang a rank or leave something behind, and a hang shows up only now and then, so this
runs them many times: a launch that hangs fails by its timeout, and after every launch no rank
process may be left, and at the end no port may still listen or be connected and no file may
be left in /dev/shm.
"""

from __future__ import annotations

import os
import time

from conftest import ports_in_use, rank_processes, shm_files, shm_left

import ddp_lab as dl
from ddp_lab.runtime import launcher, persistent
from ddp_lab.runtime._rank_group import alive

LAUNCHES = 100
RESTARTS = 20
HANG_S = 60  # far above a launch's time on a loaded 2-core machine


def ddp_step(rank: int) -> tuple[bool, int, float]:
    """Build a small DDP, run one training step; say whether DDP's modules were preloaded."""
    import sys

    import torch
    import torch.distributed as dist

    preloaded = "torch._dynamo" in sys.modules
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(rank)
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    weight = float(model.module.weight.sum())
    dist.destroy_process_group()
    del model, opt  # the group's last reference goes here, as in most learners' code
    return preloaded, int(os.environ["MASTER_PORT"]), weight


def test_100_ddp_launches_no_hang_no_leak(no_leaks, capfd):
    assert launcher.wait_warm(), "the zygote never finished its preload"
    ports = set()
    for i in range(LAUNCHES):
        results = dl.spawn(ddp_step, nprocs=2, timeout=HANG_S)
        out, err = capfd.readouterr()
        # A launch that went well shows nothing of torch's C++ (a store call that lost rank 0's
        # server prints "recvValue failed ..." and a stack; _rank.finish_together)
        assert "Exception raised from" not in out + err, f"launch {i}:\n{out}{err}"
        assert all(pre for pre, _, _ in results), f"launch {i}: DDP's modules were not preloaded"
        assert results[0][2] == results[1][2], f"launch {i}: the ranks' weights differ after a step"
        assert rank_processes() == set(), f"launch {i} left rank processes"
        ports.add(results[0][1])
    # A port drawn for every launch, never a fixed one. The zygote's bind(0) draws from the
    # kernel's ephemeral range (28,232 ports by default, of which bind may keep to one half), so
    # 100 draws repeat one by chance alone: 1 - exp(-100*99/2/N), 16% for N = 28,232, more for
    # half of it. A port still in TIME_WAIT is not drawn again, so only a run that outlasts
    # TIME_WAIT's 60 s (a loaded machine) sees repeats. A few are chance; a fixed port would
    # repeat 99 times.
    assert len(ports) >= LAUNCHES - 5, sorted(ports)
    deadline = time.monotonic() + 10
    while ports_in_use(ports) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ports_in_use(ports) == []


DDP_CELL = """
preloaded = "torch._dynamo" in __import__("sys").modules
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
torch.manual_seed(rank)
model(torch.randn(4, 8)).square().mean().backward()
grad = float(model.module.weight.grad.sum())
"""


def test_20_persistent_restarts_no_hang_no_leak(capfd):
    shm_before = shm_files()
    dl.start(2, backend="gloo", timeout=HANG_S)
    group = persistent.current()
    zygote = group.zygote.proc.pid
    try:
        for i in range(RESTARTS + 1):
            persistent.run_cell(DDP_CELL)
            assert dl.pull("preloaded") == [True, True], f"round {i}: no preload"
            grads = dl.pull("grad")
            assert grads[0] == grads[1], f"round {i}: DDP did not average the gradients"
            out, err = capfd.readouterr()  # a restart and a cell show nothing of torch's C++
            assert "Exception raised from" not in out + err, f"round {i}:\n{out}{err}"
            if i == RESTARTS:
                break
            old = {"pids": set(group.pids.values()), "port": group.port, "dir": group.workdir}
            group._restart()  # what a timeout or a dead rank does
            assert group.zygote.proc.pid == zygote  # restarts reuse the preloaded zygote
            deadline = time.monotonic() + 10
            while any(alive(p) for p in old["pids"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not [p for p in old["pids"] if alive(p)], f"restart {i} left ranks"
            assert ports_in_use({old["port"]}) == [], f"restart {i} left its port in use"
            assert not os.path.exists(old["dir"]), f"restart {i} left its folder"
    finally:
        pids, port, workdir = set(group.pids.values()), group.port, group.workdir
        dl.stop()
    capfd.readouterr()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids | {zygote}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids | {zygote} if alive(p)]
    assert ports_in_use({port}) == [] and not os.path.exists(workdir)
    assert shm_left(shm_before) == set()
