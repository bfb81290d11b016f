"""One terminology: the zh text uses docs/GLOSSARY.md's terms, never its rejected variants.

Scans the Chinese markdown of the chapter sources and every zh message of the package's
tables. Inline code and English glosses in full-width parentheses (对比损失（contrastive loss）)
are left out: there English is wanted.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import jupytext
import pytest

import ddp_lab
from ddp_lab.course import build, i18n

# The rejected variants of docs/GLOSSARY.md ("Rejected variants"), with the term to use.
REJECTED = {
    r"原始笔记": "源笔记",
    r"(?<![源始])笔记(?!本)": "源笔记 (笔记本 is a notebook or laptop: fine)",
    r"(?<![A-Za-z_])loss(?![A-Za-z_])": "损失 (`loss` in code font for the variable)",
    r"滑动统计量": "运行统计量",
    r"就地": "原地",
    r"下标": "索引",
    r"(CUDA|GPU) ?内核": "核函数 (内核 is the OS or Jupyter kernel)",
    r"(?<![A-Za-z_])agents?(?![A-Za-z_])": "代理",
    r"证明": "验证 (证明 only for a mathematical proof)",
    r"散播": "散发",
    r"汇合": "会合",
    r"(?<!全)收集（all-gather）": "全收集（all-gather）",
}

# Every chapter's zh text follows the glossary (issue 18), and so does every message table.
CHAPTERS = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11"]


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


def _all_tables() -> dict[str, i18n.Messages]:
    for mod in pkgutil.walk_packages(ddp_lab.__path__, "ddp_lab."):
        importlib.import_module(mod.name)
    return dict(i18n.TABLES)  # every table, the checkers' feedback included


def test_messages_use_the_glossary():
    found = [
        f"{owner}[{key}]: {h}"
        for owner, table in _all_tables().items()
        for key in table
        for h in hits(table[key]["zh"])
    ]
    assert found == []


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
        ("torchrun 的 agent 收到信号，在 c10d 汇合", ["agent", "汇合"]),
    ],
)
def test_the_scan(text, bad):
    assert [h.split(" (use")[0].strip("'") for h in hits(text)] == bad
