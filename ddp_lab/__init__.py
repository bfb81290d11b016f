"""ddp_lab: the helper package of the ddp-lab course on PyTorch data-parallel training.

Three parts:

- the teaching code, at the top of this folder, named after its PyTorch twin (``ring``,
  ``sampler``, ``ddp``, ``bucketed_ddp``, ``parallel/``, ...): what the chapters ask you to read;
- ``runtime/``: what makes multi-process cells work (``dl.spawn``, ``%%ddp``, ``dl.start``,
  ``%%ranks``);
- ``course/``: building, grading, messages in en/zh (``dl.grade``, ``dl.setup``, ``ddp-lab``).

``import ddp_lab as dl`` gives the launcher (``dl.spawn``), the ``%%ddp`` cell magic,
persistent ranks (``dl.start``, ``%%ranks``, ``dl.pull``, ``dl.push``, ``dl.status``,
``dl.stop``; the magics are registered automatically inside IPython), traces of all ranks
(``dl.spawn(..., trace=...)``, ``dl.timeline``), the language switch for messages, and
``dl.scratch``, a folder for a notebook's files that goes away with its kernel.
"""

from __future__ import annotations

from typing import Any

from ddp_lab import _moved  # first: old paths (ddp_lab.launcher, ...) keep working
from ddp_lab.course.grading import grade
from ddp_lab.course.notebook import compare, scratch, setup, show_source, tr
from ddp_lab.course.quiz import quiz
from ddp_lab.i18n import get_language, set_language
from ddp_lab.runtime.device import gpus_hidden, rank_device, this_rank_device
from ddp_lab.runtime.launcher import (
    DistributedDeadlockError,
    DistributedError,
    DistributedTimeoutError,
    RankFailure,
    set_timeout,
    shutdown,
    spawn,
)
from ddp_lab.runtime.persistent import pull, push, start, status, stop
from ddp_lab.tools import doctor  # callable: dl.doctor() prints the machine report
from ddp_lab.tools.trace_analysis import timeline

__version__ = "0.1.0"

__all__ = [
    "DistributedDeadlockError",
    "DistributedError",
    "DistributedTimeoutError",
    "RankFailure",
    "compare",
    "doctor",
    "get_language",
    "gpus_hidden",
    "grade",
    "pull",
    "push",
    "quiz",
    "rank_device",
    "scratch",
    "set_language",
    "set_timeout",
    "setup",
    "show_source",
    "shutdown",
    "spawn",
    "start",
    "status",
    "stop",
    "this_rank_device",
    "timeline",
    "tr",
]


def __getattr__(name: str) -> Any:
    """``dl.launcher``, ``dl.grading``...: modules that moved, under their old attribute names."""
    if f"{__name__}.{name}" in _moved.MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext ddp_lab``: register ``%%ddp`` and ``%%ranks``, warm up the launcher."""
    from ddp_lab.runtime import launcher, magic

    magic.register(ipython)
    launcher.prestart()


def _autoload() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None and hasattr(ip, "register_magic_function"):
        from ddp_lab.course.notebook import detect_language

        set_language(detect_language())
        load_ipython_extension(ip)


_autoload()
