"""Jupyter kernels on Unix sockets, not TCP ports: for the website's runs and the tests'.

Over TCP, jupyter_client picks a kernel's five ports by binding port 0 and closing, writes them
to the connection file, and the kernel binds them a second or more later; in between, any
process of the machine may get one of them as its own ephemeral port
(jupyter/jupyter_client#276). A lesson's ranks open many connections (gloo, the rendezvous
store), and where kernels run side by side (test.sh's four runs, ``ddp-lab site``'s jobs,
benchmarks/gpu_check.sh's notebooks) a kernel then dies with "zmq.error.ZMQError: Address
already in use", and nbclient says "Kernel died before replying to kernel_info". A socket file
in a folder of ours is nobody else's: no port to race for.

``unix_sockets`` sets one kernel manager up so (``course.site_run`` uses it). This module is
also a pytest plugin that does it for every kernel a test run starts, nbval's and nbclient's
alike; pyproject.toml's ``addopts`` loads it in every run of the repository's tests and
notebooks::

    pytest -p ddp_lab.course.nbkernels --nbval-lax notebooks
"""

from __future__ import annotations

import atexit
import os
import uuid
from typing import Any

SUN_PATH_MAX = 107  # sockaddr_un.sun_path: 108 bytes with the terminating NUL (unix(7))


def unix_sockets(km: Any, folder: str) -> None:
    """Have kernel manager ``km`` start its kernel on Unix sockets in ``folder``, not on TCP.

    ``ip`` is absolute: a relative one is resolved in the kernel's working folder, where the
    client does not look. jupyter_client removes the socket files when the kernel shuts down.
    A manager set to anything else than TCP on this host is left as it is, and so is one whose
    socket paths would not fit a Unix socket address (the files are named ``<ip>-<port>``,
    ports from 1): a deep folder keeps TCP rather than fail.

    The connection file goes in ``folder`` too, where it has none yet: jupyter_client's default
    is a ``tmp*.json`` in TMPDIR, which a process killed before the kernel's shutdown leaves.
    """
    name = os.path.join(os.path.abspath(folder), uuid.uuid4().hex[:12])
    if not km.connection_file:
        km.connection_file = name + ".json"
    if km.transport != "tcp" or km.ip not in ("127.0.0.1", "localhost"):
        return
    if len(os.fsencode(name)) + len("-65535") <= SUN_PATH_MAX:
        km.transport, km.ip = "ipc", name


def pytest_configure(config: Any) -> None:
    """Every kernel manager of this run, on Unix sockets in a folder of the run.

    Each manager passes through ``LocalProvisioner.pre_launch`` before its kernel starts.
    The folder goes at exit; one whose run was killed (no exit handlers) goes with the next
    folder anyone makes (a test run, a launch: ``runtime._workdirs``). A hook, not import-time
    code: importing the module changes nothing."""
    try:
        from jupyter_client.provisioning.local_provisioner import LocalProvisioner
    except ImportError:
        return
    if getattr(LocalProvisioner.pre_launch, "_ddp_lab_unix_sockets", False):
        return  # configured already (a second pytest run in this process)
    from ddp_lab.runtime import _workdirs

    folder = _workdirs.make("kernels_")
    atexit.register(_workdirs.remove, folder)
    original = LocalProvisioner.pre_launch

    async def pre_launch(self: Any, **kwargs: Any) -> dict:
        if self.parent is not None:
            unix_sockets(self.parent, folder)
        return await original(self, **kwargs)

    pre_launch._ddp_lab_unix_sockets = True  # type: ignore[attr-defined]
    LocalProvisioner.pre_launch = pre_launch  # type: ignore[method-assign]
