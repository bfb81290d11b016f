"""The course build: one bilingual source -> lessons, exercises, solutions in zh and en."""

from __future__ import annotations

import shutil
from pathlib import Path

import jupytext
import nbformat
import pytest

from ddp_lab.course import build

SOURCE = '''# %% [markdown] lang="en"
# Hello

# %% [markdown] lang="zh"
# 你好

# %%
import ddp_lab as dl

# %% tags=["lesson"]
print("lesson only")

# %% tags=["exercise"]
def double(x):
    """Twice x."""
    ### BEGIN SOLUTION
    y = x * 2
    return y
    ### END SOLUTION

# %% tags=["grade"] grade_id="99.double" points=3
dl.grade("99.double", double)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "99_demo.py").write_text(SOURCE, encoding="utf-8")
    return tmp_path


def test_stub_keeps_indentation_and_language():
    code = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    assert build.stub_solutions(code, "en") == (
        'def f():\n    raise NotImplementedError("your code here")\n'
    )
    assert "在这里写你的代码" in build.stub_solutions(code, "zh")
    assert build.strip_markers(code) == "def f():\n    return 1\n"


@pytest.mark.parametrize(
    "bad",
    [
        "### BEGIN SOLUTION\nx = 1\n",
        "x = 1\n### END SOLUTION\n",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n",
    ],
)
def test_unbalanced_markers_are_errors(bad):
    with pytest.raises(ValueError):
        build.stub_solutions(bad, "en")


def test_build_writes_every_kind_and_language(project):
    written = build.build(project)
    names = sorted(p.relative_to(project).as_posix() for p in written)
    assert names == sorted(f"{k}/{lang}/99_demo.ipynb" for k in build.KINDS for lang in build.LANGS)
    assert build.build(project) == []  # idempotent
    assert build.check_stale(project) == []


def _code(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_code_identical_across_languages_and_kinds(project):
    build.build(project)
    for kind in ("notebooks", "solutions"):
        assert _code(project / kind / "en/99_demo.ipynb") == _code(
            project / kind / "zh/99_demo.ipynb"
        )
    en, zh = (
        _code(project / "exercises/en/99_demo.ipynb"),
        _code(project / "exercises/zh/99_demo.ipynb"),
    )
    diffs = [(a, b) for a, b in zip(en, zh, strict=True) if a != b]
    assert len(diffs) == 1 and "your code here" in diffs[0][0] and "在这里写你的代码" in diffs[0][1]


def test_cells_routed_by_kind_and_language(project):
    build.build(project)
    lesson = nbformat.read(project / "notebooks/zh/99_demo.ipynb", as_version=4)
    assert lesson.cells[0].metadata["tags"] == ["generated"]
    assert "chapters/99_demo.py" in lesson.cells[0].source
    text = "\n".join(c.source for c in lesson.cells)
    assert "你好" in text and "Hello" not in text
    assert "lesson only" in text and "def double" not in text and "dl.grade" not in text
    ex = nbformat.read(project / "exercises/en/99_demo.ipynb", as_version=4)
    text = "\n".join(c.source for c in ex.cells)
    assert "lesson only" not in text and "x * 2" not in text and '"""Twice x."""' in text
    sol = nbformat.read(project / "solutions/en/99_demo.ipynb", as_version=4)
    text = "\n".join(c.source for c in sol.cells)
    assert "x * 2" in text and "BEGIN SOLUTION" not in text
    assert ex.metadata["ddp_lab"] == {
        "generated_from": "chapters/99_demo.py",
        "kind": "exercises",
        "lang": "en",
        "title": "",
    }


def test_graded_cell_stores_expected_line(project):
    build.build(project)
    for lang, word in (("en", "PASS 99.double"), ("zh", "通过 99.double")):
        nb = nbformat.read(project / f"exercises/{lang}/99_demo.ipynb", as_version=4)
        graded = [c for c in nb.cells if "grade" in c.metadata.get("tags", [])]
        assert len(graded) == 1
        cell = graded[0]
        assert "nbval-check-output" in cell.metadata["tags"]
        assert cell.metadata["points"] == 3 and cell.metadata["grade_id"] == "99.double"
        assert cell.outputs[0]["text"].startswith(word) and "3/3" in cell.outputs[0]["text"]


def test_stale_missing_and_orphan_files_are_reported(project):
    build.build(project)
    path = project / "notebooks/en/99_demo.ipynb"
    path.write_text(path.read_text().replace("Hello", "Hallo"))
    (project / "solutions/zh/99_demo.ipynb").unlink()
    shutil.copy(project / "notebooks/zh/99_demo.ipynb", project / "notebooks/zh/98_gone.ipynb")
    problems = build.check_stale(project)
    assert "stale: notebooks/en/99_demo.ipynb" in problems
    assert "missing: solutions/zh/99_demo.ipynb" in problems
    assert "orphan (no source): notebooks/zh/98_gone.ipynb" in problems


def test_committed_notebooks_are_up_to_date():
    assert build.check_stale() == [], "run `ddp-lab build` and commit the result"


@pytest.mark.parametrize("src", build.sources(), ids=lambda p: p.stem)
def test_chapter_sources_pair_languages(src):
    nb = jupytext.read(src)
    md = [c for c in nb.cells if c.cell_type == "markdown"]
    langs = [c.metadata.get("lang") for c in md]
    assert None not in langs, 'every markdown cell needs lang="en" or lang="zh"'
    assert langs.count("en") == langs.count("zh")
    title = nb.metadata.get("ddp_lab", {}).get("title", {})
    assert set(title) == {"en", "zh"}


@pytest.mark.parametrize("src", build.sources(), ids=lambda p: p.stem)
def test_graded_cells_match_registered_checkers(src):
    from ddp_lab.course.grading import load_checkers

    registry = load_checkers()
    for cell in jupytext.read(src).cells:
        if "grade" in cell.metadata.get("tags", []):
            gid = cell.metadata["grade_id"]
            assert gid in registry, gid
            assert registry[gid].points == cell.metadata["points"], gid
            assert f'dl.grade("{gid}"' in cell.source
