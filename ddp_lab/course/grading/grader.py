"""``ddp-lab check`` (learners) and scoring one submission (``ddp-lab grade``, see
``course.grade_class`` for the class): nothing that ran learner code is trusted; what such a
process says is data to verify, and it only ever receives its own inputs.

A graded cell is a code cell tagged ``grade`` with ``grade_id`` and ``points`` metadata.
Scoring a notebook:
1. read it without trusting it (``course.intake``: regular files only, size cap, parsed in
   a limited process, outputs removed);
2. compare it with the release: a graded cell whose code changed (its syntax tree: a
   comment or spacing is not a change), that is missing, or that moved relative to the
   other graded and exercise cells scores 0 ("tampered");
3. hand the submission to ``course.verdict`` in a process of its own, in a cgroup of the
   submission's own (``course.isolation``) with a user id no other running submission has:
   it runs the learner's code cells in the sandbox (``course.sandbox``, ``course.runner``)
   and computes every verdict itself;
4. kill everything the run started (its cgroup, its process group, then every process
   carrying the run's token), whatever happened; a timeout or a crash gives the exercises
   left their zeroes with the reason; a timeout while the machine was too busy to give the
   submission CPU is an ``error`` (grade it again), not the learner's fault.
The in-notebook line printed by ``dl.grade`` is never read.

How it differs from nbgrader and otter-grader: no database, server or student ids; the
kernel's own report is not trusted; each submission runs in a bubblewrap sandbox and a
cgroup instead of a container.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from ddp_lab.course.grading import intake, isolation, report
from ddp_lab.i18n import N_, _t, lookup

TOKEN_VAR = "DDP_LAB_GRADE_TOKEN"
OUTPUT_PROP = "ddp_lab_output"
ERROR_PROP = "ddp_lab_error"
KERNEL_DIED = "ddp-lab: the kernel died"
PACKAGE_PARENT = (
    Path(__file__).resolve().parents[3]
)  # holds ddp_lab/ (this is ddp_lab/course/grading/)

MESSAGES = {
    "passed": N_("passed"),
    "failed": N_("failed"),
    "not-attempted": N_("not attempted"),
    "tampered-changed": N_("graded cell changed"),
    "tampered-deleted": N_("graded cell deleted"),
    "tampered-moved": N_("graded cell moved"),
    "timeout": N_("timed out"),
    "kernel-died": N_("kernel died"),
    "invalid": N_("invalid notebook"),
    "error": N_("not run"),
    "duplicate": N_("several notebooks"),
    "flagged": N_("flagged for review"),
    "why_busy": N_(
        "the grading machine was too busy to give this notebook CPU time (it "
        "used {used:.0f} s of CPU in {wall:.0f} s): not the notebook's fault; "
        "grade it again."
    ),
    "why_flagged": N_("flagged for the instructor's review: {error}"),
    "why_changed": N_(
        "the code of the graded cell was changed; copy it back from the released notebook."
    ),
    "why_dup": N_("the graded cell appears {n} times."),
    "why_deleted": N_("the graded cell is missing."),
    "why_moved": N_(
        "the graded cell was moved relative to the exercise cells; put it back in place."
    ),
    "why_total": N_("the notebook did not finish within {timeout:g} s and was stopped."),
    "why_cell": N_("a cell ran longer than {timeout:g} s and was interrupted (an endless loop?)."),
    "why_died": N_(
        "the Python kernel died (os._exit, a crash or out of memory) before this cell ran."
    ),
    "why_invalid": N_("not a valid notebook: {error}"),
    "why_error": N_("the notebook could not be run: {error}"),
    "total": N_("total {points}/{max_points} points"),
    "feedback": N_("Feedback for {student}: {title}"),
    "no_file": N_("No such file: {path}"),
    "no_graded": N_("{path} has no graded cells: is it an exercise notebook?"),
    "no_subs": N_("No .ipynb submissions found in {paths}"),
    "bad_number": N_("--{name} must be a positive number, got {value!r}."),
    "wrote": N_("wrote {path}"),
    "progress": N_("{done}/{total} graded, {zeros} with no points, about {left} s left"),
    "no_such_exercise": N_("{path} has no exercise {grade_id}; it has: {ids}"),
}


@dataclass
class Exercise:
    """A graded cell of the release: what it is worth and what it must print."""

    grade_id: str
    points: int
    cell: nbformat.NotebookNode


@dataclass
class Result:
    """One exercise of one notebook: points and a status (a key of ``M``) with details."""

    grade_id: str
    points: int
    max_points: int
    status: str
    detail: str = ""


def _norm(source: str) -> str:
    # Editors add or drop trailing spaces and newlines; that is not tampering.
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def same_code(a: str, b: str) -> bool:
    """Whether two cells run the same code: equal syntax trees (a comment, spacing or a
    line break inside parentheses is no change), or equal text where either is not Python
    (a cell magic)."""
    if _norm(a) == _norm(b):
        return True
    if max(len(a), len(b)) > 4 * min(len(a), len(b)) + 1000:  # comments cannot explain that
        return False
    try:
        return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def _is_graded(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and "grade_id" in cell.metadata


def exercises_of(release: nbformat.NotebookNode) -> list[Exercise]:
    """The graded cells of a released exercise notebook, in order."""
    return [
        Exercise(str(c.metadata["grade_id"]), int(c.metadata.get("points", 0)), c)
        for c in release.cells
        if _is_graded(c)
    ]


def language_of(nb: nbformat.NotebookNode, default: str = "en") -> str:
    lang = str(nb.metadata.get("ddp_lab", {}).get("lang", default))[:2]
    return lang if lang in ("en", "zh") else default


def locate(
    release: nbformat.NotebookNode, sub: nbformat.NotebookNode
) -> tuple[dict[str, int], dict[str, str]]:
    """Find each graded cell of ``release`` in ``sub``.

    Returns (grade_id -> index of its cell in ``sub``, grade_id -> tampering reason key).
    A graded cell is found by its ``grade_id`` metadata or, when a tool dropped the
    metadata, by identical code. Exercise cells are found by cell id (JupyterLab keeps ids
    when cells are edited or moved); the order of all found cells must match the release.
    """
    found: dict[str, int] = {}
    tampered: dict[str, str] = {}
    claimed = {str(c.metadata["grade_id"]) for c in sub.cells if _is_graded(c)}
    for ex in exercises_of(release):
        hits = [
            i
            for i, c in enumerate(sub.cells)
            if c.cell_type == "code" and str(c.metadata.get("grade_id", "")) == ex.grade_id
        ]
        if not hits and ex.grade_id not in claimed:
            hits = [
                i
                for i, c in enumerate(sub.cells)
                if c.cell_type == "code"
                and "grade_id" not in c.metadata
                and same_code(c.source, ex.cell.source)
            ]
        if not hits:
            tampered[ex.grade_id] = "deleted"
        elif len(hits) > 1:
            tampered[ex.grade_id] = f"dup:{len(hits)}"
        elif not same_code(sub.cells[hits[0]].source, ex.cell.source):
            tampered[ex.grade_id] = "changed"
        else:
            found[ex.grade_id] = hits[0]
    # Key cells in release order: graded cells and exercise code cells (by id).
    ids = {c.get("id"): i for i, c in enumerate(sub.cells) if c.cell_type == "code" and c.get("id")}
    keys: list[tuple[str | None, int]] = []  # (grade_id or None, position in sub)
    for c in release.cells:
        if _is_graded(c) and str(c.metadata["grade_id"]) in found:
            keys.append((str(c.metadata["grade_id"]), found[str(c.metadata["grade_id"])]))
        elif (
            c.cell_type == "code"
            and "exercise" in c.metadata.get("tags", [])
            and c.get("id") in ids
        ):
            keys.append((None, ids[c.get("id")]))
    for r, (gid, pos) in enumerate(keys):
        if gid is not None and any(
            (r2 < r) != (pos2 < pos) for r2, (_, pos2) in enumerate(keys) if r2 != r
        ):
            tampered[gid] = "moved"
            del found[gid]
    return found, tampered


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
    """grade_id -> {status, detail} from ``course.verdict``, run in a process of its own.

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
        watch = isolation.Canary() if group is not None else None
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
            busy = watch.stop() if watch is not None else 0.0
            if group is not None:
                group.kill()
            kill_run(proc.pid, token)
            proc.wait()
            _RUNNING.pop(proc.pid, None)
            if shown is not None:
                shown.join(timeout=5)
        results = {g: v for g, v in answer["results"].items() if isinstance(v, dict)}
        if group is not None and any(
            v.get("status") in ("timeout", "timeout-cell") for v in results.values()
        ):
            wall, used = time.monotonic() - started, group.cpu_seconds()
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


def _stream_text(outputs: list) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def load_submission(
    source: Path | intake.Submission | nbformat.NotebookNode,
) -> nbformat.NotebookNode:
    """A submission's notebook, read by ``course.intake`` (``intake.BadFile``: not read;
    another exception: not a notebook); a notebook already read that way is returned."""
    if isinstance(source, nbformat.NotebookNode):
        return source
    if isinstance(source, intake.Submission):
        if source.problem:
            raise intake.BadFile(source.problem)
        return intake.load(source.root, source.rel)
    return intake.load(source.parent, (source.name,))


def score(
    release: nbformat.NotebookNode,
    source: Path | intake.Submission | nbformat.NotebookNode,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
    limits: isolation.CgroupLimits | None = None,
    needed_only: bool = False,
    progress: bool = False,
) -> tuple[str, list[Result]]:
    """Score one submission against ``release``: (its language, one Result per exercise).

    ``source``: a notebook (read as a file given by the instructor) or a found
    ``intake.Submission``. A file that is not read gives every exercise ``error`` (or
    ``duplicate``), one that is not a notebook ``invalid``, with the reason.
    """
    lang = language_of(release)
    exercises = exercises_of(release)
    try:
        sub = load_submission(source)
    except intake.BadFile as exc:
        status = source.status if isinstance(source, intake.Submission) else "error"
        return lang, [Result(e.grade_id, 0, e.points, status, str(exc)) for e in exercises]
    except Exception as exc:  # noqa: BLE001  # any unreadable file scores 0, the rest go on
        why = _t(
            "not a valid notebook: {error}", lang, error=f"{type(exc).__name__}: {str(exc)[:200]}"
        )
        return lang, [Result(e.grade_id, 0, e.points, "invalid", why) for e in exercises]
    lang = language_of(sub, lang)
    found, tampered = locate(release, sub)
    verdicts = (
        run_verdict(
            release, sub, found, lang, cell_timeout, timeout, job, limits, needed_only, progress
        )
        if found
        else {}
    )
    results = {}
    by_id = {ex.grade_id: ex for ex in exercises}
    for grade_id in found:
        ex = by_id[grade_id]
        v = verdicts.get(grade_id, {"status": "error"})
        status, detail = str(v.get("status", "error")), str(v.get("detail", ""))
        if status == "passed":
            results[grade_id] = Result(grade_id, ex.points, ex.points, "passed", detail)
        elif status == "timeout":  # the whole submission ran out of time
            why = _t(
                "the notebook did not finish within {timeout:g} s and was stopped.",
                lang,
                timeout=timeout,
            )
            results[grade_id] = Result(grade_id, 0, ex.points, "timeout", why)
        elif status == "timeout-cell":
            why = _t(
                "a cell ran longer than {timeout:g} s and was interrupted (an endless loop?).",
                lang,
                timeout=cell_timeout,
            )
            results[grade_id] = Result(grade_id, 0, ex.points, "timeout", why)
        elif status == "kernel-died":
            results[grade_id] = Result(
                grade_id,
                0,
                ex.points,
                status,
                _t(
                    "the Python kernel died (os._exit, a crash or out of memory) before this "
                    "cell ran.",
                    lang,
                ),
            )
        elif status in ("failed", "not-attempted"):  # a wrong answer; the stub untouched
            results[grade_id] = Result(grade_id, 0, ex.points, status, detail)
        elif status == "busy":  # the machine's fault, not the notebook's: grade it again
            results[grade_id] = Result(grade_id, 0, ex.points, "error", detail)
        elif status == "flagged":  # held for the instructor: no points until reviewed
            why = _t("flagged for the instructor's review: {error}", lang, error=detail or "-")
            results[grade_id] = Result(grade_id, 0, ex.points, "flagged", why)
        else:
            why = _t("the notebook could not be run: {error}", lang, error=detail or "-")
            results[grade_id] = Result(grade_id, 0, ex.points, "error", why)
    for ex in exercises:
        kind = tampered.get(ex.grade_id)
        if kind:  # a copied graded cell counts as changed: it runs more than once
            key = "why_dup" if kind.startswith("dup:") else f"why_{kind}"
            status = "tampered-changed" if kind.startswith("dup:") else f"tampered-{kind}"
            results[ex.grade_id] = Result(
                ex.grade_id, 0, ex.points, status, lookup(MESSAGES, key, lang, n=kind[4:])
            )
    return lang, [results[e.grade_id] for e in exercises]


def report_lines(results: list[Result], lang: str, markdown: bool = False) -> list[str]:
    """One line per exercise and a total, in ``lang``. Details (which quote the learner's
    code and output) are escaped: in a fenced block with ``markdown``, else one escaped
    text for a terminal."""
    lines = []
    for r in results:
        lines.append(
            f"- {r.grade_id}: " + lookup(MESSAGES, r.status, lang) + f", {r.points}/{r.max_points}"
        )
        if r.detail and r.status != "passed":
            if markdown:  # indented inside the fence: no line of it starts like one of ours
                block = report.code_block(r.detail).split("\n")
                inner = ["  " + line for line in block[1:-1]]
                lines.append("\n" + "\n".join([block[0], *inner, block[-1]]) + "\n")
            else:
                lines.append("  " + report.clean(r.detail, newlines=True).replace("\n", "\n  "))
    total = _t(
        "total {points}/{max_points} points",
        lang,
        points=sum(r.points for r in results),
        max_points=sum(r.max_points for r in results),
    )
    return [*lines, total]


def _positive(args: argparse.Namespace, *names: str) -> str | None:
    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return _t(
                "--{name} must be a positive number, got {value!r}.",
                _cli_lang(),
                name=name.replace("_", "-"),
                value=value,
            )
    return None


def _cli_lang() -> str:
    from ddp_lab.i18n import get_language

    return get_language()


def reference_for(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The released exercise notebook ``nb`` came from: rebuilt from its chapter source when
    this checkout has it (learners edit the released file in place), else ``nb`` itself."""
    meta = nb.metadata.get("ddp_lab", {})
    from ddp_lab.course import build

    src = build.ROOT / str(meta.get("generated_from", "-"))
    if meta.get("generated_from") and src.is_file():
        target = build.ROOT / "exercises" / language_of(nb) / (src.stem + ".ipynb")
        return build.targets(src).get(target, nb)
    ref = copy.deepcopy(nb)  # no source: trust the notebook's own graded cells
    for cell in ref.cells:
        if _is_graded(cell):
            line = build.grade_pass_line(
                str(cell.metadata["grade_id"]), int(cell.metadata.get("points", 0)), language_of(nb)
            )
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=line + "\n")]
            cell.execution_count = 1
    return ref


def saved_note(path: Path, saved: float, lang: str, now: float | None = None) -> str:
    """When the graded file was saved, and that JupyterLab's unsaved edits are not graded.

    ``ddp-lab check`` reads the file on disk; a learner who ran it in a terminal next to
    the open notebook would otherwise be graded on an older version without knowing it.
    ``saved``: the file's mtime; ``now``: the current time (default: ``time.time()``).
    """
    now = time.time() if now is None else now
    age = max(0, int(now - saved))  # a file from a clock ahead of ours: "0 s ago"
    if age < 60:
        ago = _t("{n} s ago", lang, n=age)
    elif age < 3600:
        ago = _t("{n} min ago", lang, n=age // 60)
    elif age < 86400:
        ago = _t("{n} h ago", lang, n=age // 3600)
    else:
        ago = _t("{n} d ago", lang, n=age // 86400)
    at = datetime.datetime.fromtimestamp(saved)
    today = at.date() == datetime.datetime.fromtimestamp(now).date()
    return _t(
        "Grading {path} as saved {ago} ({time}); unsaved edits in JupyterLab are not "
        "seen: save with Ctrl+S first.",
        lang,
        path=report.shown(path, report.MAX_TEXT),
        ago=ago,
        time=at.strftime("%H:%M" if today else "%Y-%m-%d %H:%M"),
    )


def check_main(args: argparse.Namespace) -> int:
    """``ddp-lab check NOTEBOOK``: run it, print each exercise's status; 0 only if all passed."""
    path = Path(args.notebook)
    problem = _positive(args, "cell_timeout", "timeout")
    if problem is None and not path.is_file():
        problem = _t("No such file: {path}", _cli_lang(), path=path)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:  # the learner's own file: a link to it is fine, but not a FIFO or a huge file
        real = path.resolve()
        saved = real.stat().st_mtime
        nb = intake.load(real.parent, (real.name,))
    except intake.BadFile as exc:
        print(report.shown(exc, report.MAX_TEXT), file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  # any unreadable file: say why, in one line
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        why = _t("not a valid notebook: {error}", _cli_lang(), error=error)
        print(f"{report.shown(path)}: {report.shown(why, report.MAX_TEXT)}", file=sys.stderr)
        return 1
    release = reference_for(nb)
    if nb.metadata.get("ddp_lab", {}).get("kind") == "notebooks" or not exercises_of(release):
        print(
            _t(
                "{path} has no graded cells: is it an exercise notebook?",
                language_of(nb),
                path=path,
            ),
            file=sys.stderr,
        )
        return 1
    only = getattr(args, "only", None)
    if only:
        ids = [e.grade_id for e in exercises_of(release)]
        if only not in ids:
            print(
                _t(
                    "{path} has no exercise {grade_id}; it has: {ids}",
                    language_of(nb),
                    path=path,
                    grade_id=only,
                    ids=ids,
                ),
                file=sys.stderr,
            )
            return 2
        release = copy.deepcopy(release)
        release.cells = [c for c in release.cells if c.metadata.get("grade_id", only) == only]
    print(saved_note(path, saved, language_of(nb)), flush=True)
    slots = isolation.Slots()
    job = slots.acquire()
    try:
        lang, results = score(
            release,
            nb,
            args.cell_timeout,
            args.timeout,
            job=job,
            needed_only=not getattr(args, "all_cells", False),
            progress=True,
        )
        if not getattr(args, "all_cells", False) and any(
            "NameError" in r.detail for r in results if r.status != "passed"
        ):
            # A name the slice missed (course.grading.needed) or the learner's own mistake: the
            # whole notebook tells which, as ``ddp-lab grade`` runs it.
            lang, results = score(
                release, nb, args.cell_timeout, args.timeout, job=job, progress=True
            )
    finally:
        slots.release(job)
    print(report.shown(path, report.MAX_TEXT))
    print("\n".join(report_lines(results, lang)))
    print(
        _t(
            "Checked with the public cases; your instructor grades with other cases.",
            lang,
        )
    )
    return 0 if results and all(r.status == "passed" for r in results) else 1
