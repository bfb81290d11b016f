"""Run a submission's code in a sandbox: bubblewrap, resource limits, another user.

What a sandboxed command gets (Linux with bubblewrap and user namespaces):
- a read-only view of the system folders and of Python and its packages, nothing else of
  the host: no home folders, no other submissions, no release or solutions;
- one writable folder and a private ``/tmp`` and ``/dev/shm``, each a tmpfs of a fixed size
  inside the sandbox (``Limits``: the host's disk never fills, and nothing written there
  outlives the run); the files the caller put in the folder are visible read-only;
- its own network namespace with only a loopback (ranks still talk gloo over it; the host's
  loopback services are out of reach), its own PID namespace (nothing it starts outlives it:
  ``--die-with-parent`` kills the namespace's first process when the grader kills bwrap),
  its own IPC and UTS namespaces, a cleared environment (the grading seed never enters);
- limits: processes (``RLIMIT_NPROC``, counted per user, so as root the command runs as a
  user id of its own, where root would be exempt: ``BASE_UID + job``, where the grader
  gives each running submission a ``job`` no other running one has, see
  ``course.isolation.Slots``), address space, CPU seconds, file size (``RLIMIT_FSIZE``), no
  core dumps. The grader adds a cgroup per submission (``course.isolation``).

Where the machine cannot do this (no bubblewrap, user namespaces disabled, not Linux) the
command runs as is and ``warn_unsandboxed`` says so once, loudly.

How it differs from a container per submission (Gradescope, otter-grader): no image to build
and no daemon; it isolates the file system, network and processes, not the kernel.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.i18n import _t

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# The environment a sandboxed run starts from; everything else (the grading seed, tokens,
# the instructor's credentials) stays outside.
KEEP_ENV = ("LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "DDP_LAB_LANG", "MPLBACKEND")
BASE_UID = 61000  # first user id for sandboxed runs as root (one per parallel job)
SANDBOX_USER = "learner"  # the user name a sandboxed process reads (USER, LOGNAME)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run (per process, except ``nproc``: per user)."""

    nproc: int = 512  # processes and threads: a few ranks with torch's thread pools fit
    address_space_gb: float = 16.0
    cpu_seconds: int = 3600
    file_size_mb: int = 256  # RLIMIT_FSIZE: the largest file a process may write
    workdir_mb: int = 256  # tmpfs over the working folder (0: bind the host folder instead)
    tmp_mb: int = 256  # tmpfs on /tmp
    shm_mb: int = 512  # tmpfs on /dev/shm (torch.multiprocessing shares tensors there)


def _python_dirs() -> list[str]:
    """Folders Python needs to run this package: prefixes and the import path."""
    import ddp_lab

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        dirs.add(sysconfig.get_paths()[key])
    dirs.add(str(Path(ddp_lab.__file__).resolve().parent))  # the package, not the repository
    for entry in sys.path:
        p = Path(entry or ".").resolve()
        if p.is_dir() and ("site-packages" in p.parts or "dist-packages" in p.parts):
            dirs.add(str(p))
    dirs.add(str(Path(sys.executable).resolve().parent))
    return sorted(d for d in dirs if d and Path(d).exists())


@functools.cache
def bwrap_path() -> str | None:
    """bubblewrap, if installed and able to create namespaces here (checked once)."""
    if not sys.platform.startswith("linux"):
        return None
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = [path, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent"]
    if os.geteuid() == 0:
        probe += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", "setpriv"]
        probe += [f"--reuid={BASE_UID}", f"--regid={BASE_UID}", "--clear-groups", "--", "true"]
    else:
        probe += ["--unshare-user", "--", "true"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return path if ok else None


def available() -> bool:
    """Whether submissions are sandboxed here (``DDP_LAB_SANDBOX=0`` turns it off, loudly)."""
    return os.environ.get("DDP_LAB_SANDBOX", "1") != "0" and bwrap_path() is not None


_warned = False


def warn_unsandboxed(lang: str = "en") -> None:
    """Say once, on stderr, that submissions run with the grader's rights."""
    global _warned
    if _warned or available():
        return
    _warned = True
    if os.environ.get("DDP_LAB_SANDBOX") == "0" and bwrap_path() is not None:
        # Turned off on purpose where it works: do not ask for what is installed.
        text = _t(
            "WARNING: submissions are NOT sandboxed: DDP_LAB_SANDBOX=0 turned the "
            "sandbox off. Their code runs with your rights: it can read and write your "
            "files and reach your network. Unset DDP_LAB_SANDBOX to sandbox them.",
            lang,
        )
    else:
        text = _t(
            "WARNING: submissions are NOT sandboxed on this machine (needs Linux "
            "with bubblewrap and user namespaces: apt-get install bubblewrap). Their "
            "code runs with your rights: it can read and write your files and reach "
            "your network.",
            lang,
        )
    print("\n" + "!" * 78 + "\n" + text + "\n" + "!" * 78 + "\n", file=sys.stderr, flush=True)


def sandbox_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a sandboxed command: a short whitelist, no secrets."""
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    import ddp_lab

    # The same ddp_lab as the grader's; only the package folder is visible, not its repository.
    package_parent = str(Path(ddp_lab.__file__).resolve().parent.parent)
    env.update(PATH="/usr/local/bin:/usr/bin:/bin", PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1")
    env.update(PYTHONPATH=package_parent)
    env.update(extra or {})
    return env


def wrap(
    argv: list[str],
    workdir: str | Path,
    limits: Limits = Limits(),
    job: int = 0,
    env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` sandboxed in ``workdir``.

    Without a sandbox (see ``available``) ``argv`` is returned with the environment
    unchanged apart from ``env``, and the caller should call ``warn_unsandboxed``.
    """
    workdir = str(Path(workdir).resolve())
    # USER/LOGNAME: as root, the sandbox runs as a user id /etc/passwd does not list, and
    # getpass.getuser() then raises KeyError unless they are set. torch before 2.13 calls it
    # when torch._dynamo is imported, which DDP does (torch/_inductor/runtime/
    # cache_dir_utils.py: default_cache_dir; pytorch/pytorch#140765).
    names = {"HOME": workdir, "USER": SANDBOX_USER, "LOGNAME": SANDBOX_USER}
    run_env = sandbox_env({**names, "TMPDIR": "/tmp", "GLOO_SOCKET_IFNAME": "lo", **(env or {})})
    bwrap = bwrap_path() if available() else None
    if bwrap is None:
        return list(argv), {**os.environ, **(env or {})}
    as_root = os.geteuid() == 0
    nproc = limits.nproc
    if not as_root:
        # RLIMIT_NPROC counts every process of this user: allow the ones already running.
        nproc += sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owned(p))
    cmd: list[str] = []
    cmd += [
        "prlimit",
        f"--nproc={nproc}",
        f"--as={int(limits.address_space_gb * 2**30)}",
        f"--cpu={limits.cpu_seconds}",
        f"--fsize={limits.file_size_mb * 2**20}",
        "--core=0",
        "--",
        bwrap,
        "--unshare-pid",
        "--unshare-net",  # a network namespace of its own: only a loopback
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "localhost",  # resolvable from /etc/hosts, so gloo finds its address
        "--clearenv",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *_tmpfs("/tmp", limits.tmp_mb),
        *_tmpfs("/dev/shm", limits.shm_mb),
    ]
    read_only = [d for d in (*SYSTEM_DIRS, *_python_dirs()) if Path(d).exists()]
    if limits.workdir_mb > 0:
        cmd += _bind_args(read_only, [])
        cmd += _private_workdir(workdir, limits.workdir_mb)
    else:
        cmd += _bind_args(read_only, [workdir])
    cmd += ["--chdir", workdir]
    for key, value in run_env.items():
        cmd += ["--setenv", key, value]
    if as_root:
        # RLIMIT_NPROC does not apply to root (nor to root inside a user namespace): bwrap
        # builds the sandbox as root, then setpriv becomes a user id of this job's own,
        # dropping every capability. The views are bind mounts, so that user reads Python
        # even where it lives under /root.
        uid = BASE_UID + job
        if limits.workdir_mb <= 0:
            os.chown(workdir, uid, uid)
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        cmd += ["--inh-caps=-all", "--bounding-set=-all"]
    else:
        cmd += ["--unshare-user"]
    return cmd + ["--", *argv], run_env


def _tmpfs(path: str, size_mb: int) -> list[str]:
    """bwrap arguments for a world-writable tmpfs of ``size_mb`` MiB on ``path``."""
    return ["--perms", "01777", "--size", str(size_mb * 2**20), "--tmpfs", path]


def _private_workdir(workdir: str, size_mb: int) -> list[str]:
    """bwrap arguments: a tmpfs of ``size_mb`` on ``workdir``; what the caller put there is
    shown read-only (files) or as empty writable folders (folders, one level)."""
    args = _tmpfs(workdir, size_mb)
    for entry in sorted(Path(workdir).iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            args += ["--perms", "01777", "--dir", str(entry)]
        elif entry.is_file() and not entry.is_symlink():
            args += ["--ro-bind", str(entry), str(entry)]
    return args


def _bind_args(read_only: list[str], writable: list[str]) -> list[str]:
    """bwrap arguments for these views: folders inside another view are left out, and
    the parents of each view are made traversable (bwrap would create them 0700, which a
    non-root user cannot enter)."""
    views = sorted({str(Path(d)) for d in read_only} | set(writable), key=len)
    kept: list[str] = []
    for d in views:
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(d)
    parents = sorted({str(p) for d in kept for p in Path(d).parents if str(p) != "/"}, key=len)
    args: list[str] = []
    for p in parents:
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            args += ["--perms", "0755", "--dir", p]
    for d in sorted(kept, key=len):
        args += ["--bind" if d in writable else "--ro-bind", d, d]
    return args


def _owned(proc: Path) -> bool:
    try:
        return proc.stat().st_uid == os.geteuid()
    except OSError:
        return False
