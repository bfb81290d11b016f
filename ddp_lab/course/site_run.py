"""Running one lesson for the website (``course.site``): nbclient, with what a build needs.

``execute_lesson`` runs a lesson's notebook as the tests do (in its folder, with the
course's kernel) and returns it with the CPU seconds its kernel and the kernel's processes
used, which the build logs. Split from ``site`` to keep each module readable whole.
``unix_sockets`` moves a kernel off TCP; the test suite's kernels use it too.
"""

from __future__ import annotations

import os
import queue
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nbformat

from ddp_lab.course import build
from ddp_lab.course.site_pages import Page

CELL_TIMEOUT = 300


def _tree_cpu(pid: int | None) -> float | None:
    """CPU seconds of process ``pid`` and every process under it, those it waited for
    included (a rank that ended and was reaped); None without psutil or the process."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except (psutil.Error, TypeError, ValueError):
        return None
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended meanwhile: its parent's children_* count it
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


SUN_PATH_MAX = 107  # sockaddr_un.sun_path: 108 bytes with the terminating NUL (unix(7))


def unix_sockets(km: Any, folder: str) -> None:
    """Have kernel manager ``km`` start its kernel on Unix sockets in ``folder``, not on TCP.

    Why: over TCP, jupyter_client picks five free ports (bind port 0, close) and writes them
    to the connection file; the kernel binds them a second or more later, and in between any
    process of the machine may get one as its ephemeral port. A lesson's ranks open many
    connections (gloo, the rendezvous store), and with kernels side by side a kernel then dies
    with "zmq.error.ZMQError: Address already in use" (jupyter/jupyter_client#276). A socket
    file in a folder of ours is nobody else's. ``ip`` must be absolute: a relative one is
    resolved in the kernel's working folder, where the client does not look. jupyter_client
    removes the files when the kernel shuts down. A manager set to anything else than TCP on
    this host is left as it is, and so is one whose socket paths would not fit a Unix socket
    address (107 bytes on Linux; the files are named ``<ip>-<port>``, ports from 1): a deep
    folder keeps TCP rather than fail.
    """
    ip = os.path.join(os.path.abspath(folder), uuid.uuid4().hex[:12])
    if len(os.fsencode(ip)) + len("-65535") > SUN_PATH_MAX:
        return
    if km.transport == "tcp" and km.ip in ("127.0.0.1", "localhost"):
        km.transport = "ipc"
        km.ip = ip


POLL_SLICE_S = 1.0


def _sliced(get_msg: Any) -> Any:
    """A kernel channel's ``get_msg`` that waits in slices of ``POLL_SLICE_S`` seconds.

    Why: two website builds each had one lesson (zh 07 after its widget cell, zh 01 after
    another) stand still for the whole 300 s cell timeout with the kernel idle, then go on
    without an error: the reply's recorded time was the kernel's, 0.6 s after the cell
    started. That fits a missed wake-up: a ``zmq.asyncio`` poll whose wake-up was lost
    returns the message that arrived only when its timeout fires, since it then looks again
    with ``poll(0)`` (``_AsyncPoller.poll`` in ``zmq/_future.py``; zeromq/pyzmq#1558 reports
    the same). nbclient waits for a reply with the cell's whole timeout, and for output with
    none at all. In slices, a missed wake-up costs at most one slice.
    """

    async def sliced(timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else deadline - time.monotonic()
            try:
                return await get_msg(timeout=max(0.0, min(POLL_SLICE_S, left)))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return sliced


def execute_lesson(page: Page, root: Path) -> tuple[nbformat.NotebookNode, float | None]:
    """Run a lesson as the tests do: in its folder, with the course's kernel. Returns the
    notebook and the CPU seconds its kernel and the kernel's processes used (None where
    that cannot be read)."""
    from nbclient import NotebookClient

    class Client(NotebookClient):
        cpu_s: float | None = None

        def create_kernel_manager(self) -> Any:
            km = super().create_kernel_manager()
            unix_sockets(km, sockets)
            return km

        async def async_start_new_kernel_client(self) -> Any:
            kc = await super().async_start_new_kernel_client()
            for channel in (kc.shell_channel, kc.iopub_channel):
                channel.get_msg = _sliced(channel.get_msg)
            return kc

        async def _async_cleanup_kernel(self) -> None:
            process = getattr(getattr(self.km, "provisioner", None), "process", None)
            self.cpu_s = _tree_cpu(getattr(process, "pid", None))  # before it shuts down
            await super()._async_cleanup_kernel()

    nb = nbformat.reads(page.text, as_version=4)
    client = Client(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=build.KERNEL_NAME,
        resources={"metadata": {"path": str(root / page.kind / page.lang)}},
    )
    with tempfile.TemporaryDirectory(prefix="ddp-lab-kernel-") as sockets:
        client.execute()
    return nb, client.cpu_s
