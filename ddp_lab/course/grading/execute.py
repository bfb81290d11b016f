"""Stages 3 and 4 of grading, isolate and run: one submission's verdict process.

The verdict process (``course.grading.verdict``) never runs learner code: it starts the
submission's code in the sandbox (``sandbox``, ``runner``; ``rankhost`` for per-rank
exercises), runs each exercise's checker itself (``checks/``) and reads the learner's own
cells (``scan``). Here it is started in a cgroup of the submission's own (``isolation``) with a
user id no other running submission has (the caller's ``isolation.Slots`` slot), fed its
request, and afterwards everything the run started is killed (its cgroup, its process group,
then every process carrying the run's token), whatever happened. A timeout or a crash gives
the exercises left their status; a timeout while the machine was too busy to give the
submission CPU (the starvation canary, ``isolation.Canary``, over the stalled cell's stretch)
is ``busy`` (grade it again), not the learner's fault. ``run`` is the stage: for ``ddp-lab
check``'s needed cells it runs the whole notebook a second time when a verdict says
``NameError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nbformat

from ddp_lab.course.grading import isolation
from ddp_lab.i18n import _t

TOKEN_VAR = "DDP_LAB_GRADE_TOKEN"
PACKAGE_PARENT = (
    Path(__file__).resolve().parents[3]
)  # holds ddp_lab/ (this is ddp_lab/course/grading/)


def _token_pids(token: str) -> list[int]:
    """Processes whose environment holds this run's token: everything the run started."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if f"{TOKEN_VAR}={token}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
    if not pids and not Path("/proc/self").exists():  # macOS: no /proc
        with contextlib.suppress(ImportError):
            import psutil

            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    if p.environ().get(TOKEN_VAR) == token:
                        pids.append(p.pid)
    return [p for p in pids if p != os.getpid()]


_RUNNING: dict[int, str] = {}  # process group -> token of each grading run in progress


def kill_all_runs() -> None:
    """Stop every grading run of this process (on Ctrl-C: their sessions do not get it)."""
    for pgid, token in list(_RUNNING.items()):
        kill_run(pgid, token)


def kill_run(pgid: int, token: str) -> None:
    """SIGKILL the run's process group, then every process with its token, until none is left."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):  # a zygote may fork while we kill; look again
        pids = _token_pids(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def run_verdict(
    release: nbformat.NotebookNode,
    sub: nbformat.NotebookNode,
    found: dict[str, int],
    lang: str,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
    limits: isolation.CgroupLimits | None = None,
    needed_only: bool = False,
    progress: bool = False,
) -> dict[str, dict]:
    """grade_id -> {status, detail} from ``course.grading.verdict``, run in a process of its own.

    ``needed_only``: run only the cells the graded cells need (``ddp-lab check``);
    ``progress``: the verdict's progress lines (trusted text, its own) go to our stdout.

    That process never runs learner code: it starts the submission's code in the sandbox
    and computes each verdict itself. ``job`` must be a number no other running grading
    holds (``isolation.Slots``): the sandbox's user id is derived from it. Where cgroups
    work, the process and all it starts live in a cgroup of their own (``limits``). Its
    cgroup, process group and everything carrying this run's token are killed afterwards,
    whatever happened.
    """
    from ddp_lab.course.grading import sandbox

    sandbox.warn_unsandboxed(lang)
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in ("JPY_SESSION_NAME", "PYTEST_ADDOPTS")}
    env.update(
        {
            TOKEN_VAR: token,
            "DDP_LAB_LANG": lang,
            "PYTHONPATH": os.pathsep.join(
                [str(PACKAGE_PARENT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
    )
    request = {
        "release": nbformat.writes(release),
        "submission": nbformat.writes(sub),
        "found": found,
        "lang": lang,
        "cell_timeout": cell_timeout,
        "timeout": timeout,
        "job": job,
        "env": {TOKEN_VAR: token},
        "needed_only": needed_only,
    }
    progress_r = progress_w = -1
    if progress:
        progress_r, progress_w = os.pipe()
        request["progress_fd"] = progress_w
    cmd = [sys.executable, "-m", "ddp_lab.course.grading.verdict"]
    group = None
    if isolation.unavailable_reason() is None:
        group = isolation.Cgroup(f"ddp-lab-{token}", limits or isolation.CgroupLimits())
    with (
        tempfile.TemporaryFile() as log,
        tempfile.TemporaryDirectory(prefix="ddp-lab-verdict-") as tmp,
        group or contextlib.nullcontext(),
    ):
        # The verdict's temporary files (its sandbox folder among them) go in a folder of this
        # process's, removed after it: also when the verdict is killed before its own cleanup.
        # 0o711: the sandbox's user passes through to its own folder, and sees nothing else.
        os.chmod(tmp, 0o711)
        env["TMPDIR"] = tmp
        if group is not None:
            cmd = group.enter_argv(cmd)
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            pass_fds=(progress_w,) if progress else (),
        )
        _RUNNING[proc.pid] = token
        shown = None
        if progress:
            os.close(progress_w)
            shown = _show_progress(progress_r)
        watch = isolation.Canary(usage=group.cpu_seconds) if group is not None else None
        try:
            out, _ = proc.communicate(json.dumps(request).encode(), timeout=timeout + 60)
            answer = json.loads(out or b"{}")
            if not isinstance(answer, dict) or not isinstance(answer.get("results"), dict):
                raise ValueError("no results")
        except subprocess.TimeoutExpired:
            answer = {"results": {g: {"status": "timeout"} for g in found}}
        except ValueError:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            tail = log.read().decode(errors="replace").strip().splitlines()[-1:]
            error = " ".join(tail)[-300:]
            answer = {"results": {g: {"status": "error", "detail": error} for g in found}}
        finally:  # no sandbox, zygote or rank may outlive the run
            if watch is not None:
                watch.stop()
            if group is not None:
                group.kill()
            kill_run(proc.pid, token)
            proc.wait()
            _RUNNING.pop(proc.pid, None)
            if shown is not None:
                shown.join(timeout=5)
        results = {g: v for g, v in answer["results"].items() if isinstance(v, dict)}
        if watch is not None and any(
            v.get("status") in ("timeout", "timeout-cell") for v in results.values()
        ):
            # Judged on the stretch the timeout is about: from the start of the cell that
            # stalled to when its time ran out (the verdict's clock, this machine's), else
            # the whole run. A cell that slept on a busy machine is the learner's timeout,
            # however long the start-up before it took there, and whatever the teardown after
            # it cost (killing the sandbox, the verdict's own exit: the group's CPU too, and
            # no sign the stalled cell wanted any).
            since, until, now = (
                answer.get("stalled_since"),
                answer.get("stalled_until"),
                time.monotonic(),
            )
            if type(since) is not float or not started <= since <= now:
                since = started
            if type(until) is not float or not since <= until <= now:
                until = now
            busy, used, wall = watch.since(since, until)
            if isolation.starved(busy, used, wall):
                why = _t(
                    "the grading machine was too busy to give this notebook CPU time (it "
                    "used {used:.0f} s of CPU in {wall:.0f} s): not the notebook's fault; "
                    "grade it again.",
                    lang,
                    used=used,
                    wall=wall,
                )
                for v in results.values():
                    if v.get("status") in ("timeout", "timeout-cell"):
                        v.update(status="busy", detail=why)
    return results


def _show_progress(fd: int) -> Any:
    """A thread copying the verdict's progress lines from ``fd`` to stdout until it closes.
    A line ending in a carriage return (``cell 3/9``) is overwritten by the next one on a
    terminal; in a log, every line shows."""
    import threading

    def copy() -> None:
        tty = sys.stdout.isatty()
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="") as src:
            for line in iter(lambda: src.readline(4096), ""):
                if line.endswith("\r") and not tty:
                    line = line[:-1] + "\n"
                sys.stdout.write(line)
                sys.stdout.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _name_error(verdicts: dict[str, dict], found: dict[str, int]) -> bool:
    """Whether a graded cell's verdict says NameError (a run of the needed cells only)."""
    shown = ("passed", "timeout", "timeout-cell", "kernel-died")  # no detail of theirs shows
    return any(
        isinstance(v, dict)
        and str(v.get("status", "error")) not in shown
        and "NameError" in str(v.get("detail", ""))
        for g, v in verdicts.items()
        if g in found
    )


def run(
    release: nbformat.NotebookNode,
    sub: nbformat.NotebookNode,
    found: dict[str, int],
    lang: str,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
    limits: isolation.CgroupLimits | None = None,
    needed_only: bool = False,
    progress: bool = False,
) -> dict[str, dict]:
    """Stages 3 and 4 for one submission: grade_id -> verdict of each graded cell ``found``
    (``run_verdict``; nothing to run when none was found).

    With ``needed_only`` a verdict that says NameError (a name the slice of
    ``course.grading.needed`` missed, or the learner's own mistake) runs the whole notebook
    once more, as ``ddp-lab grade`` runs it, and that run's verdicts are the stage's."""
    if not found:
        return {}
    verdicts = run_verdict(
        release, sub, found, lang, cell_timeout, timeout, job, limits, needed_only, progress
    )
    if needed_only and _name_error(verdicts, found):
        verdicts = run_verdict(
            release, sub, found, lang, cell_timeout, timeout, job, limits, False, progress
        )
    return verdicts
