"""Line breaks in Chinese markdown: which source line breaks the build drops.

A chapter's markdown is wrapped at a fixed width; a browser turns each line break into a
space, which Chinese text does not have. ``join_cjk_breaks`` joins the lines where a break
sits between Chinese characters or punctuation (docs/STYLE.md, "Line breaks in Chinese"),
and leaves code, tables, headings and other blocks alone. ``course/build.py`` runs it on
every zh markdown cell and re-exports these names.
"""

from __future__ import annotations

import re

# Characters between which a line break is dropped in Chinese markdown (docs/STYLE.md,
# "Line breaks in Chinese"). CJK_PUNCT never wants a space beside it; CJK_CHAR does, except
# next to another CJK_CHAR.


def _char_class(*ranges: tuple[int, int]) -> str:
    """The inside of a regex character class for code point ranges (kept as numbers, so
    that no Chinese text sits outside a message table)."""
    return "".join(
        re.escape(chr(lo)) + (f"-{re.escape(chr(hi))}" if hi != lo else "") for lo, hi in ranges
    )


CJK_PUNCT = _char_class(
    (0x3000, 0x303F),  # CJK symbols and punctuation (ideographic comma, full stop, brackets)
    (0xFF00, 0xFFEF),  # full-width forms (comma, colon, parentheses, ...)
    (0x2018, 0x2019),  # the curly quotes Chinese text uses
    (0x201C, 0x201D),
    (0x2014, 0x2014),  # em dash
    (0x2026, 0x2026),  # ellipsis
    (0x00B7, 0x00B7),  # middle dot
)
CJK_CHAR = _char_class(
    (0x2E80, 0x2FDF),  # radicals
    (0x3040, 0x30FF),  # kana
    (0x3400, 0x4DBF),  # ideographs, extension A
    (0x4E00, 0x9FFF),  # ideographs
    (0xF900, 0xFAFF),  # compatibility ideographs
)
_IS_PUNCT = re.compile(f"[{CJK_PUNCT}]")
_IS_CJK = re.compile(f"[{CJK_PUNCT}{CJK_CHAR}]")
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_BLOCK_START = re.compile(
    r"^\s*(#{1,6}(\s|$)|\||>|<|[-*+](\s|$)|\d{1,9}[.)](\s|$)|(\*\s*){3,}$|(-\s*){3,}$|(_\s*){3,}$|\$\$)"
)
_EMPHASIS = "*_~"


def _break_is_joined(before: str, after: str) -> bool:
    """Whether the soft break between line ``before`` and line ``after`` is dropped."""
    left = before.rstrip(" \t").rstrip(_EMPHASIS)
    right = after.lstrip(" \t").lstrip(_EMPHASIS)
    if not left or not right:
        return False
    a, b = left[-1], right[0]
    if _IS_PUNCT.match(a) and not b.isspace():
        return True
    if _IS_PUNCT.match(b) and not a.isspace():
        return True
    return bool(_IS_CJK.match(a) and _IS_CJK.match(b))


def join_cjk_breaks(markdown: str) -> str:
    """Drop the soft line breaks of hard-wrapped Chinese prose that browsers show as spaces.

    Chromium renders a newline inside a paragraph as a space, also between two Chinese
    characters. A break is joined when the characters on both sides
    (looking through ``*``/``_``/``~`` emphasis markers) are CJK characters or CJK
    punctuation, or when one side is CJK punctuation and the other is not a space. Breaks
    between a Chinese character and Latin text or digits stay: there a space is wanted. Only
    paragraph continuations are joined: fenced code, blank lines, headings, tables, block
    quotes, HTML, list items (a new item starts on its own line), hard breaks (two trailing
    spaces or a backslash) and thematic breaks are left as they are.
    """
    out: list[str] = []
    fence = ""
    joinable = False  # whether out[-1] is a paragraph line that the next line may continue
    for line in markdown.split("\n"):
        if fence:
            out.append(line)
            stripped = line.strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = ""
            continue
        m = _FENCE.match(line)
        if m:
            fence = m.group(1)
            out.append(line)
            joinable = False
            continue
        continues = (
            joinable
            and line.strip() != ""
            and not _BLOCK_START.match(line)
            and _break_is_joined(out[-1], line)
        )
        if continues:
            out[-1] = out[-1].rstrip(" \t") + line.lstrip(" \t")
        else:
            out.append(line)
        last = out[-1]
        joinable = (
            last.strip() != ""
            and not re.match(r"^\s*(#{1,6}(\s|$)|\||>|<|\$\$)", last)
            and not last.endswith(("  ", "\\"))
            and not (last.startswith("    ") and (len(out) < 2 or not out[-2].strip()))
        )
    return "\n".join(out)
