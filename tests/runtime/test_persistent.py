"""Persistent ranks (dl.start, %%ranks, dl.pull/push/status/stop) against gloo on CPU."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from conftest import shm_files, shm_left, tcp_states

import ddp_lab as dl
from ddp_lab.runtime import _calls, _hang, _workdirs, persistent
from ddp_lab.runtime._rank_group import alive

run = persistent.run_cell


def _snapshot() -> dict:
    """Everything a group holds on this machine: processes, port, private folder."""
    group = persistent.current()
    return {
        "pids": [group.zygote.proc.pid, *group.pids.values()],
        "port": group.port,
        "workdir": group.workdir,
    }


def _assert_gone(snap: dict) -> None:
    def left() -> bool:
        # The port too: a killed rank's threads may still hold its sockets for a moment after
        # /proc shows the process as a zombie (the thread-group leader exits first).
        return (
            any(alive(p) for p in snap["pids"])
            or bool({"0A", "01"} & set(tcp_states(snap["port"])))
            or os.path.exists(snap["workdir"])
        )

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in snap["pids"] if alive(p)], "processes left behind"
    assert not {"0A", "01"} & set(tcp_states(snap["port"])), "port still listening or connected"
    assert not os.path.exists(snap["workdir"]), "files left behind"


@pytest.fixture
def group(capfd):
    shm_before = shm_files()
    dl.start(2, backend="gloo", timeout=60)
    capfd.readouterr()
    snap = _snapshot()
    yield persistent.current()
    dl.stop()
    _assert_gone(snap)
    assert shm_left(shm_before) == set()


def _lines(capfd) -> list[str]:
    return capfd.readouterr().out.splitlines()


def test_variables_survive_from_cell_to_cell(group, capfd):
    run("x = torch.tensor([rank + 1.0])\n")
    run("x = x * 10\ndist.all_reduce(x)\nprint(rank, world_size, device, x.item())\n")
    assert _lines(capfd) == ["[rank 0] 0 2 cpu 30.0", "[rank 1] 1 2 cpu 30.0"]
    run("x.item() + rank")  # a last expression is shown, as a notebook would
    assert _lines(capfd) == ["[rank 0] 30.0", "[rank 1] 31.0"]
    run("for i in range(2):\n    print(i, x.item())\n", stream=True)
    assert sorted(_lines(capfd)) == [f"[rank {r}] {i} 30.0" for r in range(2) for i in range(2)]


def test_notebook_names_are_sent_but_the_ranks_own_names_win(group, capfd):
    def helper(v):
        return v + 1000

    run("k = rank\n")
    run("print(helper(k), offset)\n", {"helper": helper, "offset": 7, "k": "notebook k"})
    assert _lines(capfd) == ["[rank 0] 1000 7", "[rank 1] 1001 7"]

    def helper(v):  # the learner fixes the function in the notebook and runs again
        return v - 1

    run("print(helper(k))\n", {"helper": helper})
    assert _lines(capfd) == ["[rank 0] -1", "[rank 1] 0"]
    with pytest.raises(ValueError, match="'lock'"):  # checked before anything runs
        run("print(lock)\n", {"lock": threading.Lock()})


def test_subset_of_ranks(capfd):
    dl.start(3, backend="gloo", timeout=60)
    capfd.readouterr()
    try:
        run("y = rank * 10\nprint('here')\n", ranks=[0, 2])
        assert _lines(capfd) == ["[rank 0] here", "[rank 2] here"]
        assert dl.pull("globals().get('y')") == [0, None, 20]
        assert dl.pull("y", ranks=2) == [20]
        with pytest.raises(ValueError, match="from 0 to 2"):
            run("pass\n", ranks=[3])
    finally:
        dl.stop()


def test_pull_and_push_tensors(group):
    dl.push(w=torch.arange(3.0))
    dl.push(scale=torch.tensor(5.0), ranks=[1])
    run(
        "w = (w * (rank + 1)).requires_grad_()\n"
        "loss = (w * w * globals().get('scale', 1.0)).sum()\n"
        "loss.backward()\n"
    )
    grads = dl.pull("w.grad")
    assert all(isinstance(g, torch.Tensor) for g in grads)
    assert torch.equal(grads[0], torch.tensor([0.0, 2.0, 4.0]))
    assert torch.equal(grads[1], torch.tensor([0.0, 20.0, 40.0]))
    losses = dl.pull("loss")  # not a leaf: it comes back detached
    assert [v.item() for v in losses] == [5.0, 100.0] and losses[0].grad_fn is None
    assert dl.pull("{'r': rank, 't': [w.detach()]}")[1]["t"][0].tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(dl.DistributedError, match="NameError"):
        dl.pull("nothing_here")
    with pytest.raises(SyntaxError):
        dl.pull("1 +")
    with pytest.raises(ValueError, match="'bad'"):
        dl.push(bad=threading.Lock())


def test_exception_on_one_rank_keeps_the_group(group, capfd):
    pids = dict(group.pids)
    run("x = torch.ones(1)\n")
    with pytest.raises(dl.DistributedError) as info:
        run("print('before')\nif rank == 1:\n    raise ValueError('bad thing on rank one')\n")
    err = info.value
    assert err.ranks == [1]
    assert isinstance(err.failures[0].exception, ValueError)
    assert "raise ValueError" in str(err) and "keeps its variables" in str(err)
    assert _lines(capfd) == ["[rank 0] before", "[rank 1] before"]
    run("dist.all_reduce(x)\nprint(x.item())\n")  # the process group still works
    assert _lines(capfd) == ["[rank 0] 2.0", "[rank 1] 2.0"]
    assert group.pids == pids


def test_hang_times_out_with_stacks_and_restarts(group, capfd):
    old = dict(group.pids)
    run("x = torch.zeros(1)\n")
    cell = "if rank == 0:\n    dist.all_reduce(x)\nelse:\n    dist.recv(x, src=0)\n"
    start = time.monotonic()
    with pytest.raises(dl.DistributedTimeoutError) as info:
        run(cell, timeout=3)
    assert time.monotonic() - start < 60  # the cell's timeout, not the group's 60 s
    stacks = {f.rank: f.stack for f in info.value.failures}
    assert "all_reduce" in stacks[0] and "recv" in stacks[1]
    assert "restarted" in str(info.value) and "STATE IS LOST" in str(info.value)
    text = str(info.value)  # each rank's own line (a cell of this test: no source to show)
    assert 'cell 2>", line 2, in <module>' in text and 'cell 2>", line 4, in <module>' in text
    assert "distributed_c10d.py" not in text  # folded
    assert re.search(r"  - rank 0: waits in all_reduce #\d+ \(4 B\)\n", text)  # its call
    assert re.search(r"  - rank 1: waits in recv #\d+ \(4 B\) from rank 0\n", text)
    assert "all_reduce" not in capfd.readouterr().err  # shown once, in the exception
    assert not set(group.pids.values()) & set(old.values())
    assert not any(alive(p) for p in old.values())
    with pytest.raises(dl.DistributedError, match="NameError"):
        dl.pull("x")  # state is lost, as the message says
    run("t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n")
    assert _lines(capfd) == ["[rank 0] 2.0", "[rank 1] 2.0"]


def test_deadlocked_ring_is_reported_early_and_restarts(capfd):
    dl.start(3, backend="gloo")  # the default timeout (120 s): the deadlock watch is on
    try:
        group = persistent.current()
        old = dict(group.pids)
        run("x = torch.zeros(1)\n")
        # the classic ring mistake: every rank receives before anyone sends
        cell = (
            "dist.recv(x, src=(rank - 1) % world_size)\ndist.send(x, dst=(rank + 1) % world_size)\n"
        )
        start = time.monotonic()
        with pytest.raises(dl.DistributedDeadlockError) as info:
            run(cell)
        # Found by the deadlock watch, not the 120 s timeout (DistributedTimeoutError itself);
        # how soon: benchmarks/bench_hang.py.
        print(f"deadlock reported after {time.monotonic() - start:.1f} s")
        err = info.value
        assert isinstance(err, dl.DistributedTimeoutError)  # code that catches timeouts still does
        assert [f.rank for f in err.failures] == [0, 1, 2]
        text = str(err)
        assert text.startswith("Deadlock") and "STATE IS LOST" in text
        assert text.count('cell 2>", line 1, in <module>') == 3  # each rank's own line
        for r in range(3):  # and each rank's torch.distributed call, numbered from start-up
            assert f"  - rank {r}: waits in recv #1 (4 B) from rank {(r - 1) % 3}\n" in text
        assert "distributed_c10d.py" not in text and "ddp_lab_" not in text
        assert "dist.recv" not in capfd.readouterr().err  # shown once, in the exception
        assert not set(group.pids.values()) & set(old.values())  # restarted, as it says
        snap = _snapshot()
        run("t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n")
        assert _lines(capfd) == ["[rank 0] 3.0", "[rank 1] 3.0", "[rank 2] 3.0"]
    finally:
        dl.stop()
    _assert_gone(snap)


def test_failure_while_others_wait_in_a_collective(group):
    start = time.monotonic()
    with pytest.raises(dl.DistributedTimeoutError) as info:
        run("if rank == 1:\n    raise KeyError('gone')\ndist.barrier()\n")
    assert time.monotonic() - start < 60, "must not wait for the full 60 s timeout"
    text = str(info.value)
    assert "after rank 1 failed" in text and "KeyError" in text and "restarted" in text


def test_rank_that_dies_restarts_the_group(group, capfd):
    old = dict(group.pids)
    with pytest.raises(dl.DistributedError, match="code 3"):
        run("import os\nif rank == 1:\n    os._exit(3)\n")
    assert not set(group.pids.values()) & set(old.values())
    run("print(rank)\n")
    assert _lines(capfd)[-2:] == ["[rank 0] 0", "[rank 1] 1"]


def _interrupt_when(ready: Callable[[], bool]) -> None:
    """SIGINT to this process (the notebook) once ``ready()`` holds: when the ranks are where
    the test needs them, not after a fixed delay (a loaded machine may not have got them
    there yet). Polled in a thread; after 60 s it interrupts anyway (the test then fails)."""

    def wait() -> None:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait, daemon=True).start()


def test_interrupt_stops_the_cell_and_keeps_the_group(group, capfd, tmp_path):
    pids = dict(group.pids)
    run("x = torch.tensor([rank * 1.0])\nimport time\n")
    # each rank says it is in the loop (after its print) with a file of its own
    _interrupt_when(lambda: all((tmp_path / str(r)).exists() for r in range(2)))
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        run(
            f"print('working')\nopen(f'{tmp_path}/{{rank}}', 'w').close()\n"
            "while True:\n    time.sleep(0.01)\n"
        )
    assert time.monotonic() - start < 60  # stopped by the interrupt, not the group's timeout
    out, err = capfd.readouterr()
    assert out.splitlines() == ["[rank 0] working", "[rank 1] working"]
    assert "keeps its variables" in str(info.value)  # the one clean line IPython shows
    assert info.value._render_traceback_() == [str(info.value)]
    assert group.pids == pids
    assert [v.item() for v in dl.pull("x")] == [0.0, 1.0]
    assert [row[4] for row in group.rows()] == [None, None]  # nothing is running


def test_an_interrupt_before_the_ranks_read_the_cell_still_stops_it(group):
    """An interrupt that comes at once, while the ranks may not have read the cell yet, nor
    the notebook sent it to every rank. Lost, it left a rank running the cell, which then
    "did not stop", and the group was restarted with its state lost (_rank_loop.arm,
    _rank_faults.sigint_deferred); one round in five to thirty here with a 1 ms delay."""
    pids = dict(group.pids)
    run("x = torch.tensor([rank * 1.0])\nimport time\n")
    for delay in [0.0005, 0.001, 0.002, 0.003, 0.005] * 4:
        go = threading.Event()  # set just before the cell starts: the delay counts from there

        def interrupt(delay: float = delay, go: threading.Event = go) -> None:
            go.wait()
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGINT)

        thread = threading.Thread(target=interrupt)
        thread.start()
        with pytest.raises(KeyboardInterrupt) as info:
            go.set()
            run("while True:\n    time.sleep(0.01)\n")
        thread.join()
        # stopped on every rank that had the cell, or on none: it had reached none yet
        # (a plain KeyboardInterrupt); never a restart
        text = str(info.value)
        assert not text or "keeps its variables" in text, text
        assert group.pids == pids
    assert [v.item() for v in dl.pull("x")] == [0.0, 1.0]
    assert [row[4] for row in group.rows()] == [None, None]


def test_a_late_interrupt_does_not_stop_the_next_cell(group, tmp_path, capfd):
    """A SIGINT meant for a request the rank has already answered (its reply was on the way)
    comes while the rank waits: it is dropped, not kept for the next cell (_rank_loop.arm)."""
    from ddp_lab.runtime import _rank_loop

    sent = tmp_path / "sent"
    run("import os, signal, threading\n")
    # rank 1 answers at once; the signal comes after, while it waits for the next request
    late = f"os.kill(os.getpid(), signal.SIGINT)\nopen({str(sent)!r}, 'w').close()"
    run(f"def late():\n    {late.replace(chr(10), chr(10) + '    ')}\n"
        "threading.Timer(0.2, late).start()\n", ranks=[1])  # fmt: skip
    _rank_loop.note_interrupt(group.workdir, group.seq)  # what the notebook's interrupt notes
    deadline = time.monotonic() + 60
    while not sent.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    capfd.readouterr()
    run("print('ran')\n")
    assert _lines(capfd) == ["[rank 0] ran", "[rank 1] ran"]


def test_a_reply_to_another_request_is_never_taken_for_this_ones(group):
    """Each reply carries its request's number (_rank_loop._handle, _rank_group._wait): a
    reply left unread (a request given up on while its ranks still ran it) is not the next
    request's. Here a cell writes a stray reply of its own before its real one; unnumbered,
    the stray one answered this cell and the real one then answered the pull after it."""
    stray = (
        "import sys\n"
        "from ddp_lab.runtime._zygote import write_msg\n"
        "frame = sys._getframe()\n"
        "while frame.f_code.co_name != 'serve':\n"
        "    frame = frame.f_back\n"
        "write_msg(frame.f_locals['fd'], {'op': 'reply', 'status': 'ok', 'seq': 0, 'names': []})\n"
        "x = rank + 10\n"
    )
    run(stray)
    assert dl.pull("x") == [10, 11]
    assert dl.pull("x * 2") == [20, 22]


def test_interrupt_inside_a_collective_restarts(group, capfd):
    old = dict(group.pids)

    # Where rank 0 blocks: barrier's line that calls work.wait(), in C++ until rank 1 comes.
    # Only there is a SIGINT not honoured: earlier (the ledger already says "barrier") it
    # raises KeyboardInterrupt in Python, and the rank stops (seen once in six loaded runs).
    barrier = inspect.unwrap(dist.barrier)
    lines, first = inspect.getsourcelines(barrier)
    (wait_line,) = [first + i for i, text in enumerate(lines) if "work.wait()" in text]

    def blocked_in_barrier() -> bool:
        call = _calls.read(group.workdir, 0)  # cheap first: rank 0's ledger (runtime/_calls)
        if call is None or call[:2] != (_calls._INSIDE, "barrier"):
            return False
        frames = _hang.main_thread(group.stacks.request([0]).get(0, ""))  # its stack, now
        inner = frames[0] if frames else None
        return inner is not None and (inner.file, inner.line) == (
            barrier.__code__.co_filename,
            wait_line,
        )

    _interrupt_when(blocked_in_barrier)
    with pytest.raises(KeyboardInterrupt) as info:
        run("dist.barrier()\n", ranks=[0])  # rank 1 never comes: not interruptible
    err = capfd.readouterr().err
    assert "did not stop" in str(info.value) and "restarted" in str(info.value)
    assert "where rank 0 was stuck" in err and '<ranks cell 1>", line 1' in err
    assert not set(group.pids.values()) & set(old.values())
    run("dist.barrier()\n")


def test_status_table(group, capfd):
    rows = group.rows()
    assert [(r[0], r[2], r[3]) for r in rows] == [(0, True, "cpu"), (1, True, "cpu")]
    assert all(alive(r[1]) for r in rows)
    run("z = 1\n")
    text = repr(dl.status())
    assert "2 persistent ranks, gloo backend, 1 cells run" in text
    assert text.splitlines()[1].split() == ["rank", "pid", "alive", "device", "running"]
    assert "idle (last: z = 1)" in text
    dl.set_language("zh")
    try:
        assert "存活" in repr(dl.status())
    finally:
        dl.set_language("en")


def test_no_group_and_restart_by_start(capfd):
    assert "No persistent ranks" in repr(dl.status())
    with pytest.raises(RuntimeError, match="dl.start"):
        run("pass\n")
    dl.start(1, backend="gloo")
    snap = _snapshot()
    dl.start(2, backend="gloo")  # starting again replaces the old group
    _assert_gone(snap)
    assert "previous group of 1 ranks was stopped" in capfd.readouterr().out
    dl.stop()
    dl.stop()  # idempotent


def test_spawn_works_beside_the_group(group, no_leaks):
    run("x = rank\n")
    assert dl.spawn(lambda rank: rank * 2, nprocs=2) == [0, 2]
    assert dl.pull("x") == [0, 1]


def test_magics_in_ipython(capfd):
    from IPython.testing import globalipapp

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # once per process
    ip.run_line_magic("load_ext", "ddp_lab")
    ip.run_line_magic("ranks", "start -n 2 --backend gloo --timeout 60")
    try:
        ip.user_ns["offset"] = 5
        ip.run_cell_magic("ranks", "", "v = rank + offset\n")
        ip.run_cell_magic("ranks", "-r 1", "print(v)\n")
        assert capfd.readouterr().out.splitlines()[-1:] == ["[rank 1] 6"]
        assert "alive" in repr(ip.run_line_magic("ranks", "status"))
    finally:
        ip.run_line_magic("ranks", "stop")
    assert persistent._group is None


SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import ddp_lab as dl
    from ddp_lab.runtime import persistent

    dl.start(2, backend="gloo")
    persistent.run_cell("import torch\\nt = torch.ones(1)\\ndist.all_reduce(t)\\n")
    g = persistent.current()
    snap = {"pids": [g.zygote.proc.pid, *g.pids.values()], "port": g.port, "workdir": g.workdir}
    print(json.dumps(snap), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(300)
    """
)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_kernel_exit_or_kill_leaves_nothing(tmp_path, how):
    """A kernel shutdown runs atexit; a killed kernel takes the ranks with it (parent-death
    signal) and the next dl.start removes the folder it could not."""
    script = tmp_path / "kernel.py"
    script.write_text(SCRIPT)
    mode = "hang" if how == "kill" else "exit"
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True)
    snap = json.loads(_json_line(proc))
    if how == "kill":
        proc.kill()
    proc.wait(60)
    if how == "kill":
        _workdirs.remove_stale()
    _assert_gone(snap)


def _json_line(proc: subprocess.Popen) -> str:
    for line in proc.stdout:
        if line.startswith("{"):
            return line
    raise AssertionError("the script printed no snapshot")


def test_real_kernel_interrupt_then_restart(tmp_path):
    """In a Jupyter kernel: an interrupt stops the ranks' cell and keeps the group; a kernel
    restart ends every rank and leaves no files."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")

    def execute(code: str, interrupt_when: Callable[[], bool] | None = None) -> str:
        msg_id = kc.execute(code)
        if interrupt_when is not None:  # once the ranks are in the loop, however long it takes
            deadline = time.monotonic() + 60
            while not interrupt_when() and time.monotonic() < deadline:
                time.sleep(0.02)
            km.interrupt_kernel()
        out = []
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                out.append(f"ERROR {content['ename']}: " + "\n".join(content["traceback"]) + "\n")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)

    try:
        execute('import ddp_lab as dl\ndl.start(2, backend="gloo", timeout=60)')
        execute("%%ranks\nx = rank * 10\nimport time\n")
        looping = f"print('loop')\nopen(f'{tmp_path}/{{rank}}', 'w').close()\n"
        out = execute(
            f"%%ranks\n{looping}while True:\n    time.sleep(0.01)\n",
            lambda: all((tmp_path / str(r)).exists() for r in range(2)),
        )
        assert "[rank 1] loop" in out and "keeps its variables" in out
        assert "ERROR RanksInterrupted" in out and "Traceback" not in out  # the clean line only
        assert execute('print(dl.pull("x"))').strip() == "[0, 10]"
        snap = execute(
            "import json\nfrom ddp_lab.runtime import persistent\ng = persistent.current()\n"
            "print(json.dumps({'pids': [g.zygote.proc.pid, *g.pids.values()],"
            " 'port': g.port, 'workdir': g.workdir}))"
        )
        km.restart_kernel(now=False)
        _assert_gone(json.loads(snap.strip().splitlines()[-1]))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_start_says_it_is_starting_before_the_ranks_take_their_seconds(monkeypatch, capfd):
    """A learner sees a line at once, not a silent cell for the seconds the ranks take to
    import torch and join the group (3-9 s on a busy 2-core laptop)."""
    seen_before = []

    class Recording(persistent.RankGroup):
        def __init__(self, *args, **kwargs):
            seen_before.append(capfd.readouterr().out)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(persistent, "RankGroup", Recording)
    try:
        dl.start(2, backend="gloo", timeout=60)
    finally:
        dl.stop()
    assert seen_before[0].startswith("Starting 2 persistent ranks (gloo backend)")
    assert "Ready. Run cells on them with %%ranks" in capfd.readouterr().out
