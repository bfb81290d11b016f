"""course/nbkernels.py: kernels on Unix sockets, for one manager and for a whole test run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager

from ddp_lab.course.nbkernels import SUN_PATH_MAX, unix_sockets

ROOT = Path(__file__).resolve().parents[2]
NBVAL = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax"]


def _notebook(path: Path, source: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)


def test_unix_sockets_only_for_tcp_on_this_host_and_where_the_path_fits(tmp_path):
    km = KernelManager()
    unix_sockets(km, str(tmp_path))
    assert km.transport == "ipc" and Path(km.ip).parent == tmp_path
    assert km.connection_file == km.ip + ".json"  # not a tmp*.json in TMPDIR
    remote = KernelManager(ip="10.0.0.2")
    unix_sockets(remote, str(tmp_path))
    assert (remote.transport, remote.ip) == ("tcp", "10.0.0.2")
    deep = tmp_path / ("d" * (SUN_PATH_MAX - len(str(tmp_path))))
    km = KernelManager()
    unix_sockets(km, str(deep))
    assert (km.transport, km.ip) == ("tcp", "127.0.0.1")  # too long for sun_path: TCP


def test_a_notebook_run_in_the_repository_gets_unix_sockets(tmp_path):
    # pyproject.toml's addopts loads the plugin: a bare `pytest --nbval-lax` on a notebook of
    # the repository (as benchmarks/gpu_check.sh runs them) starts its kernel on a socket file.
    folder = ROOT / "build" / f"test-nbkernels-{tmp_path.name}"
    folder.mkdir(parents=True)
    notebook = folder / "t.ipynb"

    def pytest(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*NBVAL, *options, str(notebook)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        _notebook(
            notebook,
            "from ipykernel.kernelapp import IPKernelApp\n"
            "app = IPKernelApp.instance()\n"
            "assert app.transport == 'ipc' and 'ddp_lab_kernels_' in app.ip, app.ip",
        )
        done = pytest()
        assert done.returncode == 0, done.stdout + done.stderr
        # Without the plugin the same cell fails (TCP): the test can tell.
        done = pytest("-o", "addopts=")
        assert done.returncode == 1, done.stdout + done.stderr
    finally:
        shutil.rmtree(folder)


def test_the_folder_of_a_killed_run_goes_with_the_next_folder_made(tmp_path, monkeypatch):
    # A run killed with SIGKILL runs no exit handler: its folder of sockets and connection
    # files stays until the next run (or launch) makes one of its own (runtime/_workdirs.py);
    # then nothing of it is left in TMPDIR.
    from ddp_lab.runtime import _workdirs
    from ddp_lab.runtime._process import pid_alive

    folder = ROOT / "build" / f"test-nbkernels-{tmp_path.name}"
    folder.mkdir(parents=True)
    notebook, told, private = folder / "t.ipynb", folder / "told", tmp_path / "tmp"
    private.mkdir()
    _notebook(
        notebook,
        "import os, time\n"
        "from ipykernel.kernelapp import IPKernelApp\n"
        "app = IPKernelApp.instance()\n"
        f"open({str(told)!r} + '.new', 'w').write(f'{{os.getpid()}} {{app.connection_file}}')\n"
        f"os.replace({str(told)!r} + '.new', {str(told)!r})\n"
        "time.sleep(300)",
    )
    run = subprocess.Popen(
        [*NBVAL, str(notebook)],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(private)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kernel = 0
    try:
        deadline = time.monotonic() + 120
        while not told.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pid, connection_file = told.read_text().split()
        kernel, sockets = int(pid), Path(connection_file).parent  # the sockets' folder too
        assert sockets.parent == private and sockets.name.startswith(f"ddp_lab_kernels_{run.pid}_")
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert sockets.is_dir()  # left: no exit handler ran
        monkeypatch.setattr(tempfile, "tempdir", str(private))
        assert _workdirs.remove_stale() == [str(sockets)]
        assert list(private.iterdir()) == []
    finally:
        run.kill()
        run.wait()
        if kernel and pid_alive(kernel):
            os.kill(kernel, signal.SIGKILL)
        shutil.rmtree(folder)
