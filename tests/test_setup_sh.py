"""setup.sh, run against stand-ins: a `.venv/bin/python` that records how pip is called (and
with which PIP_INDEX_URL), a `jupyter` that records how JupyterLab is started, a `bwrap`.

What is checked is what the README promises: TORCH_INDEX_URL reaches torch's `pip install`
as `--index-url`, PIP_INDEX_URL reaches every pip call, JupyterLab gets `--allow-root` as
root and the venv first on PATH, and JupyterLab's terminals run a bash that activates the venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Records each call (arguments and PIP_INDEX_URL); `import torch` fails, so torch is installed;
# the inline script that writes JupyterLab's configuration runs in this Python.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-" ]; then exec {python} "$@"; fi
echo "python $* | PIP_INDEX_URL=${{PIP_INDEX_URL:-}}" >>"{log}"
if [ "$1" = "-c" ] && [ "$2" = "import torch" ]; then exit 1; fi
exit 0
"""
FAKE_JUPYTER = """#!/usr/bin/env bash
echo "jupyter $* | PATH=$PATH" >>"{log}"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "setup.sh", repo / "setup.sh")
    log = tmp_path / "calls.log"
    for name, text in (("python", FAKE_PYTHON), ("jupyter", FAKE_JUPYTER)):
        path = repo / ".venv" / "bin" / name
        path.write_text(text.format(python=sys.executable, log=log))
        path.chmod(0o755)
    venv_bin = repo / ".venv" / "bin"
    (venv_bin / "activate").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    ddp_lab = venv_bin / "ddp-lab"
    ddp_lab.write_text("#!/bin/sh\necho ddp-lab ran\n")
    ddp_lab.chmod(0o755)
    tools = tmp_path / "tools"  # bwrap present: setup.sh must not call apt-get here
    tools.mkdir()
    (tools / "bwrap").write_text("#!/bin/sh\n")
    (tools / "bwrap").chmod(0o755)
    return repo


def _run(
    repo: Path, *args: str, cwd: Path | None = None, **env: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    tools = repo.parent / "tools"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "TORCH_"))}
    clean.update(PATH=f"{tools}:/usr/bin:/bin", HOME=str(repo.parent), PYTHON=sys.executable)
    clean.update(env)
    done = subprocess.run(
        ["bash", str(repo / "setup.sh"), *args],
        cwd=cwd or repo,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = repo.parent / "calls.log"
    return done, log.read_text().splitlines() if log.exists() else []


def test_index_variables_reach_pip(checkout):
    cpu, mirror = "https://download.pytorch.org/whl/cpu", "https://pypi.tuna.tsinghua.edu.cn/simple"
    done, calls = _run(checkout, "--no-lab", TORCH_INDEX_URL=cpu, PIP_INDEX_URL=mirror)
    assert done.returncode == 0, done.stderr
    pip = [c for c in calls if " -m pip install" in c]
    assert (
        pip[0] == f"python -m pip install --progress-bar on --index-url {cpu} torch==2.13.0"
        f" | PIP_INDEX_URL={mirror}"
    )
    assert pip[1] == f"python -m pip install -q -e .[course] | PIP_INDEX_URL={mirror}"
    assert any("--display-name Python 3 (ddp-lab)" in c for c in calls)
    assert not any(c.startswith("jupyter") for c in calls)
    assert cpu in done.stderr and mirror in done.stderr  # said where packages come from


def test_default_torch_from_pip_index_and_hint_for_the_cpu_build(checkout):
    done, calls = _run(checkout, "--no-lab", TORCH_SPEC="torch==2.13.0+cpu")
    assert done.returncode == 0, done.stderr
    assert "python -m pip install --progress-bar on torch==2.13.0+cpu | PIP_INDEX_URL=" in calls
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in done.stderr
    assert "source .venv/bin/activate" in done.stderr
    assert "start the lab with: bash setup.sh --lab /" in done.stderr


def test_unreachable_torch_index_gets_a_hint(checkout):
    # pip fails for torch (as when its index cannot be reached): setup.sh stops and says why
    fake = checkout / ".venv" / "bin" / "python"
    fake.write_text(
        fake.read_text().replace(
            "exit 0\n",
            'case "$*" in *"pip install"*torch==*) echo "ERROR: ResolutionImpossible" >&2;'
            " exit 1;; esac\nexit 0\n",
        )
    )
    cpu = "https://download.pytorch.org/whl/cpu"
    done, calls = _run(checkout, "--no-lab", TORCH_INDEX_URL=cpu)
    assert done.returncode == 1
    assert f"torch could not be installed from {cpu}" in done.stderr
    assert "TORCH_SPEC=/path/to/torch-" in done.stderr and "无法从" in done.stderr
    assert not any("-e .[" in c for c in calls)  # stopped before the package


def test_lab_starts_again_without_installing(checkout):
    done, calls = _run(checkout, "--lab", "--no-browser")
    assert done.returncode == 0, done.stderr
    assert not any(" -m pip install" in c for c in calls)
    (lab,) = [c for c in calls if c.startswith("jupyter")]
    assert lab.startswith("jupyter lab --notebook-dir=") and "--no-browser" in lab


@pytest.mark.parametrize("root", [True, False])
def test_jupyterlab_gets_the_venv_on_path_and_allow_root_as_root(checkout, root):
    # setup.sh asks `id -u`; a stand-in answers as root or as a user (the whole setup.sh run
    # by a real user installs for minutes: too slow for the suite)
    stub = checkout.parent / "tools" / "id"
    stub.write_text(f"#!/bin/sh\necho {0 if root else 1000}\n")
    stub.chmod(0o755)
    done, calls = _run(checkout, "--no-browser", "--port", "0")
    assert done.returncode == 0, done.stderr
    (lab,) = [c for c in calls if c.startswith("jupyter")]
    args, _, path = lab.partition(" | PATH=")
    venv_bin = str(checkout / ".venv" / "bin")
    assert path.split(":")[0] == venv_bin
    # the server's root is the course (exercises/ and work/ reachable), opened in notebooks/
    expected = [
        "jupyter",
        "lab",
        f"--notebook-dir={checkout}",
        "--LabApp.default_url=/lab/tree/notebooks",
    ]
    expected += ["--allow-root"] if root else []
    assert args.split() == [*expected, "--no-browser", "--port", "0"]
    assert ("--allow-root" in done.stderr) == root


def test_jupyterlab_terminals_run_a_shell_with_the_venv(checkout):
    done, _ = _run(checkout, "--no-lab")
    assert done.returncode == 0, done.stderr
    config = json.loads((checkout / ".venv/etc/jupyter/jupyter_server_config.json").read_text())
    shell = config["ServerApp"]["terminado_settings"]["shell_command"]
    assert Path(shell[0]).name == "bash" and "-l" not in shell  # no login shell: no PATH reset
    # notebooks open unmodified in JupyterLab (tests/course/test_browser.py shows it)
    manager = config["ServerApp"]["contents_manager_class"]
    assert manager == "ddp_lab.course.lab_contents.CourseContentsManager"
    # The shell a terminal starts, with a PATH that lacks the venv, as a login shell would set.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(checkout.parent), "TERM": "dumb"}
    out = subprocess.run(
        [*shell, "-c", "command -v ddp-lab && ddp-lab"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert out.stdout.split() == [str(checkout / ".venv/bin/ddp-lab"), "ddp-lab", "ran"], out
    # An existing configuration is kept (merged), and a second run changes nothing.
    config["ServerApp"]["ip"] = "127.0.0.1"
    path = checkout / ".venv/etc/jupyter/jupyter_server_config.json"
    path.write_text(json.dumps(config))
    assert _run(checkout, "--no-lab")[0].returncode == 0
    again = json.loads(path.read_text())
    assert again["ServerApp"]["ip"] == "127.0.0.1"
    assert again["ServerApp"]["terminado_settings"]["shell_command"] == shell


def test_venv_elsewhere_relative_to_where_setup_sh_started(checkout):
    # One venv per Python (README): VENV relative to the caller's folder, not the course's.
    there = checkout.parent / "work"
    there.mkdir()
    shutil.move(checkout / ".venv", there / "v312")  # the stand-ins, in the venv asked for
    done, calls = _run(checkout, "--no-lab", cwd=there, VENV="v312")
    assert done.returncode == 0, done.stderr
    assert not (checkout / ".venv").exists()  # nothing made where VENV does not point
    assert any(" -m pip install -q -e .[course]" in c for c in calls)
    config = json.loads((there / "v312/etc/jupyter/jupyter_server_config.json").read_text())
    shell = config["ServerApp"]["terminado_settings"]["shell_command"]
    assert shell[-2] == f"{there}/v312/etc/ddp-lab/bashrc"
    assert f"source {there}/v312/bin/activate" in done.stderr
    assert f"start the lab with: VENV={there}/v312 bash setup.sh --lab" in done.stderr
