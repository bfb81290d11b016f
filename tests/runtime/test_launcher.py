"""ddp_lab.spawn against its contract: results, env, output, failures, timeouts, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import ports_in_use, rank_processes, shm_files, shm_left

import ddp_lab as dl
from ddp_lab.runtime import _workdirs, launcher


def _sum_ranks(rank: int, offset: float) -> float:
    dist.init_process_group("gloo")
    t = torch.tensor([rank + offset])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_results_in_rank_order_and_all_reduce_matches(nprocs, no_leaks):
    results = dl.spawn(_sum_ranks, args=(0.5,), nprocs=nprocs)
    expected = sum(r + 0.5 for r in range(nprocs))
    assert results == [expected] * nprocs


def test_return_values_are_per_rank(no_leaks):
    assert dl.spawn(lambda rank, k: rank * k, args=(3,), nprocs=4) == [0, 3, 6, 9]


def test_environment_for_env_init(no_leaks):
    def env(rank):
        keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
        return {k: os.environ[k] for k in keys}

    envs = dl.spawn(env, nprocs=3)
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    ports = {int(dl.spawn(env, nprocs=1)[0]["MASTER_PORT"]) for _ in range(5)}
    assert len(ports) > 1, "the port must be chosen per call, not fixed"


def test_explicit_rank_and_world_size_like_tutorials(no_leaks):
    def fn(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        t = torch.ones(2)
        dist.all_reduce(t)
        return t.tolist()

    assert dl.spawn(fn, args=(2,), nprocs=2) == [[2.0, 2.0], [2.0, 2.0]]


def test_backend_argument_initialises_group(no_leaks):
    def fn(rank):
        return dist.is_initialized(), dist.get_backend(), dist.get_world_size()

    assert dl.spawn(fn, nprocs=2, backend="gloo") == [(True, "gloo", 2)] * 2
    assert dl.spawn(fn, nprocs=2, backend="auto")[0][1] in ("gloo", "cpu:gloo,cuda:nccl")


def test_output_in_rank_order_with_prefix_and_fd_level_capture(capfd, no_leaks):
    def fn(rank):
        time.sleep(0.05 * (3 - rank))  # later ranks finish first
        print(f"python print {rank}")
        os.write(1, f"raw fd write {rank}\n".encode())
        print(f"to stderr {rank}", file=sys.stderr)

    dl.spawn(fn, nprocs=3)
    out, err = capfd.readouterr()
    assert out.splitlines() == [
        line
        for r in range(3)
        for line in (f"[rank {r}] python print {r}", f"[rank {r}] raw fd write {r}")
    ]
    assert err.splitlines() == [f"[rank {r}] to stderr {r}" for r in range(3)]


def test_c_level_output_is_captured(capfd, no_leaks):
    def fn(rank):
        import ctypes

        libc = ctypes.CDLL(None)
        libc.printf(b"from C on rank %d\n", rank)
        libc.fflush(None)

    dl.spawn(fn, nprocs=2)
    out, _ = capfd.readouterr()
    assert "[rank 0] from C on rank 0" in out and "[rank 1] from C on rank 1" in out


def test_stream_option_prints_every_line(capfd, no_leaks):
    def fn(rank):
        for i in range(3):
            print(f"step {i}")
            time.sleep(0.1)

    dl.spawn(fn, nprocs=2, stream=True)
    out, _ = capfd.readouterr()
    for r in range(2):
        assert [line for line in out.splitlines() if line.startswith(f"[rank {r}]")] == [
            f"[rank {r}] step {i}" for i in range(3)
        ]


def test_quiet_prints_nothing(capfd, no_leaks):
    dl.spawn(lambda rank: print("hidden"), nprocs=2, quiet=True)
    assert capfd.readouterr().out == ""


def test_exception_on_one_rank_stops_others_and_names_it(capfd, no_leaks):
    def fn(rank):
        dist.init_process_group("gloo")
        if rank == 1:
            print("about to fail")
            raise ValueError("bad thing on rank one")
        dist.barrier()  # would wait forever for rank 1
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(dl.DistributedError) as info:
        dl.spawn(fn, nprocs=3, timeout=60)
    # the other ranks are stopped, not waited for (that would be the 60 s timeout's error)
    assert time.monotonic() - start < 60
    err = info.value
    assert not isinstance(err, dl.DistributedTimeoutError)
    assert err.ranks == [1]
    assert isinstance(err.failures[0].exception, ValueError)
    text = str(err)
    assert "rank 1" in text and "ValueError: bad thing on rank one" in text
    assert "raise ValueError" in text  # the traceback shows the failing line
    assert "about to fail" in err.outputs[1][0]
    assert "[rank 1] about to fail" in capfd.readouterr().out


@pytest.mark.parametrize(
    "how, expected",
    [("kill", "SIGKILL"), ("exit", "code 3"), ("segv", "SIGSEGV")],
)
def test_rank_dying_without_exception(how, expected, no_leaks):
    def fn(rank):
        if rank == 0:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif how == "exit":
                os._exit(3)
            else:
                import ctypes

                ctypes.string_at(0)  # a real segmentation fault
        time.sleep(60)

    with pytest.raises(dl.DistributedError) as info:
        dl.spawn(fn, nprocs=2, timeout=60)
    assert info.value.ranks == [0]
    assert expected in str(info.value)


def test_sys_exit_zero_is_success(no_leaks):
    assert dl.spawn(lambda rank: sys.exit(0), nprocs=2) == [None, None]


def test_hang_in_mismatched_collectives_times_out_with_stacks(capfd, no_leaks):
    def fn(rank):
        dist.init_process_group("gloo")
        t = torch.zeros(1)
        if rank == 0:
            dist.all_reduce(t)  # rank 1 never joins this all_reduce
        else:
            dist.recv(t, src=0)  # and rank 0 never sends

    start = time.monotonic()
    with pytest.raises(dl.DistributedTimeoutError) as info:
        # 15 s, not less: the ranks must be inside their hang when it fires. At 3 s, on two
        # cores busy with three other test runs, a rank was still in init_process_group.
        dl.spawn(fn, nprocs=2, timeout=15)
    assert time.monotonic() - start < 60  # the timeout given, not the default 120 s
    err = info.value
    assert isinstance(err, TimeoutError)
    stacks = {f.rank: f.stack for f in err.failures}
    assert "all_reduce" in stacks[0]
    assert "recv" in stacks[1]
    text = str(err)  # what the learner sees: each rank once, its own line first
    assert text.count("dist.all_reduce(t)") == 1 and text.count("dist.recv(t, src=0)") == 1
    assert "distributed_c10d.py" not in text and "_zygote.py" not in text  # folded
    assert "DDP_LAB_TRACEBACK=1" in text
    assert not isinstance(err, dl.DistributedDeadlockError)  # an explicit timeout: no watch
    assert "all_reduce" not in capfd.readouterr().err  # not printed a second time
    # each rank's torch.distributed call, from its ledger (ddp_lab.runtime._calls)
    assert "  - rank 0: waits in all_reduce #1 (4 B)\n" in text
    assert "  - rank 1: waits in recv #1 (4 B) from rank 0\n" in text


def _skips_an_all_reduce(rank: int) -> None:
    dist.init_process_group("gloo")
    t = torch.zeros(1024)
    dist.all_reduce(t)
    if rank == 0:
        dist.send(t, dst=1)
        dist.all_reduce(t)  # rank 1 never calls this second all_reduce
    else:
        dist.recv(t, src=0)
        time.sleep(60)  # in no torch.distributed call


def test_timeout_names_each_ranks_call_and_the_last_one_completed(monkeypatch, no_leaks):
    made: list[str] = []  # the launch's private folder, where the ranks' ledgers are
    original = tempfile.mkdtemp

    def mkdtemp(**kw):
        made.append(original(**kw))
        return made[-1]

    monkeypatch.setattr(_workdirs.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(dl.DistributedTimeoutError) as info:
        dl.spawn(_skips_an_all_reduce, nprocs=2, timeout=15)  # as above: past the ranks' start
    text = str(info.value)
    assert "  - rank 0: waits in all_reduce #2 (4.0 KiB)\n" in text
    assert (
        "  - rank 1: in no torch.distributed call; the last one it completed: "
        "recv #1 (4.0 KiB) from rank 0\n"
    ) in text
    assert [f.call for f in info.value.failures] == [
        "rank 0: waits in all_reduce #2 (4.0 KiB)",
        "rank 1: in no torch.distributed call; the last one it completed: "
        "recv #1 (4.0 KiB) from rank 0",
    ]
    assert made and not any(os.path.exists(d) for d in made)  # the ledgers are gone


def _batched_swap(rank: int) -> float:
    dist.init_process_group("gloo")
    mine, theirs = torch.tensor([float(rank)]), torch.zeros(1)
    ops = [dist.P2POp(dist.isend, mine, 1 - rank), dist.P2POp(dist.irecv, theirs, 1 - rank)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return theirs.item()


def test_the_call_ledger_leaves_p2pop_working(no_leaks):
    # P2POp checks its op by identity (distributed_c10d._check_op): isend stays unwrapped
    assert dl.spawn(_batched_swap, nprocs=2) == [1.0, 0.0]


def _ring_blocking_recv_first(rank: int, world_size: int) -> None:
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    dist.recv(t, src=(rank - 1) % world_size)  # every rank waits for its left neighbour
    dist.send(t, dst=(rank + 1) % world_size)


def test_deadlocked_ring_is_reported_long_before_the_timeout(capfd, no_leaks):
    start = time.monotonic()
    with pytest.raises(dl.DistributedDeadlockError) as info:
        dl.spawn(_ring_blocking_recv_first, args=(3,), nprocs=3)  # default timeout: 120 s
    print(f"deadlock reported after {time.monotonic() - start:.1f} s")  # bench_hang.py: how soon
    err = info.value
    assert isinstance(err, dl.DistributedTimeoutError)  # code that catches timeouts still does
    assert [f.rank for f in err.failures] == [0, 1, 2]
    text = str(err)
    assert text.startswith("Deadlock")
    assert text.count("dist.recv(t, src=(rank - 1) % world_size)") == 3  # each rank's own line
    assert text.count(", in _ring_blocking_recv_first") == 3
    assert "site-packages" not in text and "ddp_lab_" not in text  # no internals, no temp paths
    assert "dist.recv" not in capfd.readouterr().err
    for rank in range(3):  # each rank's call, with its number and peer, before the stacks
        line = f"  - rank {rank}: waits in recv #1 (4 B) from rank {(rank - 1) % 3}\n"
        assert line in text and text.index(line) < text.index("--- where rank 0")


def _slow_sender(rank: int) -> int:
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        time.sleep(8)  # rank 1 waits in recv all this time, rank 0 in no communication
        dist.send(t + 7, dst=1)
    else:
        dist.recv(t, src=0)
    return int(t.item())


def test_a_slow_rank_is_no_deadlock(no_leaks):
    assert dl.spawn(_slow_sender, nprocs=2) == [0, 7]


def test_global_timeout_setting(no_leaks):
    old = launcher.DEFAULT_TIMEOUT
    try:
        dl.set_timeout(1)
        with pytest.raises(dl.DistributedTimeoutError):
            dl.spawn(lambda rank: time.sleep(30), nprocs=1)
    finally:
        launcher.DEFAULT_TIMEOUT = old


def test_non_picklable_captured_object_is_named():
    lock = threading.Lock()

    def fn(rank):
        with lock:
            return rank

    with pytest.raises(ValueError, match="'lock'"):
        dl.spawn(fn, nprocs=2)
    with pytest.raises(ValueError, match="argument 0"):
        dl.spawn(lambda rank, x: x, args=(threading.Lock(),), nprocs=2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None, 10**6])
def test_bad_nprocs_rejected_before_start(bad):
    before = launcher._zygote
    with pytest.raises(ValueError, match="nprocs"):
        dl.spawn(print, nprocs=bad)
    assert launcher._zygote is before  # nothing was started


def test_unavailable_or_unknown_backend():
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match="nccl"):
            dl.spawn(print, nprocs=2, backend="nccl")
    with pytest.raises(ValueError, match="Unknown backend"):
        dl.spawn(print, nprocs=2, backend="tcp")


def test_errors_in_chinese():
    dl.set_language("zh")
    try:
        with pytest.raises(ValueError, match="至少为 1"):
            dl.spawn(print, nprocs=0)
    finally:
        dl.set_language("en")


def test_process_group_left_initialised_is_destroyed(capfd, no_leaks):
    def fn(rank):
        dist.init_process_group("gloo")
        original = dist.destroy_process_group

        def traced(*a, **k):
            print("destroyed by launcher")
            return original(*a, **k)

        dist.destroy_process_group = traced  # the launcher looks it up after fn returns
        return "left initialised"

    assert dl.spawn(fn, nprocs=2) == ["left initialised"] * 2
    assert capfd.readouterr().out.count("destroyed by launcher") == 2


def test_ranks_get_different_python_random_states(no_leaks):
    import random

    values = dl.spawn(lambda rank: random.random(), nprocs=3)
    assert len(set(values)) == 3


def test_fifty_launches_leave_nothing_behind(no_leaks):
    shm_before = shm_files()

    def fn(rank):
        dist.init_process_group("gloo")
        t = torch.ones(4)
        dist.all_reduce(t)
        return int(os.environ["MASTER_PORT"])

    ports = set()
    for _ in range(50):
        ports.update(dl.spawn(fn, nprocs=2))
        assert rank_processes() == set()
    assert shm_left(shm_before) == set()
    assert ports_in_use(ports) == []


def test_no_rank_exits_while_another_is_still_in_its_function(no_leaks):
    """Rank 1 returns at once; rank 0 is slow (as inside ``init_process_group`` on a busy
    machine). A rank that exits closes its gloo connections, and a peer still connecting
    fails with "Gloo connectFullMesh failed ... Connection closed by peer" (seen in CI)."""
    from ddp_lab.runtime._rank_group import alive

    def fn(rank):
        dist.init_process_group("gloo")
        store = dist.distributed_c10d._get_default_store()
        store.set(f"pid{rank}", str(os.getpid()))
        if rank > 0:
            return None
        time.sleep(1.0)
        return [alive(int(store.get(f"pid{r}"))) for r in (1, 2)]

    assert dl.spawn(fn, nprocs=3) == [[True, True], None, None]


def test_a_launch_never_meets_the_store_of_another_launch(monkeypatch, no_leaks):
    """Another launch's store on the very port this launch would draw: what two launches in
    different processes got when both drew one port between ``free_port``'s check and rank
    0's bind (forced here). The launch's own ranks must meet each other, and nothing of
    theirs may reach the other store."""
    from datetime import timedelta

    other = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    other.set("other_launch", "1")
    monkeypatch.setattr(launcher, "free_port", lambda: other.port)

    def fn(rank):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return int(os.environ["MASTER_PORT"]), t.item()

    results = dl.spawn(fn, nprocs=2, backend="gloo", quiet=True)
    assert [r[1] for r in results] == [3.0, 3.0]
    assert results[0][0] == results[1][0] != other.port
    assert other.num_keys() == 1, "a rank wrote into another launch's store"


def test_zygote_restarts_after_being_killed(no_leaks):
    dl.spawn(lambda rank: None, nprocs=1)
    os.kill(launcher._zygote.proc.pid, signal.SIGKILL)
    launcher._zygote.proc.wait()
    assert dl.spawn(lambda rank: rank, nprocs=2) == [0, 1]


# The zygote's parent-death signal set 1 s late in its successor: a successor not yet armed
# when the zygote stops it (during a launch) would stay stopped for ever once the zygote dies.
_SLOW_ARMING = """import time
from ddp_lab.runtime import _zygote
_real = _zygote.set_parent_death_signal
_zygote.set_parent_death_signal = lambda *a, **k: (time.sleep(1), _real(*a, **k))
"""


def test_a_zygote_killed_mid_launch_takes_its_stopped_successor_along(monkeypatch, no_leaks):
    from conftest import descendants

    from ddp_lab.runtime import _shipping
    from ddp_lab.runtime._rank_group import alive

    real = subprocess.Popen

    def slow_arming(args, **kwargs):
        if "_zygote import main" in args[-1]:
            args = [*args[:-1], _SLOW_ARMING + args[-1]]
        return real(args, **kwargs)

    launcher.shutdown()
    monkeypatch.setattr(_shipping.subprocess, "Popen", slow_arming)
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            dl.spawn(lambda rank: time.sleep(60), nprocs=1, timeout=120, quiet=True)
        except BaseException as exc:  # noqa: BLE001  # the zygote's death, expected
            errors.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    deadline = time.monotonic() + 180  # a hang, not a slow start (60 s passed once under load)
    while launcher._zygote is None or len(descendants(launcher._zygote.proc.pid)) < 2:
        assert time.monotonic() < deadline, "the launch never started"
        time.sleep(0.05)
    zygote = launcher._zygote.proc.pid
    children = descendants(zygote)  # the successor (stopped while ranks run) and the rank
    os.kill(zygote, signal.SIGKILL)
    thread.join(60)
    assert errors, "the launch did not fail with its zygote"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in children if alive(p)] == [], "outlived the zygote"
    launcher.shutdown()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import ddp_lab as dl

    def fn(rank, path):
        with open(f"{path}.{rank}", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)

    try:
        dl.spawn(fn, args=(sys.argv[1],), nprocs=2, timeout=300)
    except KeyboardInterrupt as e:
        print("KeyboardInterrupt caught", flush=True)
        print(e._render_traceback_(), flush=True)
        sys.exit(42)
    """
)


def test_keyboard_interrupt_stops_every_rank(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "pid"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(marker)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 180  # a hang, not a slow start (60 s passed once under load)
    # Non-empty, not just there: a rank creates its file before it writes its pid.
    while not all(_read(tmp_path / f"pid.{r}") for r in range(2)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 42 and "KeyboardInterrupt caught" in out
    # What IPython shows: the clean line only (DDP_LAB_TRACEBACK=1 for the details).
    assert out.splitlines()[-1] == "['Interrupted: all ranks were stopped.']"
    time.sleep(0.2)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read()


def test_parent_killed_takes_ranks_with_it(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, str(script), str(marker)], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 180  # a hang, not a slow start (60 s passed once under load)
    # Non-empty, not just there: a rank creates its file before it writes its pid.
    while not all(_read(tmp_path / f"pid.{r}") for r in range(2)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids), "orphaned rank processes"


def test_a_killed_callers_folder_is_removed_by_the_next_launch(tmp_path, monkeypatch):
    """SIGKILL skips ``run_payload``'s ``finally``: the folder of the rank files stays. It is
    named after its owner and locked by it; the next launch (any process) removes it."""
    private = tmp_path / "tmp"
    private.mkdir()
    script = tmp_path / "orphan.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "pid"
    env = {**os.environ, "TMPDIR": str(private)}
    proc = subprocess.Popen([sys.executable, str(script), str(marker)], env=env)
    deadline = time.monotonic() + 180  # a hang, not a slow start (60 s passed once under load)
    while not all(_read(tmp_path / f"pid.{r}") for r in range(2)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    folders = list(private.glob(f"ddp_lab_{proc.pid}_*"))
    assert len(folders) == 1 and (folders[0] / "0.out").exists()
    proc.kill()
    proc.wait()
    # A folder of an older launcher (no owner recorded), written long ago, no file open.
    legacy = private / "ddp_lab_8isax8vv"
    legacy.mkdir()
    for name in ("0.out", "0.err", "0.calls", "0.stack"):
        (legacy / name).write_text("")
        os.utime(legacy / name, (time.time() - 3600,) * 2)
    os.utime(legacy, (time.time() - 3600,) * 2)
    other = private / "ddp_lab_data"  # not a launch's folder: left alone
    other.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    assert dl.spawn(lambda rank: rank, nprocs=2) == [0, 1]
    assert sorted(p.name for p in private.glob("ddp_lab_*")) == ["ddp_lab_data"]


def test_a_live_owners_folder_is_kept(tmp_path, monkeypatch):
    """The lock decides, not the pid: a folder whose owner lives (even a reused pid would
    not hold the lock) stays; one whose lock nobody holds goes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = _workdirs.make()
    try:
        assert _workdirs.remove_stale() == []
        assert os.path.isdir(mine)
        # Another process's pid in the name, lock held by nobody: stale.
        forged = tmp_path / f"ddp_lab_{os.getppid()}_abcdefgh"
        forged.mkdir()
        (forged / ".owner").write_text("")
        assert _workdirs.remove_stale() == [str(forged)]
    finally:
        _workdirs.remove(mine)
    assert not os.path.exists(mine)


def test_official_ddp_tutorial_demo_runs_with_dl_spawn(capfd, no_leaks):
    # The shape of the mp.spawn demo in PyTorch's DDP tutorial, with mp.spawn -> dl.spawn.
    # (The tutorial also hard-codes MASTER_PORT=12355; dl.spawn already sets a free one.)
    import torch.nn as nn
    import torch.optim as optim
    from torch.nn.parallel import DistributedDataParallel as DDP

    def setup(rank, world_size):
        os.environ["MASTER_ADDR"] = "localhost"
        dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def cleanup():
        dist.destroy_process_group()

    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(10, 10)
            self.relu = nn.ReLU()
            self.net2 = nn.Linear(10, 5)

        def forward(self, x):
            return self.net2(self.relu(self.net1(x)))

    def demo_basic(rank, world_size):
        print(f"Running basic DDP example on rank {rank}.")
        setup(rank, world_size)
        model = ToyModel().to("cpu")
        ddp_model = DDP(model)
        loss_fn = nn.MSELoss()
        optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()
        cleanup()
        print(f"Finished running basic DDP example on rank {rank}.")

    def run_demo(demo_fn, world_size):
        dl.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)

    run_demo(demo_basic, 2)
    out = capfd.readouterr().out
    assert "[rank 1] Finished running basic DDP example on rank 1." in out


def test_free_port_is_free_and_outside_the_ephemeral_range() -> None:
    """Outgoing connections (gloo opens one per pair of ranks) take their local port from the
    ephemeral range: a port drawn below it cannot be taken that way before rank 0 binds it."""
    import socket

    low, high = launcher._ephemeral_range()
    ports = {launcher.free_port() for _ in range(20)}
    assert len(ports) > 1  # drawn, not fixed
    for port in ports:
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free
