"""Checkers of the graded exercises, one module per chapter (``chNN.py``).

``ddp_lab.course.grading.checkers.load_checkers`` imports every module in this package, or only the
chapters of the exercises it is asked for.
"""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def has(name: str) -> bool:
    """Whether this package has a module ``name`` (e.g. "ch05")."""
    return any(info.name == name for info in pkgutil.iter_modules(__path__))
