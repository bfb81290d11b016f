"""Tests of ddp_lab.labs.bench_allreduce: sizes, the bus-bandwidth factor, a tiny real run."""

from __future__ import annotations

import matplotlib
import pytest

from ddp_lab.labs import bench_allreduce as bench

matplotlib.use("Agg")


def test_parse_size_and_sweep():
    assert bench.parse_size("64K") == 65536
    assert bench.parse_size("16M") == 16 * 2**20
    assert bench.parse_size("1kb") == 1024
    assert bench.size_sweep("1K", "16K", 4) == [1024, 4096, 16384]
    for bad in ("0", "abc", "-5K"):
        with pytest.raises(ValueError):
            bench.parse_size(bad)


def test_bus_factor_is_2_n_minus_1_over_n():
    assert bench.bus_factor(1) == 1.0
    assert bench.bus_factor(2) == 1.0
    assert bench.bus_factor(4) == 1.5


def test_small_run_is_correct_and_prints_a_table(capsys):
    rows = bench.run(3, sizes=["4K", "64K"], iters=2, warmup=1)
    assert {r["impl"] for r in rows} == {"ring", "torch"}
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows)
    for r in rows:
        assert r["busbw"] == pytest.approx(r["algbw"] * 4 / 3)
    out = capsys.readouterr().out
    assert "busbw" in out and "ring/torch" in out and len(out.splitlines()) == 4
    ax = bench.plot(rows)
    assert len(ax.lines) == 2


def test_bad_arguments_fail_before_starting():
    with pytest.raises(ValueError):
        bench.run(2, impls=["nccl-tests"])
    with pytest.raises(ValueError):
        bench.run(2, iters=0)


def test_cli(capsys):
    assert bench.main(["-n", "2", "-b", "1K", "-e", "2K", "-f", "2", "-i", "1", "-w", "0"]) == 0
    assert "nprocs=2" in capsys.readouterr().out
