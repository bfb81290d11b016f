"""``ddp-lab doctor`` / ``doctor()``: one report on the GPU stack and what distributed runs need.

Facts are gathered first (``gather``: commands, torch, the OS) and judged afterwards
(``analyse``, a pure function), so tests feed it fake ``nvidia-smi`` / ``nvcc`` outputs for
GPU situations a CPU machine cannot produce. Every line has a verdict (ok / warning /
problem) and, when it is not ok, the fix. Nothing here needs a GPU, nvcc or nvidia-smi.

Teaching version: PyTorch's own ``python -m torch.utils.collect_env`` lists versions but
judges nothing; this report adds the verdicts and the distributed-specific checks.

The facts live in ``doctor_facts.py`` and the verdicts in ``doctor_findings.py``; this module
is the report (``doctor``, ``Report``, the command) and the lessons' one-line checks
(``torch_check``, ``has``), and re-exports the names of both.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import asdict
from typing import Any

from ddp_lab.i18n import _t
from ddp_lab.tools.doctor_facts import (
    MIN_TORCH,
    TARGET_INCLUDES,
    TORCH_FEATURES,
    Facts,
    _loopback_gloo,
    _run,
    find_cuda_home,
    gather,
    gather_network,
    toolkit_include,
    torch_features,
)
from ddp_lab.tools.doctor_findings import (
    DIST_ENV,
    MIB,
    OK,
    PROBLEM,
    WARNING,
    Finding,
    _driver_findings,
    _f,
    _nccl_findings,
    _system_findings,
    _toolkit_findings,
    _torch_feature_findings,
    analyse,
)
from ddp_lab.tools.interfaces import gloo_interface, missing_interfaces, nccl_interface

__all__ = [
    "DIST_ENV",
    "MIB",
    "MIN_TORCH",
    "OK",
    "PROBLEM",
    "TARGET_INCLUDES",
    "TORCH_FEATURES",
    "WARNING",
    "Facts",
    "Finding",
    "Report",
    "analyse",
    "doctor",
    "find_cuda_home",
    "gather",
    "gather_network",
    "gloo_interface",
    "has",
    "main",
    "missing_interfaces",
    "nccl_interface",
    "toolkit_include",
    "torch_check",
    "torch_features",
    "_driver_findings",
    "_f",
    "_loopback_gloo",
    "_nccl_findings",
    "_run",
    "_system_findings",
    "_toolkit_findings",
    "_torch_feature_findings",
]


def torch_check() -> str:
    """One line for chapter 00: does this torch have every API the course uses?"""
    (line,) = _torch_feature_findings(Facts(torch_version=_torch_version(),
                                            torch_features=torch_features()))  # fmt: skip
    return f"{line.value}" + (f"\n-> {line.fix}" if line.fix else "")


def has(feature: str) -> bool:
    """Whether this torch has ``feature`` (a ``TORCH_FEATURES`` name); if not, say so.

    For a lesson cell: ``if dl.doctor.has("dist.all_gather_single"): ...`` skips the cell's
    work with one line that names what is missing, instead of a traceback.
    """
    if torch_features().get(feature, False):
        return True
    print(
        _t(
            "Skipped: this torch ({version}) lacks {feature}, which the course's torch "
            ">= {min} has (ddp-lab doctor lists what else).",
            version=_torch_version(),
            feature=feature,
            min=MIN_TORCH,
        )
    )
    return False


def _torch_version() -> str:
    import torch

    return torch.__version__


class Report(list):
    """The findings; shown as a coloured table in a notebook."""

    def __str__(self) -> str:
        marks = {OK: "ok     ", WARNING: "WARNING", PROBLEM: "PROBLEM"}
        lines = []
        for x in self:
            lines.append(f"[{marks[x.level]}] {x.key:<16} {x.value}")
            if x.fix:
                lines.append(f"{'':27}-> {x.fix}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        colors = {OK: "#2e7d32", WARNING: "#ef6c00", PROBLEM: "#c62828"}
        rows = "".join(
            f"<tr><td style='color:{colors[x.level]};font-weight:bold'>{x.level}</td>"
            f"<td><code>{x.key}</code></td><td style='text-align:left'>{html.escape(x.value)}"
            + (f"<br><i>&rarr; {html.escape(x.fix)}</i>" if x.fix else "")
            + "</td></tr>"
            for x in self
        )
        return f"<table>{rows}</table>"

    def to_json(self) -> str:
        return json.dumps(
            {
                "findings": [asdict(x) | {"fix": x.fix} for x in self],
                "summary": {lv: sum(x.level == lv for x in self) for lv in (OK, WARNING, PROBLEM)},
            },
            ensure_ascii=False,
            indent=2,
        )


def doctor(facts: Facts | None = None) -> Report:
    """Check this machine (or the given facts) and return the report."""
    return Report(analyse(facts if facts is not None else gather()))


def main(args: Any) -> int:
    """``ddp-lab doctor [--json]``: print the report; exit code 1 when a problem was found."""
    report = doctor()
    print(report.to_json() if getattr(args, "json", False) else report)
    return 1 if any(x.level == PROBLEM for x in report) else 0


class _CallableModule(types.ModuleType):
    """Lets ``dl.doctor()`` call :func:`doctor` although ``dl.doctor`` is this module."""

    def __call__(self, facts: Facts | None = None) -> Report:
        return doctor(facts)


# ``import ddp_lab.tools.doctor`` binds the module to ``ddp_lab.tools.doctor``, so a function of the same
# name in ``ddp_lab/__init__.py`` would be overwritten; making the module callable keeps
# both ``dl.doctor()`` and ``from ddp_lab.tools.doctor import doctor`` working.
sys.modules[__name__].__class__ = _CallableModule
