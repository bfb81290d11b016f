"""Traced %%ranks cells: one merged trace per cell, the persistent ranks' profilers off after it."""

from __future__ import annotations

import glob
import json
import os
import tempfile

import pytest

import ddp_lab as dl
from ddp_lab.runtime import persistent
from ddp_lab.tools import trace_analysis as ta

run = persistent.run_cell
PROFILING = "torch._C._autograd._profiler_enabled()"


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    private = tmp_path_factory.mktemp("tmp")  # the cells' temporary trace folders go here
    saved, tempfile.tempdir = tempfile.tempdir, str(private)
    dl.start(2, backend="gloo", timeout=60)
    try:
        yield private
    finally:
        dl.stop()
        tempfile.tempdir = saved


def names(data):
    return {
        e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"
    }


def test_a_traced_cell_writes_one_trace_of_every_rank(group, tmp_path, capfd):
    run("x = torch.ones(64)\n")  # made before: only the next cell's work is in the trace
    path = tmp_path / "cell.json"
    run(
        "with torch.profiler.record_function('scale'):\n    y = x * (rank + 1)\n"
        "dist.all_reduce(y)\nprint(y[0].item())\n",
        trace=str(path),
    )
    assert capfd.readouterr().out.splitlines() == ["[rank 0] 3.0", "[rank 1] 3.0"]
    data = json.loads(path.read_text())
    assert names(data) == {0: "rank 0", 1: "rank 1"}
    assert "missing_ranks" not in data["ddp_lab"]
    runs = ta.load(data)
    for rank in (0, 1):
        assert [(c.kind, c.bytes) for c in runs[rank].calls] == [("all_reduce", 256)]
        assert [name for name, _, _ in runs[rank].ranges] == ["scale"]
    for rank in (0, 1):
        [ar] = [
            e
            for e in data["traceEvents"]
            if e.get("ph") == "X" and e["pid"] == rank and e["name"] == "gloo:all_reduce"
        ]
        assert (ar["args"]["kind"], ar["args"]["bytes"], ar["args"]["seq"]) == (
            "all_reduce",
            256,
            1,
        )
    assert dl.pull(PROFILING) == [False, False]  # the ranks live on, their profilers off
    assert glob.glob(os.path.join(group, "ddp_lab_trace_*")) == []  # rank files removed

    # The next cell is not traced: no file, no profiler.
    run("z = torch.ones(8)\ndist.all_reduce(z)\nprofiling = " + PROFILING + "\n")
    assert dl.pull("profiling") == [False, False]
    assert json.loads(path.read_text()) == data  # the traced cell's file is left as it was


def test_a_failing_traced_cell_still_writes_and_the_group_goes_on(group, tmp_path, capfd):
    path = tmp_path / "fail.json"
    source = "t = torch.ones(4)\ndist.all_reduce(t)\nif rank == 1:\n    raise ValueError('late')\n"
    with pytest.raises(dl.DistributedError, match="late"):
        run(source, trace=str(path))
    runs = ta.load(path)
    assert [len(runs[r].calls) for r in (0, 1)] == [1, 1]
    assert dl.pull(PROFILING) == [False, False]
    # A second traced cell counts its ranks afresh (its own start key) and works.
    again = tmp_path / "again.json"
    run("dist.barrier()\n", trace=str(again))
    assert [len(r.calls) for r in ta.load(again).values()] == [1, 1]
    capfd.readouterr()


def test_some_ranks_only_and_bad_names(group, tmp_path):
    path = tmp_path / "one.json"
    run("u = torch.ones(3) @ torch.ones(3)\n", ranks=[1], trace=str(path))
    assert list(ta.load(path)) == [1]
    assert "missing_ranks" not in json.loads(path.read_text())["ddp_lab"]
    with pytest.raises(ValueError, match="does not exist"):
        run("print('never')\n", trace=str(tmp_path / "no" / "x.json"))
    assert dl.pull(PROFILING) == [False, False]


def test_a_traced_cell_that_times_out_merges_what_finished(group, tmp_path, capfd):
    path = tmp_path / "hang.json"
    source = "t = torch.ones(2)\nif rank == 0:\n    dist.recv(t, src=1)\n"  # rank 1 never sends
    with pytest.raises(dl.DistributedTimeoutError, match="STATE IS LOST"):
        run(source, timeout=3, trace=str(path))
    data = json.loads(path.read_text())
    assert names(data) == {1: "rank 1"}  # rank 0 was stopped before it could export
    assert data["ddp_lab"]["missing_ranks"] == [0]
    assert dl.pull(PROFILING) == [False, False]  # the restarted ranks trace nothing
    assert glob.glob(os.path.join(group, "ddp_lab_trace_*")) == []
    capfd.readouterr()


def test_the_ranks_magic_takes_trace(group, tmp_path, capfd):
    from IPython.testing import globalipapp

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # once per process
    ip.run_line_magic("load_ext", "ddp_lab")
    path = tmp_path / "magic.json"
    ip.run_cell_magic("ranks", f"-r 0,1 --trace {path}", "dist.barrier()\n")
    assert [[c.kind for c in r.calls] for r in ta.load(path).values()] == [["barrier"]] * 2
    capfd.readouterr()


def test_an_interrupted_traced_cell_writes_and_stops_the_profilers(group, tmp_path, capfd):
    import signal
    import threading

    path = tmp_path / "interrupted.json"
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt, match="keeps its variables"):
        run("import time\nwhile True:\n    time.sleep(0.01)\n", trace=str(path))
    assert names(json.loads(path.read_text())) == {0: "rank 0", 1: "rank 1"}
    assert dl.pull(PROFILING) == [False, False]
    capfd.readouterr()
