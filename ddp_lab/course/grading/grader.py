"""Grading one submission, stage after stage, and ``ddp-lab check`` (a learner's own notebook).

Nothing that ran learner code is trusted; what such a process says is data to verify, and it
only ever receives its own inputs. A submission passes the stages in this order, each handing
the next a value and none calling back (``grade_class`` drives a class through the same
``grade_one``, then writes the class's files); one submission enters each stage once:

1. find and read (``intake``): ``intake.Read``, the notebook with every output removed, read
   without trusting it (regular files only, size cap, parsed in a limited process), or why not;
2. match (``release``): ``release.Match``, where each graded cell of the release is in it, and
   which were changed, deleted, copied or moved ("tampered": 0 points, not run);
3. isolate (``isolation``): a user-id slot (held by the caller) and a cgroup of its own;
4. run (``execute``): the verdict process in that cgroup runs the submission in the sandbox
   (``sandbox``, ``runner``, ``rankhost``) and each exercise's checker (``verdict``,
   ``checks/``), reads the learner's own cells (``scan``) and answers grade_id -> verdict;
   everything it started is killed afterwards (``ddp-lab check``: only the cells the graded
   cells need, ``needed``);
5. judge (``judge``): one ``judge.Result`` per exercise: points, status, the reason;
6. report (``feedback``; ``report``, ``export``, ``similarity`` for a class).

The in-notebook line printed by ``dl.grade`` is never read. The stages' names that lived here
(``locate``, ``exercises_of``, ``Result``, ``report_lines``, ``run_verdict``...) are still
importable from this module.

How it differs from nbgrader and otter-grader: no database, server or student ids; the
kernel's own report is not trusted; each submission runs in a bubblewrap sandbox and a
cgroup instead of a container.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ddp_lab.course.grading import (
    checkers,
    execute,
    feedback,
    intake,
    isolation,
    judge,
    release,
    report,
)
from ddp_lab.course.grading.execute import (  # noqa: F401  # the old names of this module
    TOKEN_VAR,
    kill_all_runs,
    kill_run,
    run_verdict,
)
from ddp_lab.course.grading.feedback import report_lines  # noqa: F401
from ddp_lab.course.grading.judge import MESSAGES, Result  # noqa: F401
from ddp_lab.course.grading.release import (  # noqa: F401
    Exercise,
    exercises_of,
    language_of,
    locate,
    reference_for,
    same_code,
)
from ddp_lab.i18n import _t


@dataclass
class Graded:
    """One submission after the stages: its language, one Result per exercise, and the
    notebook stage 1 read (None if it was not read), for the class's similarity report."""

    lang: str
    results: list[Result]
    notebook: nbformat.NotebookNode | None


def grade_one(
    release_nb: nbformat.NotebookNode | release.Release,
    source: Path | intake.Submission | intake.Read | nbformat.NotebookNode,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
    limits: isolation.CgroupLimits | None = None,
    needed_only: bool = False,
    progress: bool = False,
) -> Graded:
    """Grade one submission against the release, stages 1 to 5 in order, each once.

    ``release_nb``: the released exercise notebook, or its ``release.Release`` (a class's
    driver makes it once for all its submissions). ``source``: a notebook file (given by the
    instructor), a found ``intake.Submission``, or stage 1's value when the caller read it first
    (``ddp-lab check`` needs the notebook to know its release). ``job``: a slot no other
    running grading holds (``isolation.Slots``); ``limits``: its cgroup's; ``needed_only``,
    ``progress``: ``ddp-lab check``'s (see ``execute.run``). A file that is not read gives
    every exercise ``error`` (or ``duplicate``), one that is not a notebook ``invalid``, with
    the reason.
    """
    rel = release_nb if isinstance(release_nb, release.Release) else release.Release.of(release_nb)
    read = source if isinstance(source, intake.Read) else intake.read(source, rel.lang)  # 1
    if read.notebook is None:
        return Graded(rel.lang, judge.unread(rel.exercises, read.status, read.why), None)
    matched = release.match(rel, read.notebook)  # 2
    verdicts = execute.run(  # 3 (the slot ``job``, a cgroup in ``run_verdict``), 4
        rel.notebook,
        read.notebook,
        matched.found,
        matched.lang,
        cell_timeout,
        timeout,
        job,
        limits,
        needed_only,
        progress,
    )
    results = judge.judge(rel.exercises, matched, verdicts, cell_timeout, timeout)  # 5
    return Graded(matched.lang, results, read.notebook)


def score(
    release_nb: nbformat.NotebookNode | release.Release,
    source: Path | intake.Submission | nbformat.NotebookNode,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
    limits: isolation.CgroupLimits | None = None,
    needed_only: bool = False,
    progress: bool = False,
) -> tuple[str, list[Result]]:
    """``grade_one``'s language and results (the name this module had for it)."""
    graded = grade_one(
        release_nb, source, cell_timeout, timeout, job, limits, needed_only, progress
    )
    return graded.lang, graded.results


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


def _copy_hint(path: Path, lang: str) -> str:
    """How to get the exercise to check, for a path named like one (``NN_name.ipynb``).

    The lessons say "check your work with ``ddp-lab check work/en/00_...``": a learner who
    has not copied the exercise yet, or who checks the lesson itself, needs the command
    that makes the copy, not only "no such file".
    """
    chapter = path.name[:2]
    if not (chapter.isdigit() and path.name[2:3] == "_"):
        return ""
    edition = "zh" if "zh" in path.parts else "en"
    command = f"ddp-lab exercise {chapter}" + (" --lang zh" if edition == "zh" else "")
    return "\n" + _t(
        "The exercise of chapter {chapter} is checked on your copy: `{command}` makes "
        "work/{edition}/{name}; work there, save it, then check that file.",
        lang,
        chapter=chapter,
        command=command,
        edition=edition,
        name=path.name,
    )


def check_main(args: argparse.Namespace) -> int:
    """``ddp-lab check NOTEBOOK``: run it, print each exercise's status; 0 only if all passed."""
    path = Path(args.notebook)
    problem = _positive(args, "cell_timeout", "timeout")
    if problem is None and not path.is_file():
        problem = _t("No such file: {path}", _cli_lang(), path=path) + _copy_hint(path, _cli_lang())
    if problem:
        print(problem, file=sys.stderr)
        return 2
    lang = _cli_lang()
    try:  # the learner's own file: a link to it is fine, but not a FIFO or a huge file
        real = path.resolve()
        saved = real.stat().st_mtime
    except Exception as exc:  # noqa: BLE001  # any unreadable file: say why, in one line
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        why = _t("not a valid notebook: {error}", lang, error=error)
        print(f"{report.shown(path)}: {report.shown(why, report.MAX_TEXT)}", file=sys.stderr)
        return 1
    read = intake.read(real, lang)  # stage 1 here: the notebook names its release
    nb = read.notebook
    if nb is None:
        why = report.shown(read.why, report.MAX_TEXT)  # BadFile's reason says which file
        print(f"{report.shown(path)}: {why}" if read.status == "invalid" else why, file=sys.stderr)
        return 1
    ref = reference_for(nb)
    if nb.metadata.get("ddp_lab", {}).get("kind") == "notebooks" or not exercises_of(ref):
        print(
            _t(
                "{path} has no graded cells: is it an exercise notebook?",
                language_of(nb),
                path=path,
            )
            + _copy_hint(path, language_of(nb)),
            file=sys.stderr,
        )
        return 1
    only = getattr(args, "only", None)
    if only:
        ids = [e.grade_id for e in exercises_of(ref)]
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
        ref = copy.deepcopy(ref)
        ref.cells = [c for c in ref.cells if c.metadata.get("grade_id", only) == only]
    print(saved_note(path, saved, language_of(nb)), flush=True)
    slots = isolation.Slots()  # stage 3's slot: a user id no other running grading has
    job = slots.acquire()
    try:
        graded = grade_one(
            release.Release.of(ref),
            read,
            args.cell_timeout,
            args.timeout,
            job=job,
            needed_only=not getattr(args, "all_cells", False),
            progress=True,
        )
    finally:
        slots.release(job)
    lang, results = graded.lang, graded.results
    print(report.shown(path, report.MAX_TEXT))  # stage 6
    print("\n".join(feedback.report_lines(results, lang)))
    if checkers.default_seed():
        print(checkers.default_seed_note(lang))
    return 0 if results and all(r.status == "passed" for r in results) else 1
