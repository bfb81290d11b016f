"""README.md and docs/INSTRUCTORS.md, the two documents a reader meets before any notebook.

README's chapter table names each chapter by its title, in both languages, as the chapter
sources do (their ``ddp_lab.title`` metadata, which is also the first heading of each language
and the notebooks' title): a reader who looks a chapter up by the README's name finds it. The
Chinese text of both documents keeps the rules the generated notebooks are held to: the
glossary's terms (``test_terminology``), no soft line break or typed space between CJK
characters and bold that CommonMark pairs as written (``test_cjk_breaks``; GitHub, like a
browser, renders a line break between two Chinese characters as a space).
"""

from __future__ import annotations

import re

import jupytext
import pytest
from test_cjk_breaks import emphasis_faults, stray_breaks, typed_spaces
from test_terminology import hits

from ddp_lab.course import build

README = build.ROOT / "README.md"
INSTRUCTORS = build.ROOT / "docs" / "INSTRUCTORS.md"
DOCS = [README, INSTRUCTORS]
_IDEOGRAPH = re.compile(r"[\u4e00-\u9fff]")


def titles() -> dict[str, dict[str, str]]:
    """Each chapter's number -> its title per language, from the chapter sources."""
    out = {}
    for src in build.sources():
        title = jupytext.read(src).metadata["ddp_lab"]["title"]
        out[src.name[:2]] = {lang: str(title[lang]) for lang in ("en", "zh")}
    return out


def chapter_table(markdown: str) -> dict[str, list[str]]:
    """The rows of README's chapter table (its header starts ``| # | chapter | 章节``)."""
    lines = markdown.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| # | chapter | 章节"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_readme_chapter_table_names_every_chapter_by_its_titles():
    want = titles()
    rows = chapter_table(README.read_text(encoding="utf-8"))
    assert sorted(rows) == sorted(want), "a chapter missing from README's table, or one too many"
    for number, title in want.items():
        en, zh = rows[number][0], rows[number][1]
        assert (en, zh) == (title["en"][3:], title["zh"][3:]), f"chapter {number}"


@pytest.mark.parametrize("src", build.sources(), ids=lambda p: p.name[:2])
def test_chapter_title_is_its_first_heading(src):
    nb = jupytext.read(src)
    title = nb.metadata["ddp_lab"]["title"]
    for lang in ("en", "zh"):
        first = next(
            c.source
            for c in nb.cells
            if c.cell_type == "markdown" and c.metadata.get("lang", lang) == lang
        )
        assert first.split("\n", 1)[0] == f"# {title[lang]}", lang


def zh_text(path) -> str:
    """The Chinese of a document: README's paragraphs that hold Chinese (a bilingual heading
    and the chapter table included), INSTRUCTORS' section "中文版"."""
    text = path.read_text(encoding="utf-8")
    if path == INSTRUCTORS:
        return text.split("\n## 中文版\n", 1)[1]
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    return "\n\n".join(p for p in text.split("\n\n") if _IDEOGRAPH.search(p))


def test_the_zh_text_is_found():
    for path in DOCS:
        assert len(zh_text(path)) > 2000, path.name


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_uses_the_glossary(path):
    assert hits(zh_text(path)) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_has_no_break_or_space_between_cjk(path):
    text = path.read_text(encoding="utf-8")
    assert stray_breaks(text) == []
    assert typed_spaces(text) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_renders_its_emphasis_as_written(path):
    assert emphasis_faults(path.read_text(encoding="utf-8")) == []
