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
import sys
import time
from pathlib import Path

import pytest
from _servers import Jupyter, jupyter

CONFIG = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.json"


def _shell_configured() -> bool:
    try:
        config = json.loads(CONFIG.read_text())
    except (OSError, ValueError):
        return False
    return "shell_command" in config.get("ServerApp", {}).get("terminado_settings", {})


async def _terminal_output(server: Jupyter, command: str, marker: str, timeout: float) -> str:
    """Open a terminal as JupyterLab does, type ``command``, read until ``marker``."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    name = server.api("POST", "/api/terminals", data=b"{}")["name"]
    ws_url = server.url.replace("http://", "ws://") + f"/terminals/websocket/{name}"
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
        server.api("DELETE", f"/api/terminals/{name}")
    return text


def test_ddp_lab_runs_in_a_jupyterlab_terminal(tmp_path):
    if not _shell_configured():
        pytest.skip(f"setup.sh has not configured JupyterLab's terminals here ({CONFIG})")
    with jupyter(
        tmp_path,
        tmp_path,
        drop_env=("VIRTUAL_ENV",),
        # no venv: the terminal's shell must add it
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    ) as server:
        # "DONE-42" is only printed, never typed: the echo of the line cannot end the wait
        command = 'command -v ddp-lab; ddp-lab --help; echo "rc=$? DONE-$((40 + 2))"'
        text = asyncio.run(_terminal_output(server, command, "DONE-42", 90))
    assert str(Path(sys.prefix) / "bin" / "ddp-lab") in text, text[-3000:]
    assert "usage: ddp-lab" in text and "rc=0 DONE-42" in text, text[-3000:]
    assert "command not found" not in text
