"""The leak checks the tests share (tests/conftest.py) see our sockets and only ours.

A port number is not an owner: once a launch let go of its port, the kernel may give the same
number to another program's bind(0), and test.sh runs four pytest runs side by side. A check
that read every socket on the number failed CI on a socket of another run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from conftest import ports_in_use, tcp_states

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
