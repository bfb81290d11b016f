"""The probe of the concept checks (``NN.concepts``): the learner's answers, as data.

It holds no key: the key is in ``course/grading/checks/concept_key/`` (gathered by
``concepts.py``), imported by the grader (and by ``dl.quiz`` in the learner's own kernel, for
self-study) and hidden from every process that runs learner code while grading. The probe
runs in the learner's process (``learner.call``): what it returns is only what the learner
claims to have answered, compared with the key in the grader's process.
"""

from __future__ import annotations

from typing import Any


def clean(answers: Any) -> dict[str, Any] | str:
    """``answers`` as {"1": "b", "2": 96.0, "3": None}, or what is wrong with its form."""
    if not isinstance(answers, dict):
        return f"answers must be a dict, got {type(answers).__name__}"
    out: dict[str, Any] = {}
    for key, value in list(answers.items())[:64]:
        if type(key) is not int:
            return f"question numbers must be int, got {type(key).__name__}"
        if value is None or isinstance(value, str):
            out[str(key)] = None if value is None else value.strip().lower()[:20]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = float(value)
        else:
            return f"answer {key}: a letter or a number, got {type(value).__name__}"
    return out


def probe_answers(objects: tuple) -> Any:
    """NN.concepts: the answers handed to ``dl.grade``, as data (never judged here)."""
    (answers,) = objects
    return clean(answers)
