"""``load_checkers(grade_ids)`` finds a checker wherever in ``checks/`` it is registered.

For one exercise the grader imports only its chapter's module (``checks.chNN``). A checker
that lives in a part (``chNN_name.py``, docs/AUTHORING.md, for a chapter module at its size
limit) which ``chNN.py`` does not import was missing there: ``ddp-lab check --only`` said
"no checker for NN.name" while ``load_checkers()`` (what ``tests/course/test_build.py`` asks)
found it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddp_lab.course.grading import checkers, checks

CHAPTER = "from ddp_lab.course.grading import checker\n\n\n@checker('99.main', points=1)\ndef check_main(rng, learner):\n    yield 0\n"
PART = CHAPTER.replace("99.main", "99.part").replace("check_main", "check_part")


@pytest.fixture
def chapter_99(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A chapter ``ch99.py`` and a part ``ch99_part.py`` it does not import, found on the
    checks package's path; removed from the registry and ``sys.modules`` after."""
    (tmp_path / "ch99.py").write_text(CHAPTER)
    (tmp_path / "ch99_part.py").write_text(PART)
    monkeypatch.setattr(checks, "__path__", [*checks.__path__, str(tmp_path)])
    yield
    for name in ("ch99", "ch99_part"):
        sys.modules.pop(f"{checks.__name__}.{name}", None)
    for grade_id in ("99.main", "99.part"):
        checkers.REGISTRY.pop(grade_id, None)


@pytest.mark.usefixtures("chapter_99")
def test_a_checker_in_a_part_its_chapter_does_not_import_is_found() -> None:
    assert "99.part" in checkers.load_checkers(["99.part"])


@pytest.mark.usefixtures("chapter_99")
def test_a_checker_in_the_chapter_module_loads_the_chapter_alone() -> None:
    checkers.load_checkers(iter(["99.main"]))  # an iterator, read once
    assert "99.main" in checkers.REGISTRY
    assert f"{checks.__name__}.ch99_part" not in sys.modules
