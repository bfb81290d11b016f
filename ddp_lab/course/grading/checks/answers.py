"""The probe of the concept checks (``NN.concepts``): the learner's answers, as data.

It holds no key: the key is in ``course/grading/checks/concept_key/`` (gathered by
``concepts.py``), imported by the grader (and by ``dl.quiz`` in the learner's own kernel, for
self-study) and hidden from every process that runs learner code while grading. The probe
runs in the learner's process (``learner.call``): what it returns is only what the learner
claims to have answered, compared with the key in the grader's process.
"""

from __future__ import annotations

import re
from typing import Any


def clean(answers: Any) -> dict[str, Any] | str:
    """``answers`` as {"1": "b", "2": 96.0, "3": None}, or the code of what is wrong with its
    form: ``"not_a_dict"``, ``"bad_key"`` or ``"bad_value:N"``. ``form_message`` says it in the
    learner's language; the grader, which gets this from the learner's process, shows no text
    of that process's writing. A question number written as a string ("1") counts as 1."""
    if not isinstance(answers, dict):
        return "not_a_dict"
    out: dict[str, Any] = {}
    for key, value in list(answers.items())[:64]:
        if isinstance(key, str) and key.strip().isascii() and key.strip().isdigit():
            key = int(key)  # int() strips the spaces itself
        if type(key) is not int or not 0 <= key < 1000:
            return "bad_key"
        if value is None or isinstance(value, str):
            out[str(key)] = None if value is None else value.strip().lower()[:20]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = float(value)
        else:
            return f"bad_value:{key}"
    return out


def form_message(code: Any) -> str:
    """What ``clean``'s ``code`` means, in the current language; any other value (from a
    process that ran learner code) is "could not be read"."""
    from ddp_lab.i18n import _t

    if code == "not_a_dict":
        return _t("the answers must be a dict of question numbers and answers, as given")
    if code == "bad_key":
        return _t("question numbers must be whole numbers: 1, 2, ...")
    m = re.fullmatch(r"bad_value:(\d{1,3})", code) if isinstance(code, str) else None
    if m:
        return _t(
            "answer {n}: a letter in quotes or a number, not another kind of value", n=int(m[1])
        )
    return _t("the answers could not be read")


def probe_answers(objects: tuple) -> Any:
    """NN.concepts: the answers handed to ``dl.grade``, as data (never judged here)."""
    (answers,) = objects
    return clean(answers)
