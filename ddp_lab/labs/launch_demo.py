"""Run the real launchers (torchrun, torch.distributed.launch, mp.spawn) from a notebook.

Chapter 09 compares launchers by running them. Each launch here is a subprocess with a
free port (never a fixed one), a timeout, and a cleanup that leaves nothing running: every
process of a launch carries a marker in its environment, and after the launch any process
still holding that marker is killed. The marker is needed because torchrun starts its
workers in sessions of their own, so killing the agent's process group does not reach them.

The workers are small functions (``launch_workers``, re-exported here), started as ``python -m
ddp_lab.labs.launch_demo WORKER``. They print one ``@rank {json}`` line each, which
``LaunchResult.records`` reads back.

Teaching version: PyTorch has no such wrapper; on a cluster you type the torchrun command
in a shell (or a job script) and read its output in a terminal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from ddp_lab.i18n import _t
from ddp_lab.labs.launch_workers import (  # noqa: F401  # ld.worker_env...: chapter 09 shows them
    ENV_KEYS,
    WORKERS,
    check_worker,
    main,
    worker_allreduce,
    worker_crash,
    worker_env,
    worker_flaky,
    worker_init,
    worker_legacy_args,
    worker_node_habits,
    worker_sleep,
)
from ddp_lab.runtime.launcher import free_port

MARKER = "DDP_LAB_DEMO_ID"
# torchrun's own log lines start with a level letter, a date and the pid, e.g. "W1122 07:33".
_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


# --- running launchers ---------------------------------------------------------------


def _check_count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            _t("{what} must be a whole number >= 1, got {value!r}.", what=what, value=value)
        )
    return value


@dataclass
class LaunchResult:
    """What one launcher command did: its exit code, output and duration."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    leftovers: list[int] = field(default_factory=list)  # pids killed after the launch
    marker: str = ""  # the value of MARKER in this launch's processes' environment

    def records(self) -> list[dict]:
        """The ``@rank`` lines the workers printed, sorted by (restart, RANK)."""
        out = [
            json.loads(line[6:]) for line in self.stdout.splitlines() if line.startswith("@rank ")
        ]
        return sorted(
            out,
            key=lambda r: (
                int(r.get("TORCHELASTIC_RESTART_COUNT") or 0),
                int(r.get("RANK") or r.get("DEMO_SPAWN_INDEX") or 0),
            ),
        )

    def log(self, pattern: str = "", limit: int = 25) -> list[str]:
        """stderr lines matching ``pattern`` (a regex), without torchrun's log prefixes."""
        lines = [_LOG_PREFIX.sub("", line) for line in self.stderr.splitlines()]
        lines = [line for line in lines if line.strip() and line.strip("*").strip()]
        if pattern:
            lines = [line for line in lines if re.search(pattern, line)]
        return lines[:limit]

    def show(self, pattern: str = "", limit: int = 25) -> None:
        """Print the command, its exit code and the (filtered) stderr lines."""
        print("$", " ".join(_shorten(a) for a in self.command))
        state = "timeout" if self.timed_out else f"exit code {self.returncode}"
        print(f"-> {state} after {self.seconds:.1f} s")
        for line in self.log(pattern, limit):
            print("   " + line)


def format_table(
    records: list[dict],
    columns: tuple[str, ...] = (
        "GROUP_RANK",
        "LOCAL_RANK",
        "RANK",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "pid",
    ),
) -> str:
    """The records as an aligned text table (one row per process)."""

    def cell(value: object) -> str:  # one line per row, whatever the value holds
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))

    rows = [list(columns)] + [[cell(r.get(c)) for c in columns] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows
    )


def _shorten(arg: str) -> str:
    return "python" if arg == sys.executable else arg


def tmpdir_of(marker: str) -> str:
    """A launch's own ``TMPDIR``, named by its marker: made by ``start``, removed by ``finish``
    (torchrun without ``--log-dir`` makes a ``torchelastic_*`` folder of logs in ``TMPDIR`` per
    run and never removes it: torch/distributed/elastic/multiprocessing/api.py)."""
    return os.path.join(tempfile.gettempdir(), f"ddp_lab_launch_{marker}")


def _env(extra: dict[str, str] | None, marker: str) -> dict[str, str]:
    env = dict(os.environ)
    # Workers must find ddp_lab even when the package is not installed.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # also silences torchrun's OMP warning
    env[MARKER] = marker
    # A TMPDIR of the launch's own, removed by finish(): torchrun leaves a folder of logs there.
    env["TMPDIR"] = tmpdir_of(marker)
    env.update(extra or {})
    return env


def marked_pids(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def kill_marked(marker: str) -> list[int]:
    """Kill every process of a launch that is still alive; return their pids."""
    pids = marked_pids(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def start(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start a launcher command with a fresh marker; return the process and the marker."""
    marker = uuid.uuid4().hex
    os.mkdir(tmpdir_of(marker), 0o700)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(env, marker),
        start_new_session=True,
    )
    return proc, marker


def finish(
    proc: subprocess.Popen, marker: str, command: list[str], started: float, timeout: float
) -> LaunchResult:
    """Wait for a started command (up to ``timeout``), then clean up whatever is left."""
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(0.1, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGTERM)  # the agent forwards it to its workers
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    leftovers = kill_marked(marker)
    shutil.rmtree(tmpdir_of(marker), ignore_errors=True)
    return LaunchResult(
        command,
        proc.returncode,
        out,
        err,
        time.monotonic() - started,
        timed_out,
        leftovers,
        marker,
    )


def run(
    command: list[str], timeout: float = 60.0, env: dict[str, str] | None = None
) -> LaunchResult:
    """Run a launcher command to the end (or the timeout); nothing is left running after."""
    started = time.monotonic()
    proc, marker = start(command, env)
    return finish(proc, marker, command, started, timeout)


def torchrun_command(
    worker: str,
    nproc_per_node: int = 2,
    *,
    nnodes: int = 1,
    node_rank: int | None = None,
    master_port: int | None = None,
    rdzv_backend: str | None = None,
    standalone: bool = False,
    max_restarts: int = 0,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The torchrun command line that runs ``worker`` (``python -m torch.distributed.run``)."""
    check_worker(worker)
    _check_count("nproc_per_node", nproc_per_node)
    _check_count("nnodes", nnodes)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if standalone:
        cmd.append("--standalone")  # a private c10d rendezvous on a free port
    else:
        port = master_port or free_port()
        cmd += [f"--nnodes={nnodes}", "--master_addr=127.0.0.1", f"--master_port={port}"]
        if node_rank is not None:
            cmd.append(f"--node_rank={node_rank}")
        if rdzv_backend:
            cmd += [
                f"--rdzv_backend={rdzv_backend}",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=demo",
            ]
    cmd += [f"--max_restarts={max_restarts}", *extra, "-m", "ddp_lab.labs.launch_demo", worker]
    return cmd


def torchrun(
    worker: str,
    nproc_per_node: int = 2,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    **kwargs: object,
) -> LaunchResult:
    """Run ``worker`` under torchrun on this machine (one node unless told otherwise)."""
    kwargs.setdefault("standalone", True)
    return run(torchrun_command(worker, nproc_per_node, **kwargs), timeout, env)  # type: ignore[arg-type]


def legacy_launch(worker: str, nproc_per_node: int = 2, timeout: float = 60.0) -> LaunchResult:
    """Run ``worker`` under the deprecated ``python -m torch.distributed.launch``."""
    check_worker(worker)
    _check_count("nproc_per_node", nproc_per_node)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.launch",
        f"--nproc_per_node={nproc_per_node}",
        f"--master_port={free_port()}",
        "-m",
        "ddp_lab.labs.launch_demo",
        worker,
    ]
    return run(cmd, timeout)


def mp_spawn(worker: str, nprocs: int = 2, timeout: float = 60.0) -> LaunchResult:
    """Run ``worker`` under ``torch.multiprocessing.spawn`` in a fresh Python process."""
    check_worker(worker)
    _check_count("nprocs", nprocs)
    cmd = [sys.executable, "-m", "ddp_lab.labs.launch_demo", "--mp-spawn", str(nprocs), worker]
    return run(cmd, timeout)


def two_nodes(
    worker: str,
    nproc_per_node: int = 2,
    rdzv_backend: str | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> list[LaunchResult]:
    """Start two torchrun agents at once, as two "nodes" of one job on this machine.

    With the default (static) rendezvous each agent is told its ``--node_rank``; with
    ``rdzv_backend="c10d"`` the agents get their node ranks from the rendezvous.
    """
    port = free_port()
    started = time.monotonic()
    procs = []
    for node in range(2):
        cmd = torchrun_command(
            worker,
            nproc_per_node,
            nnodes=2,
            master_port=port,
            node_rank=None if rdzv_backend else node,
            rdzv_backend=rdzv_backend,
        )
        procs.append((start(cmd, env), cmd))
    return [finish(p, marker, cmd, started, timeout) for (p, marker), cmd in procs]


def signal_agent(
    worker: str = "sleep", sig: int = signal.SIGTERM, nproc_per_node: int = 2, timeout: float = 60.0
) -> LaunchResult:
    """Start torchrun, wait until every worker runs, then send ``sig`` to the agent only.

    This is what a scheduler, a closed ssh session (SIGHUP) or Ctrl-C (SIGINT) does.
    """
    cmd = torchrun_command(worker, nproc_per_node, standalone=True)
    started = time.monotonic()
    proc, marker = start(cmd)
    seen: list[str] = []
    assert proc.stdout is not None
    while sum(s.startswith("@rank ") for s in seen) < nproc_per_node:
        line = proc.stdout.readline()  # the workers flush each line: this cannot stall long
        if not line or time.monotonic() - started > timeout:
            break
        seen.append(line)
    proc.send_signal(sig)  # the agent only, as `kill PID` would
    result = finish(proc, marker, cmd, started, timeout)
    result.stdout = "".join(seen) + result.stdout
    return result


if __name__ == "__main__":
    main()
