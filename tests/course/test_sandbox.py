"""course.sandbox: what a sandboxed submission can and cannot reach (Linux with bubblewrap)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_lab.course.grading import isolation, sandbox

pytestmark = pytest.mark.skipif(
    not sandbox.available(), reason="no bubblewrap/user namespaces here (test.sh installs bwrap)"
)
REPO = Path(__file__).resolve().parent.parent


def run(
    code: str, tmp_path: Path, timeout: float = 120, **kw: object
) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    slots = isolation.Slots()  # a user id no grading running on this machine has
    job = slots.acquire()
    try:
        cmd, env = sandbox.wrap([sys.executable, "-c", code], work, job=job, **kw)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        slots.release(job)


def test_reads_python_writes_only_its_folder(tmp_path: Path) -> None:
    secret = tmp_path / "instructor_secret.txt"
    secret.write_text("the seed")
    code = (
        "import os, torch, ddp_lab\n"
        f"print('secret', os.path.exists({str(secret)!r}))\n"
        f"print('repo', os.path.exists({str(REPO / 'README.md')!r}))\n"
        "open('mine.txt', 'w').write('ok')\n"
        "print('mine', open('mine.txt').read())\n"
        "for p in ['/etc/evil', '/usr/evil', os.path.dirname(ddp_lab.__file__) + '/evil']:\n"
        "    try:\n"
        "        open(p, 'w')\n"
        "        print('WROTE', p)\n"
        "    except OSError:\n"
        "        print('refused', p)\n"
    )
    p = run(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "secret False" in p.stdout and "repo False" in p.stdout
    assert "WROTE" not in p.stdout and p.stdout.count("refused") == 3
    # Its folder is a tmpfs of its own inside the sandbox: nothing reaches the host's disk.
    assert "mine ok" in p.stdout and not (tmp_path / "work" / "mine.txt").exists()


def test_writable_places_and_files_are_size_limited(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "job.json").write_text("{}")
    code = (
        "import os\n"
        "print('job', open('job.json').read())\n"
        "try:\n"
        "    open('job.json', 'w')\n"
        "except OSError:\n"
        "    print('job read-only')\n"
        "for folder in ('.', '/tmp', '/dev/shm'):\n"
        "    n = 0\n"
        "    try:\n"
        "        for k in range(100):\n"
        "            with open(os.path.join(folder, f'f{k}'), 'wb') as f:\n"
        "                f.write(b'x' * 2**20)\n"
        "            n += 1\n"
        "    except OSError as e:\n"
        "        print(folder, n, e.errno)\n"
        "for k in range(4):\n"
        "    os.remove(f'/tmp/f{k}')\n"
        "try:\n"
        "    with open('/tmp/big', 'wb') as f:\n"
        "        f.write(b'x' * 3 * 2**20)\n"
        "except OSError as e:\n"
        "    print('fsize', e.errno)\n"
    )
    limits = sandbox.Limits(workdir_mb=8, tmp_mb=16, shm_mb=12, file_size_mb=2)
    p = run(code, tmp_path, limits=limits)
    assert p.returncode == 0, p.stderr
    assert "job {}" in p.stdout and "job read-only" in p.stdout
    # Each folder stops at its size (ENOSPC, 1 MiB files), a file at RLIMIT_FSIZE (EFBIG).
    full = {ln.split()[0]: ln.split()[1:] for ln in p.stdout.splitlines() if ln[:1] in "./"}
    assert {k: v[1] for k, v in full.items()} == {".": "28", "/tmp": "28", "/dev/shm": "28"}
    assert 4 <= int(full["."][0]) <= 8 and 12 <= int(full["/tmp"][0]) <= 16, p.stdout
    assert 8 <= int(full["/dev/shm"][0]) <= 12 and "fsize 27" in p.stdout
    assert sorted(os.listdir(tmp_path / "work")) == ["job.json"]


def test_environment_is_cleared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", "instructor-secret")
    p = run("import os; print(sorted(os.environ))", tmp_path)
    assert "DDP_LAB_GRADE_SEED" not in p.stdout and "instructor-secret" not in p.stdout


def test_the_user_has_a_name_and_a_home(tmp_path: Path) -> None:
    """As root the sandbox's user id is in no /etc/passwd: getpass.getuser() would raise
    KeyError, and torch before 2.13 calls it when DDP imports torch._dynamo."""
    p = run("import getpass, os; print(getpass.getuser(), os.path.expanduser('~'))", tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [sandbox.SANDBOX_USER, str((tmp_path / "work").resolve())]


def test_host_loopback_is_out_of_reach_but_own_loopback_works(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "s = socket.socket(); s.settimeout(3)\n"
            f"try:\n    s.connect(('127.0.0.1', {port})); print('REACHED HOST')\n"
            "except OSError as e:\n    print('refused', type(e).__name__)\n"
            "import ddp_lab as dl, torch, torch.distributed as dist\n"
            "def f(rank, n):\n"
            "    dist.init_process_group('gloo'); t = torch.ones(1); dist.all_reduce(t)\n"
            "    return t.item()\n"
            "print('ranks', dl.spawn(f, args=(2,), nprocs=2, quiet=True))\n"
        )
        p = run(code, tmp_path)
    assert "REACHED HOST" not in p.stdout and "refused" in p.stdout, p.stdout + p.stderr
    assert "ranks [2.0, 2.0]" in p.stdout, p.stderr


def test_fork_bomb_is_contained(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            import time; time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('stopped after', n, type(e).__name__)\n"
    )
    t0 = time.monotonic()
    p = run(code, tmp_path, limits=sandbox.Limits(nproc=64))
    assert "stopped after" in p.stdout, p.stdout + p.stderr
    assert int(p.stdout.split()[2]) < 64
    assert time.monotonic() - t0 < 60  # the sleeping children die with the namespace


def test_nothing_outlives_a_killed_sandbox(tmp_path: Path) -> None:
    marker = f"ddp-lab-orphan-{os.getpid()}"
    work = tmp_path / "work"
    work.mkdir()
    code = (
        "import subprocess, time\n"
        f"subprocess.Popen(['sleep', '300', '{marker}'][:2])\n"
        f"subprocess.Popen(['sh', '-c', 'exec -a {marker} sleep 300'])\n"
        "print('started', flush=True); time.sleep(300)\n"
    )
    cmd, env = sandbox.wrap([sys.executable, "-c", code], work)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
        if not left.strip():
            break
        time.sleep(0.2)
    assert not left.strip(), f"left running: {left}"


def test_turned_off_on_purpose_does_not_ask_to_install_bubblewrap(monkeypatch, capsys) -> None:
    if sandbox.bwrap_path() is None:
        pytest.skip("bubblewrap is not usable here: the install advice is then right")
    monkeypatch.setenv("DDP_LAB_SANDBOX", "0")
    monkeypatch.setattr(sandbox, "_warned", False)
    sandbox.warn_unsandboxed("en")
    err = capsys.readouterr().err
    assert "DDP_LAB_SANDBOX=0" in err and "apt-get install" not in err
