"""The grader's side: verdicts computed in a process the learner's code never ran in.

Stage 4 of grading (``execute.run_verdict``, for ``ddp-lab grade`` and ``ddp-lab check``) calls
``run`` in a fresh process of its own (``python -m ddp_lab.course.grading.verdict``, request
and answer as JSON on stdin/stdout). That process
1. writes the submission's code cells into a job for ``course.grading.runner``, the released code in
   place of each graded cell, and starts the runner in the sandbox (``course.grading.sandbox``);
2. follows the runner through the notebook: at each graded cell it runs that exercise's
   checker here (hidden cases and oracle results computed here; the learner's code reached
   only through ``RemoteLearner``: probes run in the sandbox, results come back as data;
   comparison and verdict here), then lets the runner go on;
3. kills the sandbox (everything in it) and answers with one result per exercise (and, for
   a cell past its time limit, when that cell began and when its time ran out:
   ``stalled_since`` and ``stalled_until``, the stretch ``execute.run_verdict`` judges
   starvation on).

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

from ddp_lab.course.grading import sandbox, scan, view, wire
from ddp_lab.course.grading.learner import RemoteLearner, RunnerGone
from ddp_lab.course.grading.rankhost import RankPool
from ddp_lab.course.grading.ranknet import kill_group
from ddp_lab.i18n import N_, _t

PROTOCOL_LIMIT = wire.MAX_BYTES + 4096  # one line from the runner; past it, the runner is killed
BLOB_LIMIT = wire.BLOB_LIMIT  # the pickled objects of one graded cell


def build_job(
    release: nbformat.NotebookNode,
    sub: nbformat.NotebookNode,
    found: dict[str, int],
    lang: str,
    cell_timeout: float,
    needed_only: bool = False,
) -> dict[str, Any]:
    """The runner's job: every code cell of ``sub``; graded cells carry the released code.

    ``needed_only`` (``ddp-lab check``): only the cells the graded cells need
    (``course.grading.needed``), or every cell where that cannot be known."""
    from ddp_lab.course.grading.release import exercises_of

    by_pos = {found[ex.grade_id]: ex for ex in exercises_of(release) if ex.grade_id in found}
    cells = []
    for i, cell in enumerate(sub.cells):
        if cell.cell_type != "code":
            continue
        # "at": the cell's place in the notebook (the feedback of a cell past its time names it)
        if i in by_pos:
            cells.append({"source": by_pos[i].cell.source, "grade_id": by_pos[i].grade_id, "at": i})
        elif "grade_id" in cell.metadata:
            continue  # a graded cell not graded in this run (tampered, or not asked for)
        else:
            cells.append({"source": cell.source, "at": i})
    total = len(cells)
    if needed_only:
        from ddp_lab.course.grading.needed import needed_cells

        graded = [i for i, c in enumerate(cells) if c.get("grade_id")]
        keep = needed_cells([c["source"] for c in cells], graded)
        if keep is not None:
            cells = [cells[i] for i in keep]
    return {"cells": cells, "lang": lang, "cell_timeout": cell_timeout, "of": total}


# What `ddp-lab check` says while an exercise is checked: whose cases (True: the default seed's)
_CHECKING = {
    True: N_("Checking {grade_id} with the default seed's hidden cases ..."),
    False: N_("Checking {grade_id} with the hidden cases of DDP_LAB_GRADE_SEED ..."),
}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Grade the exercises named in ``request``; see the module docstring."""
    from ddp_lab.course.grading.checkers import default_seed, load_checkers

    default = default_seed()

    release = nbformat.reads(request["release"], as_version=4)
    sub = nbformat.reads(request["submission"], as_version=4)
    found: dict[str, int] = request["found"]
    lang, cell_timeout = request["lang"], float(request["cell_timeout"])
    deadline = time.monotonic() + float(request["timeout"])
    job = build_job(
        release, sub, found, lang, cell_timeout, bool(request.get("needed_only", False))
    )
    progress = _progress_writer(request.get("progress_fd"))
    n_cells = len(job["cells"])
    if n_cells < job["of"]:
        progress(
            _t(
                "Running {n} of the notebook's {total} code cells (those the graded cells "
                "need) in a sandbox ...",
                lang,
                n=n_cells,
                total=job["of"],
            )
        )
    else:
        progress(_t("Running the notebook's {n} code cells in a sandbox ...", lang, n=n_cells))
    results: dict[str, dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="ddp-lab-sandbox-"))
    masks = Path(tempfile.mkdtemp(prefix="ddp-lab-view-"))  # outside the runner's folder
    proc = None
    ended = "kernel-died"  # what the exercises not reached get
    # When the runner began its current cell (monotonic, this machine's clock): for a cell
    # past its time limit, the stretch execute.run_verdict judges starvation on.
    cell_started = time.monotonic()
    stalled_since: float | None = None
    current = -1  # the job's cell the runner said it started (its word: shown, never trusted)
    try:
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        (work / lang).mkdir()  # dl.setup() finds the language from the folder, as in a notebook
        argv = [sys.executable, "-m", "ddp_lab.course.grading.runner", str(work / "job.json")]
        cmd, env = sandbox.wrap(
            argv,
            work,
            job=int(request.get("job", 0)),
            env={"DDP_LAB_LANG": lang, "MPLBACKEND": "agg", **request.get("env", {})},
        )
        if sandbox.available():  # the package without the answers (course.grading.view)
            cmd = view.insert(cmd, view.args(masks, lang))
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=work / lang,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdout is not None
        reader = wire.LineReader(proc.stdout.fileno(), PROTOCOL_LIMIT)
        registry = load_checkers(found)  # while the runner starts
        flags = scan.flags_by_exercise(release, sub, found)
        # A cell that ignores the runner's own alarm is caught here: no message for longer
        # than all the cells could take.
        patience = cell_timeout * (len(job["cells"]) + 1) + 60
        while True:
            msg = _next_message(reader, proc, min(deadline, time.monotonic() + patience))
            if msg is None:  # no message in time: the runner is stuck
                ended = "timeout" if time.monotonic() >= deadline else "timeout-cell"
                stalled_since = cell_started if ended == "timeout-cell" else None
                break
            if msg.get("flood"):  # a line past the limit: the runner is killed, not read
                kill_group(proc)
                ended = "kernel-died"
                break
            if msg.get("eof"):  # its output ended: the learner's process died (or exited)
                ended = "kernel-died"
                break
            if "timeout" in msg:
                ended, stalled_since = "timeout-cell", cell_started
                break
            if msg.get("done"):
                break
            if "cell" in msg:  # the runner starts a cell: progress, and when it started
                cell_started = time.monotonic()
                if type(msg["cell"]) is int and 0 <= msg["cell"] < n_cells:
                    current = msg["cell"]
                    progress(_t("cell {i}/{n}", lang, i=msg["cell"] + 1, n=n_cells), end="\r")
                continue
            grade_id = str(msg.get("graded", ""))
            if grade_id in found and grade_id not in results:
                progress(_t(_CHECKING[default], lang, grade_id=grade_id))
                handle = RemoteLearner(
                    grade_id,
                    proc.stdin,
                    reader,
                    functools.partial(kill_group, proc),
                    _blob(msg),
                    lang,
                    int(request.get("job", 0)),
                    RankPool,
                )
                try:
                    results[grade_id] = _judge(
                        registry, grade_id, msg.get("error"), handle, lang, deadline
                    )
                finally:
                    handle.close()
                results[grade_id] = scan.apply(results[grade_id], flags.get(grade_id), lang)
                if results[grade_id]["status"] in ("timeout", "kernel-died"):
                    ended = results[grade_id]["status"]
                    break
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "continue"}).encode() + b"\n")
                proc.stdin.flush()
            except OSError:
                break
        # The loop ends where a stalled cell's time ran out (before this process's teardown).
        stalled_until = time.monotonic()
        stalled = _stalled_cell(job["cells"], current) if ended == "timeout-cell" else {}
        for grade_id in found:
            results.setdefault(grade_id, {"status": ended, **stalled})
        if stalled_since is None:
            return {"results": results}
        return {
            "results": results,
            "stalled_since": stalled_since,
            "stalled_until": stalled_until,
        }
    finally:
        if proc is not None:
            kill_group(proc)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(masks, ignore_errors=True)


def _stalled_cell(cells: list[dict[str, Any]], current: int) -> dict[str, Any]:
    """Which cell ran past its time, for the feedback: its place in the notebook (counted from
    1, markdown cells included, as JupyterLab's status bar counts) and its first line. Taken
    from the job this process built, at the index the runner last said it started: a runner
    that lies about it misleads only its own feedback."""
    if not 0 <= current < len(cells):
        return {}
    lines = [line.strip() for line in cells[current]["source"].splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return {"cell": int(cells[current].get("at", current)) + 1, "line": first[:60]}


def _progress_writer(fd: Any) -> Any:
    """A function that writes one progress line to ``fd`` (``ddp-lab check``'s terminal), or
    does nothing without one."""
    if type(fd) is not int:
        return lambda text, end="\n": None
    out = os.fdopen(fd, "w", encoding="utf-8", buffering=1)

    def write(text: str, end: str = "\n") -> None:
        try:
            out.write(text + end)
            out.flush()
        except OSError:
            pass

    return write


def _blob(msg: dict) -> bytes | str:
    """The pickled objects the runner handed out for a graded cell, as bytes (decoded from
    base64, never loaded here), or why there are none. The line was read with a bound
    (``PROTOCOL_LIMIT``); the decoded size is checked again."""
    import base64
    import binascii

    if msg.get("blob_error"):
        return str(msg["blob_error"])[:500]
    blob = msg.get("blob")
    if type(blob) is not str or not blob:
        return "no objects were handed out"
    try:
        data = base64.b64decode(blob.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        return f"the graded objects are not valid base64: {exc}"[:500]
    return data if len(data) <= BLOB_LIMIT else "the graded objects are too large"


def _judge(
    registry: dict,
    grade_id: str,
    error: str | None,
    learner: RemoteLearner,
    lang: str,
    deadline: float,
) -> dict[str, Any]:
    """One exercise's verdict, computed here; the learner's code is reached by probes only."""
    from ddp_lab.course.grading.checkers import (
        NOT_ATTEMPTED,
        case_line,
        judge,
        not_attempted_line,
        verdict_line,
    )
    from ddp_lab.course.grading.rankhost import SandboxFailed

    chk = registry.get(grade_id)
    if chk is None:
        return {"status": "error", "detail": f"no checker for {grade_id}"}
    if error and str(error).startswith("NotImplementedError:"):  # the graded cell hit a stub
        return {"status": NOT_ATTEMPTED, "detail": not_attempted_line(grade_id, chk.points, lang)}
    if error:
        why = _t("your code raised {error}", lang, error=error)
        detail = case_line(1, "?", "-", why, lang)
        head = N_("FAIL {grade_id}: 0/{points} points.")
        line = verdict_line(head, lang, grade_id, chk.points, detail)
        return {"status": "failed", "detail": line}
    if time.monotonic() >= deadline:
        return {"status": "timeout"}
    try:
        status, line = judge(chk, learner, lang)
    except SandboxFailed as exc:  # the machine's fault: an error, not the learner's failure
        return {"status": "error", "detail": str(exc)}
    except RunnerGone as exc:
        timed_out = "timeout" in str(exc) or time.monotonic() >= deadline
        return {"status": "timeout" if timed_out else "kernel-died"}
    return {"status": status, "detail": line}


def _next_message(reader: wire.LineReader, proc: subprocess.Popen, until: float) -> dict | None:
    """The runner's next protocol message; ``{"eof": True}`` if its output ended (it died;
    bwrap may not have exited yet, so ``poll()`` cannot tell); ``{"flood": True}`` for a line
    past ``PROTOCOL_LIMIT`` bytes; None if ``until`` passed. Reads are bounded: our own
    buffer, never ``readline()`` on a line that does not end."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return None
        try:
            line = reader.readline(min(left, 1.0))
        except EOFError:
            return {"eof": True}
        except wire.LineTooLong:
            return {"flood": True}
        if line is None:
            if proc.poll() is not None:
                return {"eof": True}
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            # Not the protocol's: ignore. A line nested deeper than the parser's recursion
            # limit ("[" * 100000) raises RecursionError, which crashed this process before:
            # every verdict of the submission, the final ones too, became "error".
            continue
        if isinstance(msg, dict) and not msg.get("eof") and not msg.get("flood"):
            return msg


def main() -> int:
    import signal

    from ddp_lab.runtime._process import set_parent_death_signal

    # If the grader dies (killed, not interrupted), this process dies too, and bwrap's
    # --die-with-parent takes the sandbox along: no grading outlives its grader.
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() == 1:  # the grader died before the line above
        return 1
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
