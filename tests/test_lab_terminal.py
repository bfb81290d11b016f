"""JupyterLab's terminal, opened the way the browser opens one (REST, then its websocket),
runs ``ddp-lab`` from this install: the route the README and the lessons give ("in a
terminal: ddp-lab check ...").

The server runs with the configuration setup.sh wrote into the venv
(``.venv/etc/jupyter/jupyter_server_config.json``) and a PATH that lacks the venv, as a
login shell would reset it: only the shell setup.sh configures can put ``ddp-lab`` there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import descendants

from ddp_lab.runtime.launcher import free_port

CONFIG = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.json"


def _shell_configured() -> bool:
    try:
        config = json.loads(CONFIG.read_text())
    except (OSError, ValueError):
        return False
    return "shell_command" in config.get("ServerApp", {}).get("terminado_settings", {})


async def _terminal_output(url: str, command: str, marker: str, timeout: float) -> str:
    """Open a terminal as JupyterLab does, type ``command``, read until ``marker``."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    req = urllib.request.Request(f"{url}/api/terminals", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        name = json.loads(resp.read())["name"]
    ws_url = url.replace("http://", "ws://") + f"/terminals/websocket/{name}"
    ws = await websocket_connect(HTTPRequest(ws_url))
    text = ""
    try:
        await ws.write_message(json.dumps(["stdin", command + "\r"]))
        deadline = time.monotonic() + timeout
        while marker not in text:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} from the terminal within {timeout} s:\n{text[-3000:]}"
            msg = await asyncio.wait_for(ws.read_message(), left)
            assert msg is not None, f"the terminal closed:\n{text[-3000:]}"
            kind, *data = json.loads(msg)
            if kind == "stdout":
                text += data[0]
    finally:
        ws.close()
        req = urllib.request.Request(f"{url}/api/terminals/{name}", method="DELETE")
        urllib.request.urlopen(req, timeout=30).close()
    return text


def test_ddp_lab_runs_in_a_jupyterlab_terminal(tmp_path):
    if not _shell_configured():
        pytest.skip(f"setup.sh has not configured JupyterLab's terminals here ({CONFIG})")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "VIRTUAL_ENV"))}
    env.update(
        PATH="/usr/bin:/bin",  # no venv: the terminal's shell must add it
        HOME=str(tmp_path),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
    )
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={free_port()}",
            "--IdentityProvider.token=",
            "--PasswordIdentityProvider.hashed_password=",
            "--ServerApp.disable_check_xsrf=True",
            f"--ServerApp.root_dir={tmp_path}",
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],  # fmt: skip
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        info, url = tmp_path / "runtime" / f"jpserver-{proc.pid}.json", None
        deadline = time.monotonic() + 120
        while url is None:
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:]
            )
            try:
                url = json.loads(info.read_text())["url"].rstrip("/")
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        # "DONE-42" is only printed, never typed: the echo of the line cannot end the wait
        command = 'command -v ddp-lab; ddp-lab --help; echo "rc=$? DONE-$((40 + 2))"'
        text = asyncio.run(_terminal_output(url, command, "DONE-42", 90))
    finally:
        below = descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        for pid in below:  # the terminal's shell, if the server left it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert str(Path(sys.prefix) / "bin" / "ddp-lab") in text, text[-3000:]
    assert "usage: ddp-lab" in text and "rc=0 DONE-42" in text, text[-3000:]
    assert "command not found" not in text
