"""No module of ddp_lab is over 450 lines (issue 42: rooms a newcomer can read whole)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddp_lab

PACKAGE = Path(ddp_lab.__file__).parent
LIMIT = 450
# Split by the other helpers of issue 42's round (gpu: doctor, trace_analysis, checks/ch10;
# restart: train; grading: rankhost, checks/ch05) or still to split (house: launcher,
# _rank_group, grader, cluster/hosts, course/build); strict once they have landed.
PENDING = (
    "tools/doctor.py, tools/trace_analysis.py, tools/train.py, course/grading/rankhost.py, "
    "course/grading/checks/ch05.py, course/grading/checks/ch10.py, runtime/launcher.py, "
    "runtime/_rank_group.py, course/grading/grader.py, cluster/hosts.py, course/build.py"
)


def long_modules() -> dict[str, int]:
    lines = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    return {name: n for name, n in lines.items() if n > LIMIT}


def test_the_count_sees_a_long_module() -> None:
    assert all(n > LIMIT for n in long_modules().values())
    assert len((PACKAGE / "__init__.py").read_text().splitlines()) < LIMIT


@pytest.mark.xfail(reason=f"splits still pending: {PENDING}", strict=False)
def test_no_module_is_over_450_lines() -> None:
    assert long_modules() == {}
