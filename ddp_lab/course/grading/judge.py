"""Stage 5 of grading, judge: each exercise's points and status, from what the stages before
handed on.

The verdicts come from the verdict process (stage 4: each exercise's checker, run by the
grader, never by learner code; the scan's flags applied); here they become ``Result``s with
the learner-facing reason: a timeout of the whole notebook or of one cell, a dead kernel, a
busy machine (``error``: grade it again), a flag for the instructor. A graded cell stage 2
found tampered with scores 0 whatever ran; a file stage 1 could not read gives every exercise
its status (``error``, ``duplicate``, ``invalid``) and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_lab.course.grading.release import Exercise, Match
from ddp_lab.i18n import N_, _t, lookup

# The status of a result (a key) and the texts of the reasons, in the learner's language.
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
class Result:
    """One exercise of one notebook: points and a status (a key of ``M``) with details."""

    grade_id: str
    points: int
    max_points: int
    status: str
    detail: str = ""


def unread(exercises: list[Exercise], status: str, why: str) -> list[Result]:
    """Every exercise of a submission stage 1 could not read: 0 points, ``status``, ``why``."""
    return [Result(e.grade_id, 0, e.points, status, why) for e in exercises]


def judge(
    exercises: list[Exercise],
    match: Match,
    verdicts: dict[str, dict],
    cell_timeout: float,
    timeout: float,
) -> list[Result]:
    """One Result per exercise, in the release's order: the verdict of each graded cell
    found, 0 and the reason for each one tampered with."""
    lang, found, tampered = match.lang, match.found, match.tampered
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
            at, line = v.get("cell"), v.get("line")
            if type(at) is int and type(line) is str:
                shown = "`" + line.replace("`", "'") + "`"  # the learner's text, as code
                why += " " + _t("It was cell {n}, which begins {line}.", lang, n=at, line=shown)
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
    return [results[e.grade_id] for e in exercises]
