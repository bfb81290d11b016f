"""``ddp-lab grade --release R SUBMISSIONS...``: a class's gradebook, whatever the submissions do.

- submissions and identities from ``course.intake`` (the folder the instructor's layout
  gives, never a name the learner chose; duplicates reported);
- each submission through the stages (``grader.grade_one``: read, match, isolate, run, judge)
  with a slot (user id) no other running submission holds and a cgroup of its own
  (``isolation``), then reported (``feedback``, ``export``);
- no submission can stop the class: an error while scoring or reporting one is that
  submission's ``error``; its feedback (``feedback/NAME.md``) and Gradescope-style
  ``results/NAME.json`` are written as soon as it is graded, ``gradebook.csv`` and
  ``totals.csv`` at the end, always (``report`` makes learner text harmless), then the
  similarity report from the notebooks stage 1 read (no submission is read twice);
- ``--student NAME`` regrades some students of the class (named by its layout): their rows
  replace theirs in the gradebook ``--out`` holds, the others stay; a run that would drop an
  earlier gradebook's rows (one student's folder, another assignment) refuses before it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from ddp_lab.course.grading import export, feedback, intake, isolation, report
from ddp_lab.course.grading.execute import kill_all_runs
from ddp_lab.course.grading.grader import _cli_lang, _positive, grade_one
from ddp_lab.course.grading.judge import Result
from ddp_lab.course.grading.release import Release, exercises_of, language_of
from ddp_lab.i18n import _t


class Progress:
    """One line per graded submission: done/total, failures so far, time left (estimated)."""

    def __init__(self, total: int, lang: str) -> None:
        self.total, self.lang, self.count, self.zeros = total, lang, 0, 0
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def done(self, name: str, summary: str, zero: bool) -> None:
        with self.lock:
            self.count += 1
            self.zeros += zero
            elapsed = time.monotonic() - self.start
            left = elapsed / self.count * (self.total - self.count)
            bar = _t(
                "{done}/{total} graded, {zeros} with no points, about {left} s left",
                self.lang,
                done=self.count,
                total=self.total,
                zeros=self.zeros,
                left=f"{left:.0f}",
            )
            print(f"[{bar}] {report.shown(name)}: {summary}", flush=True)


def release_titles(path: Path, release: nbformat.NotebookNode) -> dict[str, str]:
    """The release's title per language: its own, and its other edition's where the
    instructor's tree has one (``exercises/zh/X.ipynb`` beside ``exercises/en/X.ipynb``)."""
    titles = {
        language_of(release): str(release.metadata.get("ddp_lab", {}).get("title", path.stem))
    }
    for lang in ("en", "zh"):
        other = path.parent.parent / lang / path.name
        if lang not in titles and other.is_file():
            with contextlib.suppress(Exception):
                meta = nbformat.read(other, as_version=4).metadata.get("ddp_lab", {})
                titles[lang] = str(meta.get("title", path.stem))
    return titles


def sandbox_problem(gradescope: bool, lang: str) -> str | None:
    """Why grading for Gradescope must not start here (no sandbox, not turned off on purpose)."""
    from ddp_lab.course.grading import sandbox

    if not gradescope or sandbox.available() or os.environ.get("DDP_LAB_SANDBOX") == "0":
        return None
    why = "no bubblewrap" if sandbox.bwrap_path() is None else "bubblewrap cannot start"
    return _t(
        "ddp-lab grade --gradescope: this machine cannot sandbox submissions "
        "({why}), and Gradescope's results must not come from unsandboxed code. "
        "Install bubblewrap and allow user namespaces in the autograder image, "
        "or set DDP_LAB_SANDBOX=0 to grade without a sandbox on purpose "
        "(results.json then says so).",
        lang,
        why=why,
    )


def grade_main(args: argparse.Namespace) -> int:
    """``ddp-lab grade``: write feedback, results, gradebook.csv and totals.csv."""
    from ddp_lab.course.grading import sandbox

    lang = _cli_lang()
    release_path = Path(args.release)
    problem = _positive(args, "cell_timeout", "timeout")
    if problem is None and (not isinstance(args.jobs, int) or args.jobs < 0):
        problem = _t(
            "--{name} must be a positive number, got {value!r}.", lang, name="jobs", value=args.jobs
        )
    if problem is None and not release_path.is_file():
        problem = _t("No such file: {path}", lang, path=release_path)
    missing = [p for p in args.submissions if not os.path.lexists(p)]
    if problem is None and missing:
        problem = _t("No such file: {path}", lang, path=", ".join(map(report.shown, missing)))
    subs = [] if problem else intake.find(args.submissions, release_path.stem, lang)
    if problem is None and not subs:
        problem = _t(
            "No .ipynb submissions found in {paths}", lang, paths=" ".join(args.submissions)
        )
    if problem is None:
        release = nbformat.read(release_path, as_version=4)
        if not exercises_of(release):
            problem = _t(
                "{path} has no graded cells: is it an exercise notebook?", lang, path=release_path
            )
    gradescope = getattr(args, "gradescope", None)
    if problem is None:
        problem = sandbox_problem(bool(gradescope), lang)
    everyone, students = subs, getattr(args, "student", None) or []
    if problem is None:
        subs, problem = _chosen(subs, students, args.submissions, lang)
    if problem is None and gradescope and len(subs) != 1:
        problem = _t(
            "--gradescope writes the results.json of one submission; {n} were found.",
            lang,
            n=len(subs),
        )
    out = Path(args.out)
    try:
        earlier = report.read_gradebook(out) if problem is None else None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        earlier, problem = (
            None,
            _t(
                "{path} cannot be read as a gradebook of ddp-lab grade ({error}): grade into "
                "another --out.",
                lang,
                path=report.shown(out / "gradebook.csv", report.MAX_TEXT),
                error=f"{type(exc).__name__}: {exc}",
            ),
        )
    if problem is None:
        problem = _clash(earlier, subs, exercises_of(release), bool(students), out, lang)
    if problem:
        print(report.shown(problem, report.MAX_TEXT), file=sys.stderr)
        return 2
    _say_what_runs(len(subs), args.jobs or os.cpu_count() or 1, release_path, lang)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(exist_ok=True)
    titles = release_titles(release_path, release)
    graded_against = Release.of(release)  # the release, known once for every submission
    exercises = graded_against.exercises
    limits = isolation.CgroupLimits(
        memory_gb=getattr(args, "memory_gb", None) or isolation.CgroupLimits.memory_gb,
        pids=getattr(args, "pids", None) or isolation.CgroupLimits.pids,
    )
    # Only a class has neighbours to keep apart: `ddp-lab check` (one learner's own notebook)
    # does not say it.
    isolation.warn_no_cgroups(lang)
    notes: list[str] = []
    if not sandbox.available():
        notes.append(_t("Graded WITHOUT a sandbox (DDP_LAB_SANDBOX=0 on the autograder).", lang))
    if isolation.unavailable_reason():
        notes.append(
            _t(
                "No cgroup per submission on the autograder: {why}.",
                lang,
                why=isolation.unavailable_reason(),
            )
        )
    extra = {"sandboxed": sandbox.available(), "cgroups": isolation.unavailable_reason() is None}

    workers = args.jobs or os.cpu_count() or 1
    progress = Progress(len(subs), lang)
    # one file per submission, named as in a run of the whole class (a regrade included)
    file_names = report.file_names(sub.identity for sub in everyone)
    slots = isolation.Slots()

    def write_results(sub: intake.Submission, lang: str, results: list[Result], t: float) -> None:
        # The notes on the grader's set-up are the instructor's: in extra_data (kept by
        # Gradescope, not shown to the learner), never in the learner's output.
        doc = export.gradescope_results(results, lang, t, extra={**extra, "notes": notes})
        name = file_names[sub.identity]
        report.write_text(out / "results" / f"{name}.json", json.dumps(doc, ensure_ascii=False))
        if gradescope and len(subs) == 1:
            Path(gradescope).parent.mkdir(parents=True, exist_ok=True)
            report.write_text(Path(gradescope), json.dumps(doc, ensure_ascii=False))

    def write_feedback(sub: intake.Submission, sub_lang: str, results: list[Result]) -> None:
        title = titles.get(sub_lang) or next(iter(titles.values()))
        others = sub.others if not sub.problem else []
        text = feedback.feedback_markdown(sub.identity, title, results, sub_lang, others)
        name = file_names[sub.identity]
        report.write_text(out / "feedback" / f"{name}.md", text)

    notebooks: dict[int, nbformat.NotebookNode] = {}  # stage 1's, for the similarity report

    def one(i: int) -> tuple[str, list[Result]]:
        sub = subs[i]
        started = time.monotonic()
        sub_lang = lang
        try:
            job = slots.acquire()
            try:
                outcome = grade_one(
                    graded_against, sub, args.cell_timeout, args.timeout, job=job, limits=limits
                )
            finally:
                slots.release(job)
            sub_lang, results = outcome.lang, outcome.results
            if outcome.notebook is not None:
                notebooks[i] = outcome.notebook
        except Exception as exc:  # noqa: BLE001  # a bug here must not stop the other gradings
            why = _t(
                "the notebook could not be run: {error}", lang, error=f"{type(exc).__name__}: {exc}"
            )
            results = [Result(e.grade_id, 0, e.points, "error", why) for e in exercises]
        try:
            write_results(sub, sub_lang, results, time.monotonic() - started)
            write_feedback(sub, sub_lang, results)
        except Exception as exc:  # noqa: BLE001  # a full disk, a bad name: this one's error
            why = _t(
                "the grader could not write this submission's report ({error}); grade it again.",
                lang,
                error=f"{type(exc).__name__}: {exc}",
            )
            results = [Result(r.grade_id, 0, r.max_points, "error", why) for r in results]
            with contextlib.suppress(Exception):  # say so where it can still be written
                write_results(sub, sub_lang, results, time.monotonic() - started)
        with contextlib.suppress(Exception):
            progress.done(
                sub.identity,
                feedback.report_lines(results, lang)[-1],
                all(r.status != "passed" for r in results),
            )
        return sub.identity, results

    pool = ThreadPoolExecutor(max_workers=workers)
    # SIGTERM (a job scheduler, `kill`) stops the grading like Ctrl-C: every run is killed.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        graded = list(pool.map(one, range(len(subs))))
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_all_runs()
        raise
    finally:
        pool.shutdown()
        signal.signal(signal.SIGTERM, previous)
    for path in report.write_gradebook(out, graded, earlier if students else None):
        print(_t("wrote {path}", lang, path=report.shown(path, report.MAX_TEXT)))
    if students:  # it compares the whole class: a regrade of some has not read the others
        print(_t("similarity.md is kept as it was (it compares the whole class).", lang))
        return 0
    _similarity(release, {subs[i].identity: nb for i, nb in sorted(notebooks.items())}, out, lang)
    return 0


def _chosen(
    subs: list[intake.Submission], students: list[str], paths: list[str], lang: str
) -> tuple[list[intake.Submission], str | None]:
    """The submissions of ``--student`` (all without it), named by the class's layout."""
    if not students:
        return subs, None
    known = {sub.identity for sub in subs}
    unknown = [name for name in students if name not in known]
    if unknown:
        return subs, _t(
            "No submission of {names} in {paths}; the students there: {known}. Pass the "
            "class's folder (the names come from its layout), not one student's.",
            lang,
            names=", ".join(unknown),
            paths=" ".join(paths),
            known=", ".join(sorted(known)[:20]) + (" ..." if len(known) > 20 else ""),
        )
    return [sub for sub in subs if sub.identity in students], None


def _clash(
    earlier: list[list[str]] | None,
    subs: list[intake.Submission],
    exercises: list,
    regrade: bool,
    out: Path,
    lang: str,
) -> str | None:
    """Why this run must not write ``out``'s gradebook (None: it may): it would drop an
    earlier run's rows, or mix two assignments in one gradebook."""
    grade_ids = [e.grade_id for e in exercises]
    names = [sub.identity for sub in subs]
    students, others = report.gradebook_clash(earlier, names, grade_ids, regrade)
    if not students and not others:
        return None
    path = report.shown(out / "gradebook.csv", report.MAX_TEXT)
    if regrade:
        return _t(
            "{path} holds other exercises than this release's ({ids}): a regrade with "
            "--student keeps the other students' rows, which would mix two assignments. "
            "Pass the release that gradebook was written for.",
            lang,
            path=path,
            ids=", ".join(others),
        )
    return _t(
        "{path} already holds grades this run would not write again (students: {students}; "
        "exercises: {ids}), and would be replaced. Grade each assignment into an --out of "
        "its own; to regrade some students, pass the class's folder with --student NAME; "
        "to start over, remove that gradebook.",
        lang,
        path=path,
        students=", ".join(students[:5]) + (" ..." if len(students) > 5 else "") or "-",
        ids=", ".join(others[:5]) or "-",
    )


def _say_what_runs(n: int, jobs: int, release: Path, lang: str) -> None:
    """The first lines: what is graded, and whose hidden cases (the default seed's are the
    ones learners can run at home: marks want the instructor's own)."""
    from ddp_lab.course.grading.checkers import default_seed

    print(
        _t(
            "Grading {n} submission(s) against {release}, {jobs} at a time ...",
            lang,
            n=n,
            release=report.shown(release, report.MAX_TEXT),
            jobs=min(jobs, n),
        ),
        flush=True,
    )
    if default_seed():
        print(
            _t(
                "warning: DDP_LAB_GRADE_SEED is not set: these are the default hidden cases, "
                "which learners can run at home. For marks, export a seed of your own "
                "(docs/INSTRUCTORS.md, section 2).",
                lang,
            ),
            file=sys.stderr,
            flush=True,
        )


def _similarity(
    release: nbformat.NotebookNode, read: dict[str, nbformat.NotebookNode], out: Path, lang: str
) -> None:
    """``out/similarity.md`` (``similarity``): for the instructor; never a grade's cause.
    ``read``: identity -> the notebook stage 1 read (an unread one is graded as its error)."""
    from ddp_lab.course.grading import similarity

    # ``shown``: two long names alike in their first MAX_NAME characters stay two (review 10)
    notebooks = {report.shown(ident, report.MAX_NAME): nb for ident, nb in read.items()}
    try:
        path = similarity.write_report(release, notebooks, out, lang)
    except Exception as exc:  # noqa: BLE001  # the report is extra: never fail the class on it
        print(report.shown(f"similarity report: {type(exc).__name__}: {exc}"), file=sys.stderr)
    else:
        print(_t("wrote {path}", lang, path=report.shown(path, report.MAX_TEXT)))
