"""%%ddp: the cell body runs on N ranks with the group ready and notebook names available."""

from __future__ import annotations

import threading

import pytest
import torch

from ddp_lab.runtime import launcher, magic


def helper_double(x):
    return 2 * x


def test_cell_sees_rank_world_size_device_and_notebook_names(capfd, no_leaks):
    class Box:
        def __init__(self, v):
            self.v = v

    user_ns = {
        "helper_double": helper_double,
        "Box": Box,
        "base": torch.tensor([1.0]),
        "unused": threading.Lock(),
    }  # not used by the cell: must not be sent
    source = (
        "t = base * (rank + 1)\n"
        "dist.all_reduce(t)\n"
        "print(rank, world_size, device, helper_double(t.item()), Box(3).v)\n"
    )
    magic.run_cell(source, user_ns, nprocs=3, backend="gloo")
    out = capfd.readouterr().out.splitlines()
    assert out == [f"[rank {r}] {r} 3 cpu 12.0 3" for r in range(3)]


def test_used_names_include_nested_code():
    code = compile("def f():\n    return g(h)\nx = y\n", "<t>", "exec")
    assert {"g", "h", "y", "f", "x"} <= magic.used_names(code)


def test_unpicklable_name_is_reported_before_start():
    with pytest.raises(ValueError, match="'lock'"):
        magic.run_cell("print(lock)", {"lock": threading.Lock()}, nprocs=2, backend="gloo")


def test_exception_in_cell_names_rank(no_leaks):
    with pytest.raises(launcher.DistributedError) as info:
        magic.run_cell("if rank == 1:\n    raise KeyError('oops')\n", {}, nprocs=2, backend="gloo")
    assert info.value.ranks == [1]
    assert "KeyError" in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="nprocs"):
        magic.run_cell("pass", {}, nprocs=0)
    with pytest.raises(ValueError, match="backend"):
        magic.run_cell("pass", {}, nprocs=2, backend="carrier-pigeon")


def test_magic_registers_in_ipython(capfd, no_leaks):
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()  # None when another test started it in this process
    ip.run_line_magic("load_ext", "ddp_lab")
    ip.user_ns["offset"] = 5
    ip.run_cell_magic("ddp", "-n 2 --backend gloo --timeout 60", "print(rank + offset)\n")
    assert capfd.readouterr().out.splitlines()[-2:] == ["[rank 0] 5", "[rank 1] 6"]
