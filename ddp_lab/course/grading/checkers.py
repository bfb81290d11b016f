"""Graded exercises: hidden randomised cases checked against real PyTorch.

A chapter registers a checker with ``@checker("00.average", points=2)``. The checker is a
generator ``check(rng, learner)``: it draws hidden cases from the seeded ``random.Random``,
computes the oracle (the real torch function) itself, reaches the learner's code only
through the ``learner`` handle (``course.grading.learner``: probes that return data) and raises
``CaseFailed`` with a short explanation when the results differ. Before a case reaches the
learner's code the checker names it with ``running(label)``, so that an exception the
learner's code raises there is reported with the case it happened in.

``run_checker`` runs one checker against a handle and returns the verdict line. Two callers:
- ``grade(grade_id, *objects)`` in a notebook's graded cell (self-study): the handle is a
  ``LocalLearner`` over the learner's objects, in their kernel; it prints one line and
  raises ``AssertionError`` on failure so nbval sees the cell fail;
- ``course.grading.verdict`` for ``ddp-lab check`` / ``ddp-lab grade``: the handle is a
  ``RemoteLearner`` into the sandbox, and nothing in the learner's kernel is trusted.

The cases are drawn from ``DDP_LAB_GRADE_SEED`` (an instructor sets it to change them);
the seed and the case parameters are never printed in full.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ddp_lab.i18n import N_, _t

DEFAULT_SEED = 20261122
# Extra modules that register checkers (ddp_lab.course.grading.checks.* are always loaded).
CHECKER_MODULES: list[str] = []


class CaseFailed(Exception):
    """A hidden case failed; the message is shown to the learner."""


class NotAttempted(CaseFailed):
    """Nothing was tried (e.g. no question of a concept check answered): the verdict is
    ``not attempted``, not ``failed``; the message is shown to the learner."""


@dataclass
class Checker:
    grade_id: str
    points: int
    fn: Callable[..., Iterator[str]]


REGISTRY: dict[str, Checker] = {}
# The label of the case now running (``running``), for a verdict on an exception the learner's
# code raised: the checker's generator is gone by then, and so is its label.
_RUNNING: list[str] = []


def running(label: str) -> str:
    """Name the case about to run, so that an exception in it is reported with ``label``;
    returns ``label``. Cleared when the case passes (its label yielded)."""
    _RUNNING[:] = [label]
    return label


def checker(grade_id: str, points: int) -> Callable:
    """Register a checker generator for ``grade_id`` worth ``points``."""

    def wrap(fn: Callable[..., Iterator[str]]) -> Callable[..., Iterator[str]]:
        REGISTRY[grade_id] = Checker(grade_id, points, fn)
        return fn

    return wrap


def load_checkers(grade_ids: Iterable[str] | None = None) -> dict[str, Checker]:
    """Import the checker modules and return the registry: every module of
    ``ddp_lab.course.grading.checks``, or with ``grade_ids`` only the chapters they name ("05.ring":
    ``checks.ch05``). A verdict process grades one notebook and starts once per submission:
    importing the other chapters' checkers (``ch11`` imports torch's distributed checkpoint)
    cost it about a second of CPU."""
    from ddp_lab.course.grading import checks

    wanted = None if grade_ids is None else set(grade_ids)
    modules = (
        {"concepts" if g.endswith(".concepts") else f"ch{g.split('.')[0]}" for g in wanted}
        if wanted is not None
        else None
    )
    if modules is not None and all(checks.has(m) for m in modules):
        for module in sorted(modules):
            importlib.import_module(f"{checks.__name__}.{module}")
        # A checker registered in a part (``chNN_name.py``) that its chapter's module does
        # not import would be missing here, while ``load_checkers()`` (the build's test) finds
        # it: ``ddp-lab check`` said "no checker". Every module then, as without ``grade_ids``.
        if wanted is not None and not wanted <= set(REGISTRY):
            checks.load_all()
    else:
        checks.load_all()
    for name in CHECKER_MODULES:
        importlib.import_module(name)
    return REGISTRY


def grading_seed() -> str:
    """``DDP_LAB_GRADE_SEED``, or the default seed (in this file: anyone can run its cases)."""
    return os.environ.get("DDP_LAB_GRADE_SEED", str(DEFAULT_SEED))


def default_seed() -> bool:
    """Whether the cases are the default seed's, which every learner can run."""
    return grading_seed() == str(DEFAULT_SEED)


def rng_for(grade_id: str) -> random.Random:
    """The hidden cases' generator: depends on the instructor's seed and the exercise."""
    seed = grading_seed()
    digest = hashlib.sha256(f"{seed}:{grade_id}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def mismatch(expected: Any, actual: Any) -> CaseFailed:
    """A CaseFailed saying what was expected, kept short."""

    def short(x: Any) -> str:
        s = repr(x)
        return s if len(s) <= 160 else s[:157] + "..."

    return CaseFailed(
        _t("expected {expected}, got {actual}", expected=short(expected), actual=short(actual))
    )


NOT_ATTEMPTED = "not-attempted"  # the stub still raises NotImplementedError: 0 points


def run_checker(chk: Checker, learner: Any, lang: str | None = None) -> tuple[bool, str]:
    """Run ``chk`` with every message (the checker's own too) in ``lang``; see ``judge``.
    Returns (passed, the verdict line)."""
    status, line = judge(chk, learner, lang)
    return status == "passed", line


def judge(chk: Checker, learner: Any, lang: str | None = None) -> tuple[str, str]:
    """Like ``run_checker``, with the status: "passed", "failed" (a wrong answer) or
    ``NOT_ATTEMPTED`` (the stub's NotImplementedError: nothing was tried)."""
    from ddp_lab import i18n

    if lang is None:
        return _run(chk, learner, None)
    before = i18n.get_language()
    i18n.set_language(lang)
    try:
        return _run(chk, learner, lang)
    finally:
        i18n.set_language(before)


def _run(chk: Checker, learner: Any, lang: str | None) -> tuple[str, str]:
    """Run ``chk``'s hidden cases against ``learner`` (a ``course.grading.learner`` handle).

    Returns (the status, the verdict line in ``lang``, followed by the checker's ``note``s).
    The checker draws the cases, computes the oracle and compares, here; the learner's code
    is reached only through the handle. ``RunnerGone`` (the learner's process died or timed
    out) propagates to the caller.
    """
    status, line = _verdict(chk, learner, lang)
    notes = getattr(learner, "notes", None)
    if notes:  # what the checker could not judge here (e.g. ``note`` in 05.ring)
        line = sentences(lang, line, *dict.fromkeys(notes))
    return status, line


# Where a sentence ends: ".", "!", "?" and their ideographic / full-width forms.
_ENDS = (".", "!", "?", chr(0x3002), chr(0xFF01), chr(0xFF1F))


def sentence(text: str) -> str:
    """``text`` as a sentence of a verdict line: its first letter capitalised when it is a
    lowercase letter ("hidden case ..." -> "Hidden case ..."; "05.ring: ...", Chinese and
    an empty text unchanged)."""
    return text[:1].upper() + text[1:] if text[:1].islower() else text


def sentences(lang: str | None, *parts: str) -> str:
    """One verdict line from ``parts``: the first (the head, "FAIL 05.ring: 0/4 points.") as
    it is, each other one a sentence (``sentence``). A part that does not end a sentence gets
    a full stop before the next ("." and a space in English, the ideographic full stop and no
    space in Chinese). Every verdict line is built here, so none reads "points. hidden ..."."""
    from ddp_lab import i18n

    zh = (lang or i18n.get_language()) == "zh"
    stop, gap = (chr(0x3002), "") if zh else (".", " ")
    texts = [p.strip() for p in parts if p and p.strip()]
    out = ""
    for i, text in enumerate(texts):
        text = sentence(text) if i else text  # the first is the head ("FAIL 05.ring: ...")
        if out:
            out += ("" if out.endswith(_ENDS) else stop) + gap
        out += text
    return out


def verdict_line(head: str, lang: str | None, grade_id: str, points: int, *details: str) -> str:
    """``head`` (a msgid such as "FAIL {grade_id}: 0/{points} points.") in ``lang``, then
    ``details`` as sentences (``sentences``)."""
    return sentences(lang, _t(head, lang, grade_id=grade_id, points=points), *details)


def not_attempted_line(grade_id: str, points: int, lang: str | None) -> str:
    """The verdict line of an exercise whose stub still raises NotImplementedError."""
    detail = _t(
        "The exercise is not solved yet (NotImplementedError: replace the stub with your code).",
        lang,
    )
    head = N_("NOT ATTEMPTED {grade_id}: 0/{points} points.")
    return verdict_line(head, lang, grade_id, points, detail)


def note(learner: Any, text: str) -> None:
    """Add ``text`` (in the verdict's language) to the end of ``learner``'s verdict line."""
    try:
        learner.notes.append(text)
    except AttributeError:
        learner.notes = [text]


def unobserved(learner: Any, case: str, unreadable: str, unseen: str) -> None:
    """Where the grader has no evidence of its own from outside the ranks (why:
    ``learner.unobserved``): fail ``case`` when it could not be read (``unreadable``: not a
    way around the check), note ``unseen`` on the verdict line when nothing could observe the
    ranks (no sandbox); nothing in self-study (the learner's own processes)."""
    why = getattr(learner, "unobserved", "self-study")
    if why == "unreadable":
        raise fail(unreadable, case)
    if why != "self-study":
        note(learner, unseen)


def _verdict(chk: Checker, learner: Any, lang: str | None) -> tuple[str, str]:
    from ddp_lab.course.grading.learner import LearnerError, RunnerGone

    cases = chk.fn(rng_for(chk.grade_id), learner)
    index, total = 0, None
    _RUNNING.clear()
    try:
        total = next(cases)  # a checker first yields how many cases it has
        for _label in cases:
            index += 1
            _RUNNING.clear()
    except RunnerGone:
        raise
    except NotImplementedError:
        return NOT_ATTEMPTED, not_attempted_line(chk.grade_id, chk.points, lang)
    except NotAttempted as exc:  # e.g. a concept check with no answer given
        return NOT_ATTEMPTED, verdict_line(
            N_("NOT ATTEMPTED {grade_id}: 0/{points} points."),
            lang,
            chk.grade_id,
            chk.points,
            exc.args[0] if exc.args else "-",
        )
    except LearnerError as exc:
        if exc.not_implemented:
            return NOT_ATTEMPTED, not_attempted_line(chk.grade_id, chk.points, lang)
        else:
            why = _t("your code raised {error}", lang, error=f"{exc.type_name}: {exc.message}")
            if exc.message.startswith("Weights only load failed"):  # torch >= 2.6's default
                why += " " + _t(
                    "(torch.load loads only tensors and plain types unless told otherwise: "
                    "for a checkpoint your own code wrote, pass weights_only=False)",
                    lang,
                )
            detail = case_line(index + 1, total, _RUNNING[0] if _RUNNING else "-", why, lang)
    except CaseFailed as exc:
        detail = case_line(
            index + 1, total, exc.args[1] if len(exc.args) > 1 else "-", exc.args[0], lang
        )
    except Exception as exc:  # noqa: BLE001  # anything else the learner's code caused
        why = _t(
            "your code raised {error}", lang, error=f"{type(exc).__name__}: {_first_line(exc)}"
        )
        detail = case_line(index + 1, total, _RUNNING[0] if _RUNNING else "-", why, lang)
    else:
        return "passed", _t(
            "PASS {grade_id}: all hidden cases passed, {points}/{points} points",
            lang,
            grade_id=chk.grade_id,
            points=chk.points,
        )
    return "failed", verdict_line(
        N_("FAIL {grade_id}: 0/{points} points."), lang, chk.grade_id, chk.points, detail
    )


def grade(grade_id: str, *objects: Any) -> None:
    """Run the hidden cases of ``grade_id`` on the learner's ``objects``; print the verdict.

    This is the in-notebook check, for self-study: it runs in the learner's kernel, so the
    learner's code could change it. ``ddp-lab grade`` and ``ddp-lab check`` do not use it:
    they compute the verdict in a process of their own (``course.grading.verdict``).
    Returns nothing (a graded cell's only output is its verdict line); raises
    ``GradeFailed`` (an AssertionError shown as the verdict line alone) when a case fails.
    """
    from ddp_lab.course.grading.learner import LocalLearner

    registry = load_checkers([grade_id])
    if grade_id not in registry:
        raise KeyError(_t("unknown exercise {grade_id!r}", grade_id=grade_id))
    chk = registry[grade_id]
    passed, line = run_checker(chk, LocalLearner(objects))
    if not passed:
        raise GradeFailed(line)
    print(line)
    note = public_cases_note(grade_id) if default_seed() else ""
    if note:
        print(note)


def public_cases_note(grade_id: str, lang: str | None = None) -> str:
    """The line after a self-check's pass line under the default seed: every learner can run
    these cases, and an instructor's ``ddp-lab grade`` draws others. Empty for a concept
    check (its questions are the same for everyone)."""
    if grade_id.endswith(".concepts"):
        return ""
    return default_seed_note(lang)


def default_seed_note(lang: str | None = None) -> str:
    return _t(
        "These hidden cases come from the default seed, which every learner can run; "
        "your instructor grades with a seed of their own, so with other cases.",
        lang,
    )


class GradeFailed(AssertionError):
    """A failed graded cell: the cell fails (Run All and nbval see an error) and shows the
    verdict line alone, not a traceback into this module."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _first_line(exc: BaseException) -> str:
    from ddp_lab.course.grading.learner import _first_line as first_line

    return first_line(exc)


def case_line(index: int, total: object, case: str, why: str, lang: str | None) -> str:
    """ "Hidden case 2 of 3 (world_size=3) failed: ..."; without the parentheses where no
    case is named ("-": the failure is not one case's, e.g. a form check of all of them)."""
    if case in ("", "-"):
        return _t(
            "Hidden case {index} of {total} failed: {why}", lang, index=index, total=total, why=why
        )
    return _t(
        "Hidden case {index} of {total} ({case}) failed: {why}",
        lang,
        index=index,
        total=total,
        case=case,
        why=why,
    )


def fail(why: str, case: str) -> CaseFailed:
    """A CaseFailed for a case described by ``case`` (a few words, no hidden data)."""
    return CaseFailed(why, case)


def wrong_form(rank: object, field: str, kind: str, case: str) -> CaseFailed:
    """``fail`` for a probe result that is not of the form the probe returns: ``kind`` says
    what came back (each checker describes it its own way), never its content."""
    return fail(
        _t(
            "rank {rank} sent back a result of the wrong form ({field}: {kind})",
            rank=rank,
            field=field,
            kind=kind,
        ),
        case,
    )
