"""Hang reports (ddp_lab.runtime._hang): readable stacks, and a deadlock in a notebook cell
reported within the issue's 30 s with each rank's own line, named by its cell."""

from __future__ import annotations

import time

import nbformat
from nbclient import NotebookClient

from ddp_lab.runtime import _hang

DUMP = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2799 in recv
  File "/x/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/ipykernel_1/cell_a.py", line 3 in ring
  File "/tmp/ipykernel_1/cell_b.py", line 1 in <module>
  File "{runtime}/magic.py", line 50 in __call__
  File "{runtime}/_rank.py", line 270 in main
  File "<string>", line 1 in <module>
"""


def test_format_stack_own_frames_first_internals_folded(monkeypatch):
    import linecache

    monkeypatch.delenv("DDP_LAB_TRACEBACK", raising=False)
    lines = ["def ring(t, rank, n):\n", "    t += 1\n", "    dist.recv(t, src=(rank - 1) % n)\n"]
    monkeypatch.setitem(linecache.cache, "/tmp/ipykernel_1/cell_a.py", (0, None, lines, "x"))
    monkeypatch.setitem(linecache.cache, "/tmp/ipykernel_1/cell_b.py", (0, None, ["ring()\n"], "x"))
    dump = DUMP.format(runtime=_hang._RUNTIME)
    cells = {"/tmp/ipykernel_1/cell_a.py": 7, "/tmp/ipykernel_1/cell_b.py": None}
    assert _hang.in_communication(_hang.main_thread(dump))
    assert _hang.format_stack(dump, cells).splitlines() == [
        "  Cell In[7], line 3, in ring",
        "      dist.recv(t, src=(rank - 1) % n)",
        "  Cell, line 1, in <module>",
        "      ring()",
        "  (5 more frames of torch, ddp_lab; DDP_LAB_TRACEBACK=1 shows them)",
    ]
    monkeypatch.setenv("DDP_LAB_TRACEBACK", "1")
    assert "c10d_logger.py" in _hang.format_stack(dump, cells)  # the details on request


def test_sleeping_or_computing_is_not_communication():
    sleeping = [_hang.Frame(__file__, 1, "f")]  # this file's line 1: a docstring
    assert not _hang.in_communication(sleeping)
    assert not _hang.in_communication([])


NOTEBOOK = [
    "import torch\nimport torch.distributed as dist\n\nimport ddp_lab as dl\n\ndl.setup('en')",
    # the classic mistake of a hand-written ring: every rank receives before anyone sends
    "def ring(t, rank, world_size):\n"
    "    dist.recv(t, src=(rank - 1) % world_size)\n"
    "    dist.send(t, dst=(rank + 1) % world_size)",
    "%%ddp -n 3\nring(torch.zeros(1), rank, world_size)",
]
# An exercise's demo cell runs after earlier launches: the zygote is started and warm.
WARM_UP = "%%ddp -n 3\nprint(rank)"


def test_deadlock_in_a_notebook_cell_is_reported_fast_with_each_ranks_cell_line(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in [*NOTEBOOK[:2], WARM_UP, NOTEBOOK[2]]]
    client = NotebookClient(
        nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    )
    with client.setup_kernel():
        for i in range(3):
            client.execute_cell(nb.cells[i], i)
        start = time.monotonic()
        client.execute_cell(nb.cells[3], 3)
        took = time.monotonic() - start
    print(f"deadlock reported after {took:.1f} s")
    assert took < 30, took  # the bound (the default timeout is 120 s)
    (error,) = [o for o in nb.cells[3].outputs if o.output_type == "error"]
    assert error.ename == "DistributedDeadlockError"
    text = "\n".join(error.traceback)
    assert text.count("Cell In[2], line 2, in ring") == 3  # each rank, named by its cell
    assert text.count("dist.recv(t, src=(rank - 1) % world_size)") == 3
    assert text.count("Cell In[4], line 1, in <module>") == 3  # the %%ddp cell's own line
    for rank in range(3):  # each rank's torch.distributed call (ddp_lab.runtime._calls)
        assert f"rank {rank}: waits in recv #1 (4 B) from rank {(rank - 1) % 3}" in text
    assert "site-packages" not in text and "ipykernel_" not in text and "ddp_lab_" not in text
    streams = "".join(o.get("text", "") for o in nb.cells[3].outputs if o.output_type == "stream")
    assert "dist.recv" not in streams  # the stacks are shown once


def test_call_lines_of_the_ledger_in_both_languages(tmp_path):
    import mmap

    from ddp_lab.i18n import set_language
    from ddp_lab.runtime import _calls

    calls = []
    with open(_calls.path(str(tmp_path), 1), "wb") as f:
        f.write(b"\0" * _calls._SLOT.size)
    with open(_calls.path(str(tmp_path), 1), "r+b") as f:
        slot = mmap.mmap(f.fileno(), _calls._SLOT.size)
    counts = {"all_reduce": 6}
    wrapped = _calls._wrap(
        lambda t, op=None: calls.append(t),
        "all_reduce",
        _calls._FUNCTIONS["all_reduce"],
        slot,
        counts,
    )
    assert _calls.read(str(tmp_path), 1) is None  # no call yet
    import torch

    wrapped(torch.zeros(1024, 1024))
    assert len(calls) == 1 and counts["all_reduce"] == 7
    record = _calls.read(str(tmp_path), 1)
    assert record == (_calls._RETURNED, "all_reduce", 7, 4 * 2**20, _calls._NO_PEER)
    assert _calls.describe(1, record) == (
        "rank 1: in no torch.distributed call; the last one it completed: all_reduce #7 (4.0 MiB)"
    )
    assert _calls.describe(0, (_calls._INSIDE, "send", 6, 16384, 1)) == (
        "rank 0: waits in send #6 (16.0 KiB) to rank 1"
    )
    assert _calls.describe(2, (_calls._INSIDE, "recv", 1, 4, -1)) == (
        "rank 2: waits in recv #1 (4 B) from any rank"
    )
    set_language("zh")
    try:
        assert _calls.describe(0, (_calls._INSIDE, "recv", 3, 4, 2)) == (
            "rank 0：正在等待 recv #3 (4 B) 来自 rank 2"
        )
        assert "还没有" in _calls.describe(0, None)
    finally:
        set_language("en")
    slot.close()
