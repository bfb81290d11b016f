"""Running one lesson for the website (``course.site``): nbclient, with what a build needs.

``execute_lesson`` runs a lesson's notebook as the tests do (in its folder, with the
course's kernel) and returns it with the CPU seconds its kernel and the kernel's processes
used, which the build logs. Split from ``site`` to keep each module readable whole.
Its kernel listens on Unix sockets, not TCP ports (``course.nbkernels``: the port race).
"""

from __future__ import annotations

import queue
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat

from ddp_lab.course import build
from ddp_lab.course.nbkernels import unix_sockets
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
