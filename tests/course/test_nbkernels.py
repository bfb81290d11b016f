"""course/nbkernels.py: kernels on Unix sockets, for one manager and for a whole test run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from jupyter_client import KernelManager

from ddp_lab.course.nbkernels import SUN_PATH_MAX, unix_sockets

ROOT = Path(__file__).resolve().parents[2]


def test_unix_sockets_only_for_tcp_on_this_host_and_where_the_path_fits(tmp_path):
    km = KernelManager()
    unix_sockets(km, str(tmp_path))
    assert km.transport == "ipc" and Path(km.ip).parent == tmp_path
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
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax"]
            + [*options, str(notebook)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        nb = nbformat.v4.new_notebook()
        nb.cells = [
            nbformat.v4.new_code_cell(
                "from ipykernel.kernelapp import IPKernelApp\n"
                "app = IPKernelApp.instance()\n"
                "assert app.transport == 'ipc' and 'ddp-lab-kernels-' in app.ip, app.ip"
            )
        ]
        nbformat.write(nb, notebook)
        done = pytest()
        assert done.returncode == 0, done.stdout + done.stderr
        # Without the plugin the same cell fails (TCP): the test can tell.
        done = pytest("-o", "addopts=")
        assert done.returncode == 1, done.stdout + done.stderr
    finally:
        shutil.rmtree(folder)
