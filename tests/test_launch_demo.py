"""ddp_lab.labs.launch_demo: real launchers, run as subprocesses, leave nothing running."""

from __future__ import annotations

import json
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddp_lab.labs import launch_demo as ld


def _no_demo_processes(*results: ld.LaunchResult) -> bool:
    """No process of these launches is alive (found by their markers, so that a lesson
    running a launch demo beside the tests is not taken for a leak of theirs)."""
    assert all(r.marker for r in results)
    return not any(ld.marked_pids(r.marker) for r in results)


def test_torchrun_sets_the_rank_variables(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # what torchrun would inherit
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where launches put their TMPDIR
    r = ld.torchrun("env", nproc_per_node=2, timeout=120)
    assert list(tmp_path.iterdir()) == []  # torchrun's torchelastic_* logs went with it
    assert r.returncode == 0, r.stderr
    recs = r.records()
    assert [rec["RANK"] for rec in recs] == ["0", "1"]
    assert [rec["LOCAL_RANK"] for rec in recs] == ["0", "1"]
    assert {rec["WORLD_SIZE"] for rec in recs} == {"2"}
    assert len({rec["pid"] for rec in recs}) == 2  # processes, not threads
    assert len({rec["nice"] for rec in recs}) == 1  # a rank is not a priority
    assert _no_demo_processes(r)


def test_two_agents_form_one_job_and_all_reduce() -> None:
    results = ld.two_nodes("allreduce", nproc_per_node=2, timeout=180)
    recs = [rec for r in results for rec in r.records()]
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert sorted(int(rec["RANK"]) for rec in recs) == [0, 1, 2, 3]
    for rec in recs:
        rank = int(rec["GROUP_RANK"]) * int(rec["LOCAL_WORLD_SIZE"]) + int(rec["LOCAL_RANK"])
        assert rank == int(rec["RANK"]) and rec["WORLD_SIZE"] == "4"
        assert rec["all_reduce_sum"] == 0 + 1 + 2 + 3  # the four ranks form one group
    assert _no_demo_processes(*results)


def test_node_habits_break_on_the_second_node(tmp_path) -> None:
    results = ld.two_nodes("node_habits", timeout=180, env={"DEMO_SAVE_DIR": str(tmp_path)})
    recs = sorted((rec for r in results for rec in r.records()), key=lambda r: int(r["RANK"]))
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    # set_device(RANK): ranks 2 and 3 ask for GPUs a 2-GPU node does not have
    assert [rec["set_device_RANK"] == "ok" for rec in recs] == [True, True, False, False]
    assert all(rec["set_device_LOCAL_RANK"] == "ok" for rec in recs)
    # `if local_rank == 0: save()` saves once per node: two writers of one file
    lines = (tmp_path / "checkpoint.txt").read_text().splitlines()
    assert sorted(lines) == ["written by RANK 0", "written by RANK 2"]
    # torchrun's agent hosts the store; workers connect as clients
    assert {rec["TORCHELASTIC_USE_AGENT_STORE"] for rec in recs} == {"True"}
    assert _no_demo_processes(*results)


def test_legacy_launch_passes_local_rank_with_a_hyphen() -> None:
    r = ld.legacy_launch("legacy_args", timeout=120)
    recs = r.records()
    assert [rec["argv"] for rec in recs] == [["--local-rank=0"], ["--local-rank=1"]]
    assert all(rec["notes_parser"].startswith("argparse error") for rec in recs)
    assert [rec["fixed_parser"] for rec in recs] == [0, 1]
    assert "FutureWarning" in r.stderr


def test_mp_spawn_sets_no_environment() -> None:
    r = ld.mp_spawn("init", nprocs=2, timeout=120)
    recs = r.records()
    assert len(recs) == 2
    assert all(rec["RANK"] is None and rec["MASTER_PORT"] is None for rec in recs)
    assert all("RANK expected, but not set" in rec["init"] for rec in recs)


def test_timeout_leaves_nothing_running() -> None:
    r = ld.torchrun("sleep", nproc_per_node=2, timeout=15)
    assert r.timed_out
    assert _no_demo_processes(r)


def test_signal_reaches_the_agent_and_stops_the_workers() -> None:
    r = ld.signal_agent("sleep", timeout=120)
    assert len(r.records()) == 2
    assert "death signal" in r.stderr and r.returncode != 0
    assert not r.timed_out and _no_demo_processes(r)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_counts_fail_before_anything_starts(bad: object) -> None:
    with pytest.raises(ValueError, match="nproc_per_node"):
        ld.torchrun_command("env", bad)  # type: ignore[arg-type]


def test_unknown_worker_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown demo worker"):
        ld.torchrun_command("nope")
    with pytest.raises(ValueError, match="nope"):
        ld.mp_spawn("nope")


def test_commands_use_a_free_port_never_a_fixed_one() -> None:
    a = ld.torchrun_command("env", 2, nnodes=2, node_rank=0)
    b = ld.torchrun_command("env", 2, nnodes=2, node_rank=0)
    port_a = [x for x in a if x.startswith("--master_port=")]
    port_b = [x for x in b if x.startswith("--master_port=")]
    assert port_a and port_b and port_a != port_b  # chosen by the OS each time
    assert "--standalone" in ld.torchrun_command("env", standalone=True)


values = st.one_of(st.none(), st.text(max_size=8), st.integers(0, 99).map(str))


@given(
    st.lists(st.fixed_dictionaries({k: values for k in ld.ENV_KEYS}), max_size=5),
    st.text(
        alphabet=st.characters(blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
        max_size=20,
    ),
)
def test_records_read_back_what_workers_wrote(recs: list[dict], noise: str) -> None:
    for i, rec in enumerate(recs):
        rec["RANK"], rec["TORCHELASTIC_RESTART_COUNT"] = str(i), "0"
    out = "".join(f"{noise}\n@rank {json.dumps(rec)}\n" for rec in recs)
    result = ld.LaunchResult(["x"], 0, out, "", 0.0)
    assert result.records() == [r for r in recs]
    table = ld.format_table(recs, ("RANK", "MASTER_ADDR")).splitlines()
    assert len(table) == len(recs) + 1
    assert len({len(line) for line in table}) == 1  # aligned columns
