"""The grader's side: verdicts computed in a process the learner's code never ran in.

``score`` (``ddp-lab grade`` and ``ddp-lab check``) calls ``run`` in a fresh process of its
own (``python -m ddp_lab.course.verdict``, request and answer as JSON on stdin/stdout). That
process
1. writes the submission's code cells into a job for ``course.runner``, the released code in
   place of each graded cell, and starts the runner in the sandbox (``course.sandbox``);
2. waits for the runner to have run the cells (it keeps each graded cell's objects);
3. runs each exercise's checker here: hidden cases and oracle results are computed here, the
   learner's code is reached only through ``RemoteLearner`` (probes run in the sandbox,
   results come back as data), and the comparison and the verdict happen here;
4. kills the sandbox (everything in it) and answers with one result per exercise.

Nothing the learner's code does to its own process (patching ``dl.grade``, the checkers,
torch, IPython, printing a passing line) reaches this process.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat

from ddp_lab.course import sandbox
from ddp_lab.course.learner import RemoteLearner, RunnerGone


def build_job(
    release: nbformat.NotebookNode,
    sub: nbformat.NotebookNode,
    found: dict[str, int],
    lang: str,
    cell_timeout: float,
) -> dict[str, Any]:
    """The runner's job: every code cell of ``sub``; graded cells carry the released code."""
    from ddp_lab.course.grader import exercises_of

    by_pos = {found[ex.grade_id]: ex for ex in exercises_of(release) if ex.grade_id in found}
    cells = []
    for i, cell in enumerate(sub.cells):
        if cell.cell_type != "code":
            continue
        if i in by_pos:
            cells.append({"source": by_pos[i].cell.source, "grade_id": by_pos[i].grade_id})
        else:
            cells.append({"source": cell.source})
    return {"cells": cells, "lang": lang, "cell_timeout": cell_timeout}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Grade the exercises named in ``request``; see the module docstring."""
    from ddp_lab.course.grading import load_checkers, run_checker

    release = nbformat.reads(request["release"], as_version=4)
    sub = nbformat.reads(request["submission"], as_version=4)
    found: dict[str, int] = request["found"]
    lang, cell_timeout = request["lang"], float(request["cell_timeout"])
    deadline = time.monotonic() + float(request["timeout"])
    job = build_job(release, sub, found, lang, cell_timeout)
    registry = load_checkers()
    results: dict[str, dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="ddp-lab-sandbox-"))
    proc = None
    try:
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        (work / lang).mkdir()  # dl.setup() finds the language from the folder, as in a notebook
        argv = [sys.executable, "-m", "ddp_lab.course.runner", str(work / "job.json")]
        cmd, env = sandbox.wrap(
            argv,
            work,
            job=int(request.get("job", 0)),
            env={"DDP_LAB_LANG": lang, "MPLBACKEND": "agg", **request.get("env", {})},
        )
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=work / lang,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        ready = _wait_ready(proc, deadline)
        if ready is None:
            status = "timeout" if time.monotonic() >= deadline else "kernel-died"
            return {"results": {g: {"status": status} for g in found}, "cells": []}
        for grade_id in found:
            chk = registry.get(grade_id)
            if chk is None:
                results[grade_id] = {"status": "error", "detail": f"no checker for {grade_id}"}
                continue
            learner = RemoteLearner(
                grade_id, proc.stdin, proc.stdout, functools.partial(_kill, proc)
            )
            left = deadline - time.monotonic()
            if left <= 0:
                results[grade_id] = {"status": "timeout"}
                continue
            try:
                passed, line = run_checker(chk, learner, lang)
            except RunnerGone as exc:
                timed_out = "timeout" in str(exc) or time.monotonic() >= deadline
                results[grade_id] = {"status": "timeout" if timed_out else "kernel-died"}
                _kill(proc)
                proc = None
                break
            results[grade_id] = {"status": "passed" if passed else "failed", "detail": line}
        for grade_id in found:
            results.setdefault(grade_id, {"status": "kernel-died"})
        return {"results": results, "cells": ready.get("cells", [])}
    finally:
        if proc is not None:
            _kill(proc)
        shutil.rmtree(work, ignore_errors=True)


def _wait_ready(proc: subprocess.Popen, deadline: float) -> dict | None:
    """The runner's ``ready`` message, or None if it died or the deadline passed."""
    import select

    assert proc.stdout is not None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
        if readable:
            line = proc.stdout.readline()
            if not line:
                return None
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours: the protocol has only JSON lines
            if isinstance(msg, dict) and msg.get("ready") is True:
                return msg
        elif proc.poll() is not None:
            return None


def _kill(proc: subprocess.Popen) -> None:
    """Kill the sandbox: bwrap's death takes its PID namespace (everything in it) along."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def main() -> int:
    request = json.load(sys.stdin)
    # The answer is the only thing on stdout: whatever the checkers print goes to stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    answer = run(request)
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
