"""The leak checks the tests share (tests/conftest.py) see our sockets and /dev/shm files, and
only ours.

A /dev/shm name is no owner either: a lesson in another run holds a multiprocessing Queue
(three named semaphores) for as long as its lab runs, and a CI run failed on those.

A port number is not an owner: once a launch let go of its port, the kernel may give the same
number to another program's bind(0), and test.sh runs four pytest runs side by side. A check
that read every socket on the number failed CI on a socket of another run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
import uuid

from conftest import ports_in_use, shm_files, shm_left, tcp_states

# Prints the port of a socket listening in this child; it ends when its stdin closes.
CHILD = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""

# The same in a process that is none of ours: a grandchild whose parent exits at once, so it
# belongs to whoever adopts orphans (as another test run's processes belong to that run).
STRANGER = "import os\nif os.fork():\n    os._exit(0)\n" + CHILD


def _listener(code: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return proc, int(proc.stdout.readline())


def test_a_socket_of_this_process_or_a_child_counts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert tcp_states(port) == ["0A"]
        assert ports_in_use({port}) == [port]
    assert ports_in_use({port}) == []
    proc, port = _listener(CHILD)
    try:
        assert ports_in_use({port}) == [port]
    finally:
        proc.stdin.close()
        proc.wait()
    assert ports_in_use({port}) == []


def test_a_socket_of_another_program_on_the_same_number_does_not():
    proc, port = _listener(STRANGER)
    try:
        proc.wait()  # the parent left: the listener is nobody's child of ours now
        assert ports_in_use({port}) == []
        assert tcp_states(port) == []
        # ... though the port does listen, as a check by number alone would have said
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        proc.stdin.close()  # the stranger shares the pipe: it reads EOF and ends
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _listening(port):
        time.sleep(0.05)
    assert not _listening(port)


def _listening(port: int) -> bool:
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(name).read().splitlines()[1:]:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                return True
    return False


def test_a_zombie_leaders_threads_still_count():
    """A process whose main thread exited while another thread holds a listening socket: /proc
    shows it as a zombie with an empty fd table; the socket is still there and ours."""
    code = """
import os, socket, sys, threading
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
def hold():
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=hold).start()
import ctypes
ctypes.CDLL(None).pthread_exit(None)  # the leader exits, its thread and socket stay
"""
    proc, port = _listener(code)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _state(proc.pid) != "Z":
            time.sleep(0.05)
        assert _state(proc.pid) == "Z"
        assert os.listdir(f"/proc/{proc.pid}/fd") == []  # all a look at the leader alone sees
        assert ports_in_use({port}) == [port]
    finally:
        proc.stdin.close()
        proc.wait()
    assert ports_in_use({port}) == []


def _state(pid: int) -> str:
    text = open(f"/proc/{pid}/stat").read()
    return text[text.rindex(")") + 2]


# Holds a `spawn` multiprocessing Queue (its semaphores are named files in /dev/shm while it
# lives) until its stdin closes; prints when it has it.
QUEUE_HOLDER = """
import multiprocessing as mp, sys
q = mp.get_context("spawn").Queue()
print(0, flush=True)
sys.stdin.read()
"""


def test_a_dev_shm_file_nobody_holds_or_we_hold_counts_and_another_program_s_does_not():
    before = shm_files()
    # Another program's Queue: held by a process that is none of ours, for longer than the
    # check's patience.
    stranger, _ = _listener("import os\nif os.fork():\n    os._exit(0)\n" + QUEUE_HOLDER)
    stranger.wait()
    try:
        theirs = shm_files() - before
        assert len(theirs) == 3 and all(n.startswith("sem.mp-") for n in theirs)
        assert shm_left(before, patience=0.5) == set()
        # Ours: a Queue of this process (a semaphore we map) ...
        q = mp.get_context("spawn").Queue()
        mine = shm_files() - before - theirs
        assert len(mine) == 3
        assert shm_left(before, patience=0.5) == mine
        q.close()
        del q
        import gc

        gc.collect()  # its finalizer unlinks the names
        assert shm_left(before, patience=5) == set()
        # ... and a file nobody holds: what a launch that forgot to unlink leaves
        name = f"ddp_lab_test_{uuid.uuid4().hex}"
        open(f"/dev/shm/{name}", "wb").close()
        try:
            assert shm_left(before, patience=0.5) == {name}
        finally:
            os.unlink(f"/dev/shm/{name}")
    finally:
        stranger.stdin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and shm_files() - before:
        time.sleep(0.05)
    assert shm_files() - before == set()
