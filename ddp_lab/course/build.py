"""Build the course: one bilingual chapter source -> lessons, exercises and solutions.

A chapter source is a jupytext "percent" script, ``chapters/NN_name.py``:
- markdown cells carry ``lang="en"`` or ``lang="zh"`` (a markdown cell without ``lang``
  goes to both languages); code cells are written once and shared by both;
- cells tagged ``exercise`` go only to the exercise/solution notebooks, cells tagged
  ``lesson`` only to the lesson notebook;
- exercise code holds its solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
  in exercise notebooks that block becomes a stub that raises NotImplementedError;
- a graded cell is tagged ``grade`` and has ``grade_id`` and ``points`` metadata; it calls
  ``dl.grade(grade_id, ...)``. The build stores the passing line as its expected output,
  and nbval (tag ``nbval-check-output``) compares it.

Generated notebooks are committed; ``check_stale`` reports any that differ from a build.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jupytext
import nbformat

from ddp_lab.i18n import _t

ROOT = Path(__file__).resolve().parents[2]  # the checkout (this is ddp_lab/course/build.py)
LANGS = ("en", "zh")
KINDS = ("notebooks", "exercises", "solutions")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_MARKER = re.compile(r"^(\s*)### (BEGIN|END) SOLUTION\s*$")
_DROP_META = ("lang", "lines_to_next_cell", "exercise")


def grade_pass_line(grade_id: str, points: int, lang: str) -> str:
    """The line a graded cell prints when every hidden case passed."""
    return _t(
        "PASS {grade_id}: all hidden cases passed, {points}/{points} points",
        lang,
        grade_id=grade_id,
        points=points,
    )


def stub_solutions(source: str, lang: str) -> str:
    """Replace each BEGIN/END SOLUTION block with a NotImplementedError stub."""
    out: list[str] = []
    inside = False
    for line in source.split("\n"):
        m = _MARKER.match(line)
        if m and m.group(2) == "BEGIN":
            if inside:
                raise ValueError("nested ### BEGIN SOLUTION")
            inside = True
            msg = _t("your code here", lang)
            out.append(f'{m.group(1)}raise NotImplementedError("{msg}")')
        elif m:
            if not inside:
                raise ValueError("### END SOLUTION without BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without END")
    return "\n".join(out)


def strip_markers(source: str) -> str:
    """Drop the BEGIN/END SOLUTION marker lines, keeping the solution."""
    return "\n".join(line for line in source.split("\n") if not _MARKER.match(line))


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


def has_exercises(nb: nbformat.NotebookNode) -> bool:
    return any("grade" in c.metadata.get("tags", []) for c in nb.cells)


def _clean_meta(cell: nbformat.NotebookNode) -> None:
    for key in _DROP_META:
        cell.metadata.pop(key, None)


def render(nb: nbformat.NotebookNode, src: str, lang: str, kind: str) -> nbformat.NotebookNode:
    """One generated notebook: ``kind`` in KINDS, ``lang`` in LANGS."""
    title = nb.metadata.get("ddp_lab", {}).get("title", {})
    cells = [
        nbformat.v4.new_markdown_cell(
            _t(
                "*Generated from `{src}` by `ddp-lab build`; do not edit this file, edit "
                "the source.*",
                lang,
                src=src,
            )
        )
    ]
    cells[0].metadata["tags"] = ["generated"]
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown" and cell.metadata.get("lang", lang) != lang:
            continue
        if kind == "notebooks" and ("exercise" in tags or "grade" in tags):
            continue
        if kind != "notebooks" and "lesson" in tags:
            continue
        new = copy.deepcopy(cell)
        _clean_meta(new)
        if new.cell_type == "code":
            new.source = (
                stub_solutions(new.source, lang)
                if kind == "exercises"
                else strip_markers(new.source)
            )
            new.outputs, new.execution_count = [], None
            if "grade" in tags:
                meta = new.metadata
                line = grade_pass_line(meta["grade_id"], int(meta["points"]), lang)
                new.outputs = [nbformat.v4.new_output("stream", name="stdout", text=line + "\n")]
                new.execution_count = 1  # nbval ignores outputs of cells never run
                meta["tags"] = sorted(set(tags) | {"nbval-check-output"})
        elif new.cell_type == "markdown" and lang == "zh":
            new.source = join_cjk_breaks(new.source)
        new.pop("id", None)
        cells.append(new)
    out = nbformat.v4.new_notebook()
    out.cells = cells
    out.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "ddp_lab": {
            "generated_from": src,
            "kind": kind,
            "lang": lang,
            "title": title.get(lang, ""),
        },
    }
    # Stable cell ids: the same source always gives the same file.
    for i, cell in enumerate(out.cells):
        cell.id = f"{kind[:2]}{lang}-{i:03d}"
    return out


def sources(root: Path = ROOT) -> list[Path]:
    return sorted((root / "chapters").glob("[0-9][0-9]_*.py"))


def targets(src: Path, root: Path = ROOT) -> dict[Path, nbformat.NotebookNode]:
    """Every notebook that ``src`` generates, by output path."""
    nb = jupytext.read(src)
    rel = src.relative_to(root).as_posix()
    kinds = KINDS if has_exercises(nb) else ("notebooks",)
    result = {}
    for kind in kinds:
        for lang in LANGS:
            result[root / kind / lang / (src.stem + ".ipynb")] = render(nb, rel, lang, kind)
    return result


def dumps(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def build(root: Path = ROOT, only: list[str] | None = None) -> list[Path]:
    """Write every generated notebook; return the paths written."""
    written = []
    for src in sources(root):
        if only and not any(src.stem.startswith(o) for o in only):
            continue
        for path, nb in targets(src, root).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            text = dumps(nb)
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                written.append(path)
    return written


def check_stale(root: Path = ROOT) -> list[str]:
    """Problems that make the committed notebooks differ from a fresh build."""
    problems = []
    expected: set[Path] = set()
    for src in sources(root):
        for path, nb in targets(src, root).items():
            expected.add(path)
            if not path.exists():
                problems.append(f"missing: {path.relative_to(root)}")
            elif path.read_text(encoding="utf-8") != dumps(nb):
                problems.append(f"stale: {path.relative_to(root)}")
    for kind in KINDS:
        for path in sorted((root / kind).glob("*/*.ipynb")):
            if path not in expected:
                problems.append(f"orphan (no source): {path.relative_to(root)}")
    return problems
