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
    expected = [f"{k}/{lang}/99_demo.ipynb" for k in build.KINDS for lang in build.LANGS]
    assert names == sorted([*expected, build.SANITIZE_FILE])
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


def test_graded_cell_stores_expected_line_labelled_as_the_target(project):
    """Exercises store the pass line behind a label (no verdict before any work); solutions
    store it bare; the shipped sanitizer turns the one into the other."""
    import re

    build.build(project)
    patterns = re.findall(
        r"^regex: (.*)$\n^replace: (.*)$",  # how nbval reads a sanitize file
        (project / build.SANITIZE_FILE).read_text(encoding="ascii"),
        flags=re.MULTILINE,
    )
    assert len(patterns) == 2
    for lang, word, label in (
        ("en", "PASS 99.double", "when solved, this cell prints: "),
        ("zh", "通过 99.double", "解出后本单元应显示："),
    ):
        texts = {}
        for kind in ("exercises", "solutions"):
            nb = nbformat.read(project / f"{kind}/{lang}/99_demo.ipynb", as_version=4)
            graded = [c for c in nb.cells if "grade" in c.metadata.get("tags", [])]
            assert len(graded) == 1
            cell = graded[0]
            assert "nbval-check-output" in cell.metadata["tags"]
            assert cell.metadata["points"] == 3 and cell.metadata["grade_id"] == "99.double"
            texts[kind] = cell.outputs[0]["text"]
        assert texts["exercises"].startswith(label + word) and "3/3" in texts["exercises"]
        assert texts["solutions"].startswith(word)
        sanitized = texts["exercises"]
        for regex, replace in patterns:
            sanitized = re.sub(regex, replace, sanitized)
        assert sanitized == texts["solutions"]


def test_headers_kernel_and_wrong_kernel_cell(project):
    build.build(project)
    setup_sh = (build.ROOT / "setup.sh").read_text()
    for kind in build.KINDS:
        for lang in build.LANGS:
            nb = nbformat.read(project / f"{kind}/{lang}/99_demo.ipynb", as_version=4)
            spec = nb.metadata["kernelspec"]
            # what setup.sh installs, so that JupyterLab does not rewrite (dirty) the file
            assert f'--name {spec["name"]} --display-name "{spec["display_name"]}"' in setup_sh
            header = nb.cells[0].source
            assert "do not edit" not in header and "请勿直接修改" not in header
            if kind == "exercises":
                assert "ddp-lab exercise 99" in header and f"work/{lang}/99_demo.ipynb" in header
                # a check in a terminal grades the saved file: the header says to save first
                assert f"ddp-lab check work/{lang}/99_demo.ipynb" in header and "Ctrl+S" in header
            first_code = next(c for c in nb.cells if c.cell_type == "code")
            assert "kernel-check" in first_code.metadata["tags"]
            assert "Python 3 (ddp-lab)" in first_code.source
            assert len({c.id for c in nb.cells}) == len(nb.cells)


def test_wrong_kernel_cell_names_the_kernel_in_both_languages():
    """Run the cell in a Python that cannot import ddp_lab (-S: no site-packages, so no
    editable install either), then in this one."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", build.kernel_guard_source()],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "ModuleNotFoundError" in out.stderr and sys.executable in out.stderr
    assert 'pick the kernel "Python 3 (ddp-lab)"' in out.stderr
    assert "请选择内核“Python 3 (ddp-lab)”" in out.stderr
    ok = subprocess.run([sys.executable, "-c", build.kernel_guard_source()], timeout=60)
    assert ok.returncode == 0


def test_exercise_copy_goes_to_work(project):
    build.build(project)
    code, message = build.copy_exercise("99", "zh", project)
    assert code == 0 and "work/zh/99_demo.ipynb" in message
    assert "先保存，再用 `ddp-lab check work/zh/99_demo.ipynb`" in message  # the saved file
    copy = project / "work/zh/99_demo.ipynb"
    assert copy.read_bytes() == (project / "exercises/zh/99_demo.ipynb").read_bytes()
    copy.write_text("my answers")
    assert build.copy_exercise("99", "zh", project)[0] == 1
    assert copy.read_text() == "my answers"  # never overwritten without --force
    assert build.copy_exercise("99", "zh", project, force=True)[0] == 0
    code, message = build.copy_exercise("42", "en", project)
    assert code == 2 and "99_demo" in message
    assert build.check_stale(project) == []  # work/ is no generated folder
    assert "/work/" in (build.ROOT / ".gitignore").read_text().split()


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


def test_a_graded_cell_says_its_cases_were_the_public_ones_except_a_concept_check():
    """Issue 41 point 10: dl.grade runs the public seed's cases; the pass line alone would
    read as the instructor's verdict. A concept check's questions are everyone's."""
    from ddp_lab.course import build

    for lang, words in (("en", "from the default seed"), ("zh", "由默认种子生成")):
        code = build.notebook_pass_output("05.ring", 5, lang).splitlines()
        assert code[0] == build.grade_pass_line("05.ring", 5, lang) and words in code[1]
        concepts = build.notebook_pass_output("05.concepts", 2, lang)
        assert concepts == build.grade_pass_line("05.concepts", 2, lang)


def test_a_self_check_under_another_seed_does_not_call_its_cases_the_default_ones(
    monkeypatch, capsys
) -> None:
    # The note after a pass line says the cases are the default seed's: with
    # DDP_LAB_GRADE_SEED set they are not, and the line is left out.
    from _solutions import graded_solution

    from ddp_lab.course.grading import checkers

    solved = graded_solution("00.average")  # the released solution's objects
    checkers.grade("00.average", *solved)
    assert "default seed" in capsys.readouterr().out
    monkeypatch.setenv("DDP_LAB_GRADE_SEED", "an-instructor-seed")
    checkers.grade("00.average", *solved)
    out = capsys.readouterr().out
    assert out.startswith("PASS 00.average") and "default seed" not in out, out


def test_build_says_when_nothing_changed_and_refuses_a_chapter_it_has_not(capsys) -> None:
    # An instructor's walkthrough: `ddp-lab build 00` on a built course printed nothing, and a
    # typo (`build 2` for 02) wrote nothing, said nothing and exited 0.
    from ddp_lab.course import cli

    assert cli.main(["build", "00"]) == 0
    assert "up to date: 1 chapter source(s)" in capsys.readouterr().out
    assert cli.main(["build", "2"]) == 2
    err = capsys.readouterr().err
    assert "no chapter source matches 2" in err and "02_processes_and_ranks" in err
