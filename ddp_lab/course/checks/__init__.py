"""Checkers of the graded exercises, one module per chapter (``chNN.py``).

Every module in this package is imported by ``ddp_lab.course.grading.load_checkers``.
"""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
