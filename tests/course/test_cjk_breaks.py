"""Soft line breaks in Chinese markdown: the build's join rule, and the generated notebooks.

Chromium renders a newline inside a paragraph as a space, also between two Chinese
characters, so hard-wrapped zh sources would show "只看得到自己的 分片". The build joins such
breaks (docs/STYLE.md, "Line breaks in Chinese"); these tests pin the rule and check every
generated zh notebook.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_lab.course import build
from ddp_lab.course.build import join_cjk_breaks

# An oracle written apart from the build's rule: a break whose visible neighbours (emphasis
# markers looked through) are both CJK ideographs or CJK punctuation.
_CJK = "[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef“”‘’—…]"
STRAY = re.compile(rf"{_CJK}[*_~]*[ \t]*\n[ \t]*[*_~]*{_CJK}")


def stray_breaks(markdown: str) -> list[str]:
    """The stray breaks of ``markdown`` outside fenced code, as ``"left|right"`` snippets."""
    prose = re.sub(r"(?ms)^\s*(```|~~~).*?^\s*\1[^\n]*$", "", markdown)
    found = []
    for m in STRAY.finditer(prose):
        nxt = prose[m.start() :].split("\n", 1)[1].lstrip()
        if re.match(r"([-*+]|\d+[.)])\s|#|\|", nxt):  # a new block, not a continuation
            continue
        found.append(m.group(0).replace("\n", "|"))
    return found


def _zh_notebooks():
    return sorted(p for kind in build.KINDS for p in (build.ROOT / kind / "zh").glob("*.ipynb"))


def _found_in_markdown(path, find) -> list[tuple[int, str]]:
    """``find(source)``'s findings in each markdown cell of the notebook, with the cell's index."""
    nb = nbformat.read(path, as_version=4)
    cells = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]
    return [(i, found) for i, source in cells for found in find(source)]


@pytest.mark.parametrize("path", _zh_notebooks(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_generated_zh_markdown_has_no_stray_breaks(path):
    stray = _found_in_markdown(path, stray_breaks)
    assert stray == [], f"{len(stray)} soft breaks between CJK characters (rebuild?): {stray[:5]}"


_CJK = r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]"
# A space typed between two CJK characters (markers of emphasis between them count too):
# "**为什么要并行？** 要么" renders with a gap, like a stray soft break (STYLE.md).
TYPED_SPACE = re.compile(_CJK + r"[*_]*[ \t]+[*_]*" + _CJK)


def typed_spaces(markdown: str) -> list[str]:
    text = re.sub(r"(?ms)^\s*(```|~~~).*?^\s*\1", "", markdown)
    text = re.sub(r"(`+).*?\1", "C", text)  # inline code is Latin: a space beside it is wanted
    text = re.sub(r"(?m)^\|.*$", "", text)  # table cells are padded
    return [m.group(0) for m in TYPED_SPACE.finditer(text)]


@pytest.mark.parametrize("path", _zh_notebooks(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_generated_zh_markdown_has_no_typed_space_between_cjk(path):
    found = _found_in_markdown(path, typed_spaces)
    assert found == [], f"{len(found)} spaces between CJK characters: {found[:5]}"


def emphasis_faults(markdown: str) -> list[str]:
    """Where CommonMark (markdown-it, what MyST renders the site with) does not pair
    ``markdown``'s bold and italics as written: a ``**`` left as text, or one taken as the
    opener of a second, nested bold. A closing ``**`` after Chinese punctuation and before
    a Chinese letter (``**预测与实测并列。**用``) is not right-flanking, so it does not close."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(markdown)
    html = re.sub(r"(?s)<pre>.*?</pre>|<code>.*?</code>", "", html)
    depth, found = 0, []
    for m in re.finditer(r"</?(?:strong|em)>|\*\*", html):
        if m.group(0).startswith("</"):
            depth -= 1
            continue
        depth += 1
        if m.group(0) == "**" or depth > 1:
            found.append(html[max(0, m.start() - 30) : m.end() + 10].replace("\n", " "))
    return found


def test_emphasis_rule():
    assert emphasis_faults("**预测与实测并列。**用") != []  # literal asterisks
    assert emphasis_faults("；**算子 ms（含于追踪）**是追踪，**Python ms** 是") != []  # nested
    assert emphasis_faults("**预测与实测并列**。用 `a**b` 与 **算子（追踪）**：是") == []


@pytest.mark.parametrize("path", _zh_notebooks(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_generated_zh_markdown_renders_its_emphasis_as_written(path):
    found = _found_in_markdown(path, emphasis_faults)
    assert found == [], f"{len(found)} bold/italic markers CommonMark pairs otherwise: {found[:5]}"


def test_typed_space_rule():
    assert typed_spaces("**为什么要并行？** 要么") == ["？** 要"]
    assert typed_spaces("每个 rank 一块 GPU，`x` 的值") == []
    assert typed_spaces("| 步骤 | 在 |\n") == []


def test_sources_do_keep_wrapped_lines():
    """The rule matters: the zh sources are hard-wrapped (so the oracle finds breaks there)."""
    text = (build.ROOT / "chapters" / "06_distributed_sampler.py").read_text(encoding="utf-8")
    zh = re.sub(r"\n# ?", "\n", text)
    assert len(stray_breaks(zh)) > 5


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("只看得到自己的\n分片", "只看得到自己的分片"),
        ("第一句。\n第二句", "第一句。第二句"),
        ("采样器的**填充**\n（padding）", "采样器的**填充**（padding）"),
        ("它会\n**卡住**", "它会**卡住**"),
        ("调用 `set_epoch`\n，否则", "调用 `set_epoch`，否则"),  # punctuation wants no space
        ("重复，\n`all_reduce` 会", "重复，`all_reduce` 会"),
        ("每个 rank\n都一样", "每个 rank\n都一样"),  # CJK/Latin: the space is wanted
        ("调用\nall_reduce", "调用\nall_reduce"),
        ("一共\n4 个", "一共\n4 个"),
        ("第一段\n\n第二段", "第一段\n\n第二段"),
        ("- 第一项\n- 第二项", "- 第一项\n- 第二项"),
        ("- 第一项的\n  续行", "- 第一项的续行"),
        ("1. 第一\n2. 第二", "1. 第一\n2. 第二"),
        ("## 标题\n正文", "## 标题\n正文"),
        ("| 甲 | 乙 |\n| 丙 | 丁 |", "| 甲 | 乙 |\n| 丙 | 丁 |"),
        ("```\n中文\n注释\n```", "```\n中文\n注释\n```"),
        ("前文：\n```bash\n中\n文\n```\n后文", "前文：\n```bash\n中\n文\n```\n后文"),
        ("硬换行  \n下一行", "硬换行  \n下一行"),
        ("硬换行\\\n下一行", "硬换行\\\n下一行"),
        ("> 引用\n> 引用", "> 引用\n> 引用"),
        ("one\ntwo", "one\ntwo"),
        ("甲\n乙\n丙", "甲乙丙"),
    ],
)
def test_join_rule(source, expected):
    assert join_cjk_breaks(source) == expected


_pieces = st.sampled_from(
    [
        "中文",
        "分片",
        "，",
        "。",
        "（",
        "）",
        "“",
        "”",
        "rank",
        "4",
        " ",
        "  ",
        "**",
        "*",
        "_",
        "`x`",
        "- ",
        "1. ",
        "# ",
        "| ",
        "> ",
        "```",
        "~~~",
        "    ",
        "\\",
        "\n",
        "\n\n",
        "\t",
    ]
)
_markdown = st.lists(_pieces, max_size=40).map("".join)


def _squash(text: str) -> str:
    return re.sub(r"\s", "", text)


@settings(max_examples=300, deadline=None)
@given(_markdown)
def test_join_only_drops_whitespace(text):
    out = join_cjk_breaks(text)
    assert _squash(out) == _squash(text)
    assert out.count("\n") <= text.count("\n")


@settings(max_examples=300, deadline=None)
@given(_markdown)
def test_join_is_idempotent(text):
    once = join_cjk_breaks(text)
    assert join_cjk_breaks(once) == once


@settings(max_examples=300, deadline=None)
@given(_markdown)
def test_join_keeps_blank_lines_headings_and_tables(text):
    out = join_cjk_breaks(text)
    assert sum(not line.strip() for line in out.split("\n")) == sum(
        not line.strip() for line in text.split("\n")
    )
    kept = out.split("\n")
    for line in text.split("\n"):
        if line.lstrip().startswith(("# ", "| ")):
            assert line in kept


@settings(max_examples=300, deadline=None)
@given(_markdown)
def test_join_leaves_latin_text_alone(text):
    latin = re.sub(r"[^\x00-\x7f]", "x", text)
    assert join_cjk_breaks(latin) == latin


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["中文", "分片", "，", "。", "“", "”", "rank", "4", "`x`"]), min_size=1
    ),
    st.data(),
)
def test_join_leaves_no_stray_break_in_a_paragraph(words, data):
    cut = [data.draw(st.booleans()) for _ in words]
    text = "".join(w + ("\n" if c else "") for w, c in zip(words, cut, strict=True)).strip("\n")
    out = join_cjk_breaks(text)
    assert stray_breaks(out) == []
    # every break it keeps has Latin text, a digit or code on both sides
    for left, right in re.findall(r"(.)\n(.)", out):
        assert re.match(r"[A-Za-z0-9`]", left) or re.match(r"[A-Za-z0-9`]", right)
        assert not re.search(f"[{build.CJK_PUNCT}]", left + right)
