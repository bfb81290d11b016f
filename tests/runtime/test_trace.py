"""Traced launches: one merged Chrome trace of a real 2-rank gloo run (spawn and %%ddp)."""

from __future__ import annotations

import glob
import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.runtime import _trace, magic
from ddp_lab.tools import trace_analysis as ta


def traced_work(rank):
    from torch.profiler import record_function

    with record_function("my work"):
        x = torch.ones(1000) @ torch.ones(1000, 10)
    t = torch.ones(256)
    dist.all_reduce(t)
    if rank == 0:
        dist.send(torch.ones(10, dtype=torch.float64), dst=1)
    else:
        dist.recv(torch.empty(10, dtype=torch.float64), src=0)
    dist.barrier()
    return float(x.sum())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "run.json"
    private = tmp_path_factory.mktemp("tmp")  # the launch's temporary folders go here
    saved, tempfile.tempdir = tempfile.tempdir, str(private)
    try:
        results = dl.spawn(traced_work, nprocs=2, backend="gloo", trace=str(path))
    finally:
        tempfile.tempdir = saved
    with open(path) as f:
        return results, json.load(f), set(glob.glob(os.path.join(private, "ddp_lab_trace_*")))


def comm_events(data, rank, name):
    return [
        e
        for e in data["traceEvents"]
        if e.get("ph") == "X" and e["pid"] == rank and e["name"] == name
    ]


def test_one_trace_with_a_process_per_rank(run):
    results, data, left = run
    assert results == [10000.0, 10000.0]
    assert left == set()  # the ranks' own traces were removed after the merge
    names = {
        e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}
    assert data["ddp_lab"]["world_size"] == 2
    assert {e["pid"] for e in data["traceEvents"]} == {0, 1}


def test_communication_calls_carry_kind_bytes_seq_and_peer(run):
    _, data, _ = run
    for rank in (0, 1):
        [ar] = comm_events(data, rank, "gloo:all_reduce")
        assert (ar["args"]["kind"], ar["args"]["bytes"], ar["args"]["seq"]) == (
            "all_reduce",
            1024,
            1,
        )
        assert comm_events(data, rank, "gloo:barrier")
    [send] = comm_events(data, 0, "gloo:send")
    [recv] = comm_events(data, 1, "gloo:recv")
    assert (send["args"]["peer"], send["args"]["bytes"]) == (1, 80)
    assert (recv["args"]["peer"], recv["args"]["bytes"]) == (0, 80)
    # One clock: the receive cannot end before the send was called, and the all-reduce ends
    # on both ranks after it began on both (each waits for the other's data). The call is
    # c10d::send: gloo:send begins only as c10d::send returns, and on a loaded machine the
    # data had arrived by then (the receive ended 0.1-4 ms before gloo:send began).
    [call] = comm_events(data, 0, "c10d::send")
    assert recv["ts"] + recv["dur"] >= call["ts"]
    [a0], [a1] = comm_events(data, 0, "gloo:all_reduce"), comm_events(data, 1, "gloo:all_reduce")
    assert min(a0["ts"] + a0["dur"], a1["ts"] + a1["dur"]) >= max(a0["ts"], a1["ts"])


def test_the_summary_reads_the_merged_trace(run):
    _, data, _ = run
    runs = ta.load(data)
    assert [name for name, _, _ in runs[0].ranges] == ["my work"]
    rows = ta.summarize(runs)
    assert [r.calls for r in rows] == [3, 3]  # all_reduce, send or recv, barrier
    assert all(r.compute_us > 0 and r.comm_us > 0 for r in rows)
    assert all(0 <= r.exposed_us <= r.comm_us for r in rows)
    mine = ta.summarize(runs, within="my work")
    assert [r.calls for r in mine] == [0, 0]


def test_ddp_cell_writes_a_trace_and_a_failure_still_writes_one(tmp_path, no_leaks):
    path = tmp_path / "cell.json"
    source = "t = torch.ones(4)\ndist.all_reduce(t)\nif rank == 1:\n    raise ValueError('late')\n"
    with pytest.raises(dl.DistributedError, match="late"):
        magic.run_cell(source, {}, nprocs=2, backend="gloo", trace=str(path))
    runs = ta.load(path)
    assert [len(runs[r].calls) for r in (0, 1)] == [1, 1]


def test_bad_trace_names_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        dl.spawn(traced_work, nprocs=2, trace=str(tmp_path / "no" / "run.json"))
    with pytest.raises(ValueError, match="folder"):
        dl.spawn(traced_work, nprocs=2, trace=str(tmp_path))


def test_the_merge_writes_the_same_trace_with_orjson_or_json(run, tmp_path, monkeypatch):
    from ddp_lab.runtime import _trace

    _, data, _ = run
    files = {}
    for rank in (0, 1):  # per-rank files in the profiler's layout, rebuilt from the merge
        events = [e for e in data["traceEvents"] if e["pid"] == rank and e.get("ph") != "M"]
        files[rank] = str(tmp_path / f"{rank}.json")
        with open(files[rank], "w") as f:
            json.dump({"traceEvents": events, "baseTimeNanoseconds": 1000 * rank}, f)
    _trace.merge(files, str(tmp_path / "fast.json"))
    monkeypatch.setattr(_trace, "_loads", _trace._stdlib_loads)
    monkeypatch.setattr(_trace, "_dumps", _trace._stdlib_dumps)
    _trace.merge(files, str(tmp_path / "json.json"))
    fast, slow = (json.loads((tmp_path / n).read_text()) for n in ("fast.json", "json.json"))
    assert fast == slow
    assert len(fast["traceEvents"]) > 10


@pytest.mark.parametrize(("reserved", "want"), [({1}, [1]), ({0, 2}, [0, 2]), (set(), [0])])
def test_a_traced_rank_waits_for_the_gpus_it_used(monkeypatch, reserved, want):
    """Many GPUs: a gloo rank on cuda:(r % gpus) without set_device; one GPU: GPU 0."""
    waited = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 512 if d in reserved else 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: waited.append(d))
    assert _trace.synchronize_used_gpus() == want
    assert waited == want


def cuda_matmuls(rank):
    """Item 9's run: three 2048x2048 matmuls on the GPU, started after the profiler is on."""
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        x = x @ x / 2048
    t = torch.ones(256)
    dist.all_reduce(t)
    return str(x.device)


@pytest.mark.gpu
def test_gpu_a_traced_rank_records_its_kernels_and_the_summary_counts_them(tmp_path, capfd):
    """Issue 40 item 9: on the first GPU run the trace held CUDA runtime calls but no kernel,
    and the summary said 0 us of compute; the profiler's warning reached the learner."""
    path = tmp_path / "gpu.json"
    assert dl.spawn(cuda_matmuls, nprocs=1, backend="gloo", trace=str(path)) == ["cuda:0"]
    data = json.loads(path.read_text())
    kernels = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(kernels) >= 3, sorted({e.get("cat") for e in data["traceEvents"]} - {None})
    [row] = ta.summarize(ta.load(data))
    matmuls = [e["dur"] for e in kernels if not e["name"].startswith("nccl")]  # cuBLAS's names vary
    assert row.compute_us >= max(matmuls) > 0
    assert "clears events at the end of each cycle" not in capfd.readouterr().err
