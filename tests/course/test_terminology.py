"""One terminology: the zh text uses docs/GLOSSARY.md's terms, never its rejected variants.

Scans the Chinese markdown of the chapter sources, the Chinese strings of their code cells
(`dl.tr(zh=...)`, plot labels) and every zh message of the package's
catalog (ddp_lab/locale/zh/LC_MESSAGES/ddp_lab.po). Inline code and
English glosses in full-width parentheses (对比损失（contrastive loss）) are left out: there
English is wanted. Two slips of any language are checked in every generated notebook: a bare
URL that runs into the Chinese after it (GFM autolinks stop only at a space), and a reference
to the notes this course grew from, which learners never got.
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from babel.messages.pofile import read_po

import ddp_lab
from ddp_lab.course import build

# The rejected variants of docs/GLOSSARY.md ("Rejected variants"), with the term to use.
REJECTED = {
    r"原始笔记": "常见说法: the notes are never cited",
    r"(?<![源始])笔记(?!本)": "常见说法, 教程和博客 (笔记本 is a notebook or laptop: fine)",
    r"(?<![A-Za-z_])loss(?![A-Za-z_])": "损失 (`loss` in code font for the variable)",
    r"滑动统计量": "运行统计量",
    r"就地": "原地",
    r"下标": "索引",
    r"(CUDA|GPU|计算) ?内核": "核函数 (内核 is the OS or Jupyter kernel)",
    r"(?<![A-Za-z_])agents?(?![A-Za-z_])": "代理",
    r"证明": "验证 (证明 only for a mathematical proof)",
    r"散播": "散发",
    r"汇合": "会合",
    r"(?<!全)收集（all-gather）": "全收集（all-gather）",
    r"单元格": "单元 (one word for a notebook cell)",
    r"微批次": "微批 (one word for a micro-batch)",
    r"(?<![A-Za-z_])kernels?(?![A-Za-z_])": "核函数 for GPU code; 内核 for the OS or Jupyter",
}

# Every chapter's zh text follows the glossary (issue 18), and so does every message table.
CHAPTERS = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"]


def prose(text: str, glosses: bool = False) -> str:
    """``text`` without fenced code, inline code, links' targets and (unless ``glosses``)
    English glosses."""
    text = re.sub(r"(?ms)^\s*(```|~~~).*?^\s*\1", "", text)
    text = re.sub(r"(`+).*?\1", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    if glosses:
        return text
    return re.sub(r"（[\x00-\x7f]*）", "", text)  # 对比损失（contrastive loss）


def hits(text: str) -> list[str]:
    found = []
    for pattern, use in REJECTED.items():
        scanned = prose(text, glosses="（" in pattern)
        for m in re.finditer(pattern, scanned):
            line = next(ln for ln in scanned.split("\n") if m.group(0) in ln)
            found.append(f"{m.group(0)!r} (use {use}): {line.strip()[:80]}")
    return found


def zh_cells(chapter: str) -> list[str]:
    (src,) = (p for p in build.sources() if p.name.startswith(chapter + "_"))
    nb = jupytext.read(src)
    return [
        c.source for c in nb.cells if c.cell_type == "markdown" and c.metadata.get("lang") != "en"
    ]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_uses_the_glossary(chapter):
    found = [h for cell in zh_cells(chapter) for h in hits(cell)]
    assert found == []


# A string literal of a code cell that holds Chinese: "..." or '...' on one line.
_ZH_STRING = re.compile(
    r"""(["'])((?:(?!\1)[^\n\\]|\\.)*[\u4e00-\u9fff](?:(?!\1)[^\n\\]|\\.)*)\1"""
)


def zh_strings(code: str) -> list[str]:
    """The Chinese string literals of ``code``, f-string fields (``{loss:.3f}``) removed."""
    return [re.sub(r"\{[^{}]*\}", "", m.group(2)) for m in _ZH_STRING.finditer(code)]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_code_strings_use_the_glossary(chapter):
    """What a code cell prints or draws in Chinese (`dl.tr(zh=...)`) follows the glossary."""
    (src,) = (p for p in build.sources() if p.name.startswith(chapter + "_"))
    code = [c.source for c in jupytext.read(src).cells if c.cell_type == "code"]
    found = [h for cell in code for text in zh_strings(cell) for h in hits(text)]
    assert found == []


def _notebooks():
    return sorted(p for kind in build.KINDS for p in (build.ROOT / kind).glob("*/*.ipynb"))


# A URL that a Markdown renderer turns into a link by itself: not a link target `](...)`, not
# an autolink `<...>`.
_BARE_URL = re.compile(r"(?<![(<])https?://\S+")


def bare_urls_into_text(markdown: str) -> list[str]:
    """Bare URLs of ``markdown`` (code left out) followed by non-ASCII text, no space between:
    GFM's autolink runs to the next space, so "…/whl/（课程）。在同一个" becomes one link."""
    return [
        m.group(0)
        for m in _BARE_URL.finditer(prose(markdown, glosses=True))
        if not m.group(0).isascii()
    ]


# The notes this course grew from: learners never got them (issue 28), so no notebook names
# them or their numbers ("source note 004", "源笔记（002）", "the notes' rule").
NOTES = re.compile(
    r"source notes?|源笔记|原始笔记|\bthe notes\b|notes'|[（(]00\d[)）]|笔记 ?00\d"
    r"|\bnotes? 00\d"
)


def notes_references(text: str) -> list[str]:
    return [
        text[max(0, m.start() - 30) : m.end() + 10].replace("\n", " ") for m in NOTES.finditer(text)
    ]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.relative_to(build.ROOT).as_posix())
def test_notebook_has_no_bare_url_running_into_text(path):
    nb = nbformat.read(path, as_version=4)
    found = [
        u for c in nb.cells if c.cell_type == "markdown" for u in bare_urls_into_text(c.source)
    ]
    assert found == [], "write <https://...> or [text](https://...)"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.relative_to(build.ROOT).as_posix())
def test_notebook_does_not_cite_the_source_notes(path):
    nb = nbformat.read(path, as_version=4)
    found = [r for c in nb.cells for r in notes_references(c.source)]
    assert found == [], 'state the claim itself ("a common claim: ..."), then what runs'


def test_messages_use_the_glossary():
    with (Path(ddp_lab.__file__).parent / "locale/zh/LC_MESSAGES/ddp_lab.po").open("rb") as f:
        catalog = read_po(f)  # every message, the checkers' feedback included
    # A placeholder ({kernel}) is a field name, not prose.
    found = [
        f"{m.id[:50]!r}: {h}"
        for m in catalog
        if m.id
        for h in hits(re.sub(r"\{[^{}]*\}", "", m.string))
    ]
    assert found == []


# docs/STYLE.md, "Numbers in Chinese text": numbers as the cells print them (1024, 524368, 6700
# 万), × between factors, “” around quoted words. Code keeps its own notation (`batch x dim`,
# `"tp"`): prose() leaves code out.
NUMBERS_AND_QUOTES = {
    r"\d,\d{3}": "no thousands separator: 1024, 524368, 6700 万",
    r"(?<![A-Za-z]) x | x (?![A-Za-z])": "× between factors: 4 × 8, dp × tp",
    r'"': '“” around a quoted word; a name in code font: `"tp"`',
}


def style_hits(text: str) -> list[str]:
    scanned = prose(text, glosses=True)
    return [
        f"{m.group(0)!r} ({use}): {scanned[max(0, m.start() - 20) : m.end() + 20]!r}"
        for pattern, use in NUMBERS_AND_QUOTES.items()
        for m in re.finditer(pattern, scanned)
    ]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_writes_numbers_and_quotes_as_the_style_guide_says(chapter):
    found = [h for cell in zh_cells(chapter) for h in style_hits(cell)]
    assert found == []


def test_messages_write_numbers_and_quotes_as_the_style_guide_says():
    with (Path(ddp_lab.__file__).parent / "locale/zh/LC_MESSAGES/ddp_lab.po").open("rb") as f:
        catalog = read_po(f)
    found = [
        f"{m.id[:50]!r}: {h}"
        for m in catalog
        if m.id and isinstance(m.string, str)
        for h in style_hits(re.sub(r"\{[^{}]*\}", "", m.string))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ('4,096 行，批 4 x 8，见上面 "per rank" 那几行', ["4,096", " x ", '"', '"']),
        ('4096 行，批 4 × 8，`batch x dim`，一维（`"tp"`），FSDP x TP', []),
        ("对 x 的使用", [" x "]),
    ],
)
def test_the_numbers_and_quotes_scan(text, bad):
    assert [h.split(" (")[0].strip("'") for h in style_hits(text)] == bad


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("本课程的原始笔记还提出了", ["原始笔记"]),
        ("因此笔记中的说法", ["笔记"]),
        ("所有内容都能在笔记本电脑上运行；源笔记写着", []),
        ("把 loss 传回", ["loss"]),
        ("调用 `loss.backward()`，对比损失（contrastive loss）", []),
        ("先归约散播，再收集（all-gather）", ["散播", "收集（all-gather）"]),
        ("全收集（all-gather）和 CUDA 内核", ["CUDA 内核"]),
        ("用算子代替计算内核", ["计算内核"]),
        ("torchrun 的 agent 收到信号，在 c10d 汇合", ["agent", "汇合"]),
        ("它只是把一个 kernel 放进 CUDA 流", ["kernel"]),
        ("下一个核函数（kernel），重启内核", []),
    ],
)
def test_the_scan(text, bad):
    assert [h.split(" (use")[0].strip("'") for h in hits(text)] == bad


def test_the_code_string_scan():
    code = """print(dl.tr(en=f"{op} notes: {n}", zh=f"{op:15s} 笔记：{notes}  文档：{docs}"))
ax.set_title(dl.tr(en="loss", zh='损失 {loss:.3f}'))"""
    assert zh_strings(code) == [" 笔记：  文档：", "损失 "]
    assert [h.split(" (use")[0].strip("'") for t in zh_strings(code) for h in hits(t)] == ["笔记"]


@pytest.mark.parametrize(
    ("markdown", "bad"),
    [
        (
            "Linux x86_64：https://docs.nvidia.com/cuda/）。在同一个主版本内",
            ["https://docs.nvidia.com/cuda/）。在同一个主版本内"],
        ),
        ("见 https://github.com/NVIDIA/nccl/releases 的说明", []),
        ("见[发布说明](https://github.com/NVIDIA/nccl/releases)里", []),
        ("见 <https://download.pytorch.org/whl/>。", []),
        ("(Release Notes: https://docs.nvidia.com/cuda/). Within", []),
        ("`pip install --index-url https://download.pytorch.org/whl/cu128`）", []),
    ],
)
def test_the_url_scan(markdown, bad):
    assert bare_urls_into_text(markdown) == bad


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("The source notes (002) copy a table", 2),
        ("Two slips of source note 004 to drop now", 1),
        ("先纠正源笔记（004）的两个小错误", 2),
        ("the notes' rule, and the notes say", 2),
        ("a common claim in tutorials: DP uses threads; 笔记本电脑", 0),
        ("torch 2.13 (2024) on 4 GPUs, release notes of NCCL", 0),
    ],
)
def test_the_notes_scan(text, found):
    assert len(notes_references(text)) == found
