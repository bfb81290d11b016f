"""Servers the tests start, each on a port chosen when it starts (never a fixed one), each
waited for until it serves and torn down with everything it started:

- ``jupyter``: JupyterLab or a bare jupyter_server (tests/course/test_browser.py,
  tests/test_lab_terminal.py);
- ``static_site``: a static HTTP server over a built site (tests/course/test_site.py);
- ``chromium``: Debian's headless Chromium under Playwright (test_browser.py, test_site.py).

Each is a context manager; the test files wrap them in module-scoped fixtures where their
tests can share one. Imported as ``from _servers import ...`` (``tests/`` is on sys.path,
as for ``conftest``).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import descendants

from ddp_lab.runtime.launcher import free_port

# --------------------------------------------------------------------------------------
# Jupyter
# --------------------------------------------------------------------------------------


@dataclass
class Jupyter:
    """A running Jupyter server: its base URL (no trailing slash), root and process."""

    url: str
    root: Path
    proc: subprocess.Popen

    def api(self, method: str, path: str, data: bytes | None = None) -> object:
        """Call the server's REST API (no token: the server runs without one)."""
        req = urllib.request.Request(self.url + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")


@contextmanager
def jupyter(
    tmp: Path,
    root: Path,
    *,
    app: str = "jupyter_server",
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    drop_env: tuple[str, ...] = (),
    timeout: float = 120,
) -> Iterator[Jupyter]:
    """Run ``python -m app`` (``jupyter_server`` or ``jupyterlab``) on a free localhost port.

    No token, no password, no XSRF check; its config, runtime and data dirs under ``tmp``
    (its log is ``tmp/jupyter.log``), the JPY_* variables and those starting with one of
    ``drop_env`` left out of its environment, ``env`` added. Yields once the server
    listens; on exit its kernels are shut down and the server and every process below it
    (kernels and terminals run in sessions of their own) are gone.
    """
    drop = ("JPY_", *drop_env)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    full_env.update(
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_DATA_DIR=str(tmp / "data"),
    )
    full_env.update(env or {})
    log_path = tmp / "jupyter.log"
    log = open(log_path, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            app,
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={free_port()}",  # taken meanwhile: the server tries the next
            "--IdentityProvider.token=",
            "--PasswordIdentityProvider.hashed_password=",
            "--ServerApp.disable_check_xsrf=True",
            f"--ServerApp.root_dir={root}",
            *args,
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],  # fmt: skip
        cwd=tmp,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = None
    try:
        # the server writes jpserver-<pid>.json once it listens (with the real port)
        info = Path(full_env["JUPYTER_RUNTIME_DIR"]) / f"jpserver-{proc.pid}.json"
        deadline = time.monotonic() + timeout
        while server is None:
            try:
                server = Jupyter(json.loads(info.read_text())["url"].rstrip("/"), root, proc)
            except (OSError, ValueError, KeyError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{app} did not start:\n" + log_path.read_text()[-3000:]
                    ) from None
                time.sleep(0.1)
        # jupyter_server writes that file in start_app() but binds its port in a callback of its
        # event loop, which starts after it (serverapp.py, init_httpserver: "binding sockets must
        # be called from inside an event loop"): on a busy machine the port is not listening yet.
        while True:
            try:
                server.api("GET", "/api/status")
                break
            except urllib.error.URLError as exc:
                refused = isinstance(exc.reason, ConnectionRefusedError)
                if not refused or proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield server
    finally:
        below = descendants(proc.pid)
        try:
            if server is not None:
                server.shutdown_kernels()
        except OSError:
            pass
        proc.send_signal(signal.SIGINT)  # jupyter asks twice; SIGTERM stops it at once
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        # kernels and terminals run in their own sessions: nothing may outlive the server
        for pid in below | descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --------------------------------------------------------------------------------------
# A static site
# --------------------------------------------------------------------------------------


@contextmanager
def static_site(root: Path) -> Iterator[str]:
    """Serve the files under ``root`` over HTTP on a port the OS picks; yield its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --------------------------------------------------------------------------------------
# Chromium
# --------------------------------------------------------------------------------------

CHROMIUM = os.environ.get("DDP_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    """Skip the test when Chromium or Playwright is missing, saying how to get them."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium; "
            "test.sh does it when run as root) or set DDP_LAB_CHROMIUM"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as err:
        pytest.skip(f"Playwright is not installed ({err}): DDP_LAB_EXTRAS=test bash setup.sh")


def fontconfig(tmp: Path) -> Path:
    """A fontconfig file adding the CJK fonts the setup installs (mplfonts) to the system
    ones, so Chromium draws the Chinese widget labels too (a learner's browser has its own
    fonts; a bare Debian machine has none for Chinese)."""
    import mplfonts

    conf = tmp / "fonts.conf"
    conf.write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
        '  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>\n'
        f"  <dir>{Path(mplfonts.__file__).parent / 'fonts'}</dir>\n"
        f"  <cachedir>{tmp / 'fontcache'}</cachedir>\n</fontconfig>\n"
    )
    return conf


@contextmanager
def chromium(tmp: Path) -> Iterator[object]:
    """Headless Chromium under Playwright (a ``playwright.sync_api.Browser``), closed on exit
    with Playwright's driver; the test is skipped when it cannot start."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    fonts = fontconfig(tmp)
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                env={**os.environ, "FONTCONFIG_FILE": str(fonts)},
            )
        except Exception as err:  # noqa: BLE001 (a broken browser install is a skip)
            pytest.skip(f"Chromium at {CHROMIUM} does not start under Playwright: {err}")
        try:
            yield browser
        finally:
            browser.close()
