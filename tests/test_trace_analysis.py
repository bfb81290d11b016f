"""trace_analysis: interval arithmetic and the per-rank summary, on hand-built traces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddp_lab.tools import trace_analysis as ta

MAIN, GLOO = 100, 101


def trace(events_by_rank: dict[int, list[dict]]) -> dict:
    """A merged trace as runtime/_trace.py writes it: pid = rank, main thread MAIN."""
    events = []
    for rank, evs in events_by_rank.items():
        for e in evs:
            events.append({"ph": "X", "pid": rank, **e})
    ranks = {str(r): {"main_tid": MAIN, "comm_tids": [GLOO]} for r in events_by_rank}
    return {"traceEvents": events, "ddp_lab": {"world_size": len(ranks), "ranks": ranks}}


def op(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op", **args) -> dict:
    return {"name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat, "args": args}


def comm(kind: str, ts: float, dur: float, tid: int = GLOO, **args) -> dict:
    return op(f"gloo:{kind}", ts, dur, tid, "user_annotation", kind=kind, **args)


def test_half_overlapped_all_reduce():
    # Rank 0 computes 0-10 on its main thread; gloo's thread all-reduces 5-15.
    runs = ta.load(
        trace({0: [op("aten::mm", 0, 10), comm("all_reduce", 5, 10, bytes=4096, seq=1)]})
    )
    [row] = ta.summarize(runs)
    assert (row.compute_us, row.comm_us, row.exposed_us) == (10, 10, 5)
    assert row.overlap_pct == 50.0
    assert (row.calls, row.bytes) == (1, 4096)


def test_c10d_calls_and_blocking_p2p_on_the_main_thread_are_not_compute():
    events = [
        op("aten::add", 0, 4),
        op("aten::add", 2, 1),  # nested in the first: counted once
        op("c10d::send", 4, 1),
        op("aten::copy_", 4.2, 0.3),  # inside the c10d call
        comm("send", 4.5, 3.5, tid=MAIN, peer=1, bytes=8),  # blocking, on the main thread
        op("aten::mul", 10, 2),
        op("step", 0, 12, cat="user_annotation"),  # a label, not compute
    ]
    runs = ta.load(trace({0: events}))
    assert runs[0].compute == [(0, 4), (10, 12)]
    assert runs[0].ranges == [("step", 0, 12)]
    [row] = ta.summarize(runs)
    assert (row.compute_us, row.comm_us, row.exposed_us, row.overlap_pct) == (6, 3.5, 3.5, 0.0)
    assert runs[0].calls[0].peer == 1


def test_within_limits_the_summary_to_named_ranges():
    events = [
        op("naive", 0, 20, cat="user_annotation"),
        op("aten::mm", 0, 10),
        comm("all_reduce", 10, 10),  # after the compute: exposed
        op("bucketed", 20, 20, cat="user_annotation"),
        op("aten::mm", 20, 10),
        comm("all_reduce", 25, 10),  # half hidden behind compute
    ]
    runs = ta.load(trace({0: events, 1: events}))
    naive = ta.summarize(runs, within="naive")
    bucketed = ta.summarize(runs, within="bucketed")
    assert [r.overlap_pct for r in naive] == [0.0, 0.0]
    assert [r.overlap_pct for r in bucketed] == [50.0, 50.0]
    assert [r.calls for r in naive + bucketed] == [1, 1, 1, 1]
    assert ta.summarize(runs)[0].comm_us == 20


def test_no_communication_means_zero_overlap():
    [row] = ta.summarize(ta.load(trace({0: [op("aten::mm", 0, 3)]})))
    assert (row.comm_us, row.overlap_pct) == (0, 0.0)


def test_a_file_that_is_no_launcher_trace_gets_a_clear_error(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="ddp_lab"):
        ta.load(path)


def test_summary_table_and_drawing():
    runs = ta.load(trace({r: [op("aten::mm", 0, 10), comm("all_reduce", 5, 10)] for r in range(2)}))
    text = ta.format_summary(ta.summarize(runs))
    assert text.splitlines()[1].split() == ["0", "0.01", "0.01", "0.01", "50.0", "1", "0"]
    ax = ta.draw(runs, start_ms=0, end_ms=0.02)
    assert ax.get_xlim() == (0, 0.02)
    assert len(ax.get_yticks()) == 4


# --- properties of the interval arithmetic, against a brute-force count on a grid ------

spans = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 10)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=8,
)


def cells(intervals) -> set[int]:
    """Unit cells [k, k+1) covered: a brute-force model of a union of integer intervals."""
    return {k for s, e in intervals for k in range(s, e)}


@given(spans, spans)
def test_interval_arithmetic_matches_a_brute_force_count(a, b):
    assert ta.total(a) == len(cells(a))
    assert cells(ta.union(a)) == cells(a)
    assert cells(ta.intersect(a, b)) == cells(a) & cells(b)
    assert cells(ta.subtract(a, b)) == cells(a) - cells(b)
    merged = ta.union(a)
    assert all(x[1] < y[0] for x, y in zip(merged, merged[1:], strict=False))


@given(spans, spans)
def test_summary_splits_communication_into_hidden_and_exposed(compute, comms):
    events = [op("aten::mm", s, e - s) for s, e in compute]
    events += [comm("all_reduce", s, e - s) for s, e in comms]
    [row] = ta.summarize(ta.load(trace({0: events})))
    hidden = len(cells(compute) & cells(comms))
    assert row.comm_us == len(cells(comms))
    assert row.exposed_us == len(cells(comms) - cells(compute))
    assert row.comm_us - row.exposed_us == hidden
    assert 0.0 <= row.overlap_pct <= 100.0


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")  # no CJK font here
def test_labels_and_table_speak_the_learners_language():
    from ddp_lab import i18n

    runs = ta.load(trace({0: [op("aten::mm", 0, 10), comm("all_reduce", 5, 10)]}))
    before = i18n.get_language()
    i18n.set_language("zh")
    try:
        ax = ta.draw(runs)
        table = ta.format_summary(ta.summarize(runs))
    finally:
        i18n.set_language(before)
    labels = [t.get_text() for t in ax.get_yticklabels()] + [ax.get_xlabel()]
    assert labels == ["rank 0 计算", "rank 0 通信", "距本次运行第一个事件的时间（ms）"]
    assert table.split()[:3] == ["rank", "计算", "ms"]


# --- collectives matched across ranks --------------------------------------------------


def test_collective_times_match_ranks_by_kind_and_number():
    rank0 = [
        op("all_reduce", 0, 20, cat="user_annotation"),
        op("outer", 30, 40, cat="user_annotation"),
        op("broadcast", 31, 20, cat="user_annotation"),  # the innermost range labels it
        comm("all_reduce", 1, 10, bytes=4096, seq=1),
        op("aten::copy_", 2, 3, tid=GLOO),  # the backend copying, inside the all-reduce
        op("aten::copy_", 3, 1, tid=GLOO),  # nested: counted once
        comm("broadcast", 32, 5, bytes=64, seq=1),
        comm("send", 60, 1, tid=MAIN, peer=1, seq=1),  # point-to-point: not a collective
        comm("all_gather", 80, 1, seq=1),  # rank 1 never ran it: left out
    ]
    rank1 = [
        comm("all_reduce", 5, 9, bytes=4096, seq=1),  # arrives 4 us late, ends at 14
        comm("broadcast", 33, 2, bytes=64, seq=1),
        comm("recv", 60, 1, tid=MAIN, peer=0, seq=1),
    ]
    times = ta.collective_times(ta.load(trace({0: rank0, 1: rank1})))
    assert [(c.kind, c.label, c.bytes) for c in times] == [
        ("all_reduce", "all_reduce", 4096),
        ("broadcast", "broadcast", 64),
    ]
    reduce, bcast = times
    assert (reduce.us, reduce.waited_us, reduce.ops_us) == (14 - 5, 4, 3)
    assert (bcast.us, bcast.waited_us, bcast.ops_us) == (37 - 33, 1, 0)


@pytest.fixture(scope="module")
def traced_collectives(tmp_path_factory):
    import ddp_lab as dl
    from ddp_lab import collectives

    path = tmp_path_factory.mktemp("trace") / "run.json"
    seen = dl.spawn(
        collectives.timed_collectives,
        args=((64 << 10,), 2),
        nprocs=2,
        backend="gloo",
        trace=str(path),
        quiet=True,
    )
    return ta.collective_times(ta.load(path)), seen


def test_a_real_run_gives_every_collective_its_bytes_and_time(traced_collectives):
    times, seen = traced_collectives
    labelled = [c for c in times if c.label in ("all_reduce", "broadcast", "all_gather",
                                                "reduce_scatter")]  # fmt: skip
    assert [c.label for c in labelled] == ["all_reduce", "broadcast", "all_gather",
                                           "reduce_scatter"] * 2  # fmt: skip
    # ProcessGroupGloo runs reduce_scatter_single as an all-reduce of a copy of the whole input
    kinds = {c.label: c.kind for c in labelled}
    assert kinds == {"all_reduce": "all_reduce", "broadcast": "broadcast",
                     "all_gather": "all_gather", "reduce_scatter": "all_reduce"}  # fmt: skip
    assert {c.bytes for c in labelled} == {64 << 10}  # one rank's input
    # The backend's work happens inside the Python call on every rank: never longer than it.
    for call, *ranks in zip(labelled, *seen, strict=True):
        assert {(op, size) for op, size, _ in ranks} == {(call.label, 64 << 10)}
        assert 0 < call.us <= max(s for _, _, s in ranks) * 1e6


def test_versus_model_puts_the_trace_next_to_gloos_model(traced_collectives):
    from ddp_lab import costs

    times, seen = traced_collectives
    rows = ta.versus_model(times, 2, 50e-6, 1e-9, 1e-10, seen)
    assert [(r["op"], r["bytes"], r["ranks"]) for r in rows] == [
        (op, 64 << 10, 2) for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
    ]
    for r in rows:
        assert r["model_us"] == pytest.approx(
            1e6 * costs.gloo_cpu(r["op"], 2, 64 << 10, 50e-6, 1e-9, 1e-10)
        )
        assert r["ratio"] == pytest.approx(r["trace_us"] / r["model_us"])
        assert 0 < r["trace_us"] <= r["python_us"]  # call by call, so for the medians too
        assert 0 <= r["ops_us"] <= r["trace_us"]
    # gloo's all-gather copies the gathered pieces out of its own flat buffer (copy_)
    assert rows[2]["ops_us"] > 0
    table = ta.format_versus_model(rows).splitlines()
    assert table[1].split()[:4] == ["all_reduce", "64", "KiB", "2"]
    assert len(table[1].split()) == 9  # 8 columns, the size in two words


def test_a_gpu_rank_counts_kernel_time_not_launch_time():
    """Issue 40 item 9: with CUDA kernels in the trace, compute is the kernels' union; the
    CPU's short launches are not compute, NCCL's kernels are not compute."""
    stream = 7
    events = [
        op("aten::mm", 0, 1),  # the launch, on the CPU
        op("cudaLaunchKernel", 0.2, 0.5, cat="cuda_runtime"),
        op("sm90_xmma_gemm", 1, 40, tid=stream, cat="kernel"),
        op("sm90_xmma_gemm", 30, 20, tid=stream, cat="kernel"),  # overlaps: counted once
        op("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 60, 10, tid=stream, cat="kernel"),
        op("Memcpy DtoH (Device -> Pageable)", 70, 2, tid=stream, cat="gpu_memcpy"),
        comm("all_reduce", 55, 20, bytes=16, seq=1),
    ]
    runs = ta.load(trace({0: events, 1: [op("aten::mm", 0, 5)]}))
    assert runs[0].compute == [(1, 50)]
    assert runs[1].compute == [(0, 5)]  # a CPU rank is unchanged
    [gpu, cpu] = ta.summarize(runs)
    assert (gpu.compute_us, gpu.comm_us, gpu.exposed_us) == (49, 20, 20)
    assert cpu.compute_us == 5


def test_the_merge_finds_the_main_thread_when_gpu_events_carry_the_device_as_pid(tmp_path):
    """A GPU's events have pid 0 (the device); the main thread is the process's."""
    import json

    from ddp_lab.runtime import _trace

    pid = 4242
    raw = {
        "baseTimeNanoseconds": 0,
        "traceEvents": [
            {
                "ph": "X",
                "pid": pid,
                "tid": pid,
                "ts": 0,
                "dur": 3,
                "name": "aten::mm",
                "cat": "cpu_op",
            },  # fmt: skip
            {"ph": "X", "pid": 0, "tid": 7, "ts": 2, "dur": 30, "name": "gemm", "cat": "kernel"},
            {"ph": "f", "pid": 0, "tid": 7, "ts": 2, "id": 1, "cat": "ac2g", "name": "ac2g"},
        ],
    }
    path = tmp_path / "0.json"
    path.write_text(json.dumps(raw))
    merged = _trace.merge({0: str(path)}, str(tmp_path / "run.json"))
    assert merged["ddp_lab"]["ranks"]["0"]["main_tid"] == pid
    runs = ta.load(merged)
    assert runs[0].compute == [(2, 32)]
