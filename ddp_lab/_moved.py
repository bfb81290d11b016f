"""Old import paths of modules that moved (into ``ddp_lab.runtime``, ``ddp_lab.labs``...).

The package used to be one flat folder. Code written against it (a learner's notebook,
``from ddp_lab.launcher import spawn``, ``import ddp_lab.grading``) keeps working: importing
an old path gives the very module object of the new place (same functions, same state, so
monkeypatching either name patches both). Prefer the new paths in new code:

==============================  =============================================
old path                        new place
==============================  =============================================
``ddp_lab.launcher``            ``ddp_lab.runtime.launcher``
``ddp_lab.persistent``          ``ddp_lab.runtime.persistent``
``ddp_lab.magic``               ``ddp_lab.runtime.magic``
``ddp_lab._zygote``             ``ddp_lab.runtime._zygote``
``ddp_lab._rank``               ``ddp_lab.runtime._rank``
``ddp_lab._rank_group``         ``ddp_lab.runtime._rank_group``
``ddp_lab._rank_loop``          ``ddp_lab.runtime._rank_loop``
``ddp_lab.build``               ``ddp_lab.course.build``
``ddp_lab.cli``                 ``ddp_lab.course.cli``
``ddp_lab.notebook``            ``ddp_lab.course.notebook``
``ddp_lab.course.i18n``         ``ddp_lab.i18n`` (gettext now: no ``Messages``/``t``)
``ddp_lab.hosts``               ``ddp_lab.cluster.hosts``
``ddp_lab.slurm``               ``ddp_lab.cluster.slurm``
``ddp_lab.LAB`` (experiments)   ``ddp_lab.labs.LAB`` (``launch_demo``, ``two_hosts``, ...)
``ddp_lab.TOOL`` (tools)        ``ddp_lab.tools.TOOL`` (``doctor``, ``train``, ...)
``ddp_lab[.course].grader``     ``ddp_lab.course.grading.grader`` (and every
                                grading stage: ``intake``, ``sandbox``, ...)
``ddp_lab.grading``             ``ddp_lab.course.grading.checkers`` (the
                                package ``ddp_lab.course.grading`` re-exports
                                its API: ``checker``, ``fail``, ``grade``...)
``ddp_lab[.course].checks``     ``ddp_lab.course.grading.checks``
==============================  =============================================

How: a finder on ``sys.meta_path`` answers for the old names only and hands back the
module imported under the new name; ``ddp_lab.__getattr__`` does the same for attribute
access (``dl.launcher``), and ``python -m OLD.PATH`` runs the new module's code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

# The chapters' experiments (``ddp_lab/labs/``) and the tools (``ddp_lab/tools/``).
LABS = (
    "launch_demo",
    "two_hosts",
    "slurm_jobs",
    "elastic",
    "preemption",
    "shaped_links",
    "recovery",
    "bench_allreduce",
    "ddp_knobs",
    "memory_model",
    "evaluation",
    "shared_memory",
)
TOOLS = (
    "doctor",
    "cuda_compat",
    "train",
    "resume",
    "data",
    "errors",
    "ranks",
    "trace_analysis",
    "interfaces",
)
# The stages of grading (``ddp_lab/course/grading/``), once ``ddp_lab.course.NAME``.
GRADING = (
    "grader",
    "grade_class",
    "intake",
    "isolation",
    "sandbox",
    "rankhost",
    "runner",
    "verdict",
    "wire",
    "scan",
    "similarity",
    "report",
    "export",
    "traffic",
    "learner",
    "checks",
)

MOVED: dict[str, str] = {
    **{
        f"ddp_lab.{name}": f"ddp_lab.runtime.{name}"
        for name in (
            "launcher",
            "persistent",
            "magic",
            "_zygote",
            "_rank",
            "_rank_group",
            "_rank_loop",
        )
    },
    **{f"ddp_lab.{name}": f"ddp_lab.course.{name}" for name in ("build", "cli", "notebook")},
    **{f"ddp_lab.{name}": f"ddp_lab.labs.{name}" for name in LABS},
    **{f"ddp_lab.{name}": f"ddp_lab.tools.{name}" for name in TOOLS},
    **{f"ddp_lab.course.{name}": f"ddp_lab.course.grading.{name}" for name in GRADING},
    "ddp_lab.grader": "ddp_lab.course.grading.grader",
    "ddp_lab.checks": "ddp_lab.course.grading.checks",
    "ddp_lab.grading": "ddp_lab.course.grading.checkers",
    "ddp_lab.course.i18n": "ddp_lab.i18n",
    "ddp_lab.hosts": "ddp_lab.cluster.hosts",
    "ddp_lab.slurm": "ddp_lab.cluster.slurm",
}


def new_name(old: str) -> str | None:
    """The new dotted name of moved module ``old`` (or of a module inside it), else None."""
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix) :]
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the module at its new place."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(new_name(spec.name) or spec.name)
        self._own_specs[spec.name] = module.__spec__
        return module

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code: ``python -m ddp_lab.slurm`` (runpy) runs it as ``__main__``."""
        spec = importlib.util.find_spec(new_name(fullname) or fullname)
        loader = spec.loader if spec else None
        return (
            loader.get_code(spec.name) if isinstance(loader, importlib.abc.InspectLoader) else None
        )

    def exec_module(self, module: ModuleType) -> None:
        # The import machinery has just set ``__spec__`` to the alias's spec (the old name);
        # give the module its own back.
        alias = module.__spec__.name if module.__spec__ is not None else ""
        if alias in self._own_specs:
            module.__spec__ = self._own_specs.pop(alias)


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


install()  # on import: ``ddp_lab/__init__.py`` imports this module first
