"""ddp_lab.tools.errors: every CPU row of the table is triggered for real and recognised."""

from __future__ import annotations

import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.labs import launch_demo as ld
from ddp_lab.tools import errors


def _mismatch(rank: int, same_op: bool) -> None:
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()
    dist.init_process_group("gloo")
    if same_op:
        dist.all_reduce(torch.ones(3 + rank))
    elif rank == 0:
        dist.all_reduce(torch.ones(3))
    else:
        dist.broadcast(torch.ones(3), src=0)


def _skip(rank: int) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(5)


def _late(rank: int) -> None:
    dist.init_process_group("gloo")
    if rank == 1:
        time.sleep(4)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))


def _uneven(rank: int) -> None:
    # Without DETAIL, gloo lets rank 0 finish; rank 1 then finds its peer gone.
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(3 + rank))


def _port(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def _lonely(rank: int) -> None:
    dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=2))


def _no_env(rank: int) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key)
    dist.init_process_group("gloo")


def _interface(rank: int) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "eth9"
    dist.init_process_group("gloo")


def _local_rank(rank: int) -> None:
    dist.local_rank()


class _Unused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _ddp_unused(rank: int) -> None:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(_Unused())
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()


CASES = [
    ("collective_mismatch", _mismatch, (False,), 2),
    ("shape_mismatch", _mismatch, (True,), 2),
    ("recv_timeout", _skip, (), 2),
    ("monitored_barrier", _late, (), 2),
    ("peer_closed", _uneven, (), 2),
    ("store_timeout", _lonely, (), 1),
    ("env_not_set", _no_env, (), 1),
    ("no_interface", _interface, (), 2),
    ("no_local_rank", _local_rank, (), 1),
    ("unused_parameters", _ddp_unused, (), 2),
]


@pytest.mark.parametrize(("key", "fn", "args", "nprocs"), CASES, ids=[c[0] for c in CASES])
def test_real_error_is_recognised(key: str, fn, args: tuple, nprocs: int, capsys) -> None:
    with errors.expect(key) as caught:
        dl.spawn(fn, args=args, nprocs=nprocs, quiet=True, timeout=60)
    assert isinstance(caught.error, dl.DistributedError)
    assert key in [e.key for e in errors.diagnose(caught.error)]
    assert errors.get(key).cause["en"] in capsys.readouterr().out


def test_address_in_use_is_recognised() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with errors.expect("address_in_use"):
            dl.spawn(_port, args=(busy.getsockname()[1],), nprocs=1, quiet=True, timeout=60)


def test_launcher_errors_are_recognised() -> None:
    cmd = [
        a.replace("--master_addr", "--master_adderss")
        for a in ld.torchrun_command("env", 2, nnodes=2, node_rank=0)
    ]
    assert [e.key for e in errors.diagnose(ld.run(cmd, timeout=60))] == ["bad_flag"]
    crash = ld.torchrun("crash", nproc_per_node=2, timeout=120)
    assert "child_failed" in [e.key for e in errors.diagnose(crash)]
    signalled = ld.signal_agent("sleep", timeout=120)
    assert "death_signal" in [e.key for e in errors.diagnose(signalled)]


def test_expect_fails_when_nothing_fails_or_the_error_differs() -> None:
    with pytest.raises(AssertionError, match="without one"):
        with errors.expect("address_in_use"):
            pass
    with pytest.raises(AssertionError, match="different one"):
        with errors.expect("address_in_use"):
            raise RuntimeError("something else")
    with pytest.raises(KeyboardInterrupt):
        with errors.expect("address_in_use"):
            raise KeyboardInterrupt


def test_explain_prints_the_diagnosis_and_returns_nothing(capsys) -> None:
    """A lesson cell ends with ``errors.explain(...)``: its lines, and no entry repr after them."""
    text = "torchrun: error: unrecognized arguments: --master_adderss=10.0.0.1"
    assert errors.explain(text, "bad_flag", "en") is None
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"message: {text}"
    assert errors.get("bad_flag").fix["en"] in out
    with pytest.raises(AssertionError, match="different one"):
        errors.explain(text, "env_not_set")


def test_unknown_key_gives_a_clear_error() -> None:
    with pytest.raises(ValueError, match="Unknown error key"):
        errors.get("nope")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_table_is_complete_in_both_languages(lang: str) -> None:
    rows = errors.rows(lang)
    assert len(rows) == len(errors.TABLE) == len({r["key"] for r in rows})
    assert all(r["cause"] and r["fix"] for r in rows)
    for entry in errors.TABLE:  # the short message in the table is recognised itself
        assert entry.matches(entry.message), entry.key
    assert "<table>" in errors.show_table(lang).data
