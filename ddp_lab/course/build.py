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
  and nbval (tag ``nbval-check-output``) compares it. In exercise notebooks that line is
  labelled as the target ("when solved, this cell prints: PASS ..."), so that an unsolved
  notebook shows no verdict; ``exercises/nbval_sanitize.cfg`` (also written by the build)
  strips the label for ``pytest --nbval --nbval-sanitize-with exercises/nbval_sanitize.cfg``;
- before its first code cell every notebook gets a cell that says which kernel to pick
  when ``ddp_lab`` cannot be imported (a wrong kernel), in both languages.

Generated notebooks are committed; ``check_stale`` reports any that differ from a build.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jupytext
import nbformat

from ddp_lab.course import i18n
from ddp_lab.course.i18n import Messages

ROOT = Path(__file__).resolve().parents[2]  # the checkout (this is ddp_lab/course/build.py)
LANGS = ("en", "zh")
KINDS = ("notebooks", "exercises", "solutions")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_MARKER = re.compile(r"^(\s*)### (BEGIN|END) SOLUTION\s*$")
_DROP_META = ("lang", "lines_to_next_cell", "exercise")

# The kernel setup.sh installs (`ipykernel install --name python3 --display-name ...`): the
# generated notebooks name the same one, so that JupyterLab opens them unmodified.
KERNEL_NAME = "python3"
KERNEL_DISPLAY_NAME = "Python 3 (ddp-lab)"
SANITIZE_FILE = "exercises/nbval_sanitize.cfg"

MESSAGES = Messages(
    __name__,
    {
        "generated_note": {
            "en": "*Generated from `{src}` by `ddp-lab build` (course authors: edit the source "
            "and rebuild).*",
            "zh": "*本文件由 `ddp-lab build` 从 `{src}` 生成（课程作者请修改源文件后重新生成）。*",
        },
        "generated_note_exercise": {
            "en": "*Generated from `{src}` by `ddp-lab build`. Work on your own copy: "
            "`ddp-lab exercise {chapter}` copies this notebook to `{copy}` (git ignores "
            "`work/`, so `git pull` updates the course without touching your answers).*",
            "zh": "*本文件由 `ddp-lab build` 从 `{src}` 生成。请在自己的副本上作答："
            "`ddp-lab exercise {chapter} --lang zh` 会把本 notebook 复制到 `{copy}`"
            "（git 忽略 `work/`，`git pull` 更新课程时不会动到你的答案）。*",
        },
        "copied": {
            "en": "Copied {src} to {dst}: open that copy and work there (`ddp-lab check {dst}` "
            "checks it). git ignores work/, so `git pull` updates the course cleanly.",
            "zh": "已把 {src} 复制到 {dst}：请打开这个副本作答（用 `ddp-lab check {dst}` 检查）。"
            "git 忽略 work/，`git pull` 可以顺利更新课程。",
        },
        "copy_exists": {
            "en": "{dst} already exists (your work): open it. `--force` replaces it with a fresh "
            "copy, and your answers in it are lost.",
            "zh": "{dst} 已经存在（你的作答）：直接打开它即可。`--force` 会用新副本替换它，"
            "其中的答案会丢失。",
        },
        "no_exercise": {
            "en": "no exercise notebook for chapter {chapter!r} in {folder}; there are: {choices}",
            "zh": "{folder} 中没有第 {chapter!r} 章的练习 notebook；现有：{choices}",
        },
        "target_label": {
            "en": "when solved, this cell prints: ",
            "zh": "解出后本单元格应显示：",
        },
        "wrong_kernel": {
            "en": "This kernel ({python}) cannot import ddp_lab: pick the kernel "
            '"{kernel}" (Kernel > Change Kernel...), which `bash setup.sh` installs.',
            "zh": "当前内核（{python}）无法导入 ddp_lab：请选择内核“{kernel}”"
            "（Kernel > Change Kernel...），它由 `bash setup.sh` 安装。",
        },
    },
)


def kernel_guard_source() -> str:
    """The code of the cell that names the course's kernel when ``ddp_lab`` is missing.

    The same code in both languages (code cells are identical in zh and en), so the message
    carries both.
    """
    en, zh = MESSAGES.pair("wrong_kernel", kernel=KERNEL_DISPLAY_NAME, python="{sys.executable}")
    return (
        f"# The course runs in the kernel {KERNEL_DISPLAY_NAME!r}, installed by setup.sh.\n"
        "import importlib.util\n"
        "import sys\n"
        "\n"
        'if importlib.util.find_spec("ddp_lab") is None:\n'
        "    raise ModuleNotFoundError(\n"
        f"        f{en + chr(10)!r}\n"
        f"        f{zh!r}\n"
        "    )"
    )


def target_line(grade_id: str, points: int, lang: str) -> str:
    """The stored output of a graded cell in an exercise notebook: the pass line, labelled
    as what the cell prints once solved (so that it reads as no verdict)."""
    return MESSAGES("target_label", lang) + grade_pass_line(grade_id, points, lang)


def sanitize_config() -> str:
    """``exercises/nbval_sanitize.cfg``: nbval's ``--nbval-sanitize-with`` file that strips
    the target label, so that a solved exercise notebook passes ``pytest --nbval``.

    nbval applies each ``regex`` to the stored and to the new output before comparing.
    Non-ASCII characters are written as ``\\uXXXX`` escapes (``re`` reads them), so the
    file is ASCII whatever encoding configparser assumes.
    """
    lines = [
        "# Generated by `ddp-lab build`. Check an exercise notebook yourself with",
        f"#   pytest --nbval --nbval-sanitize-with {SANITIZE_FILE} work/en/05_ring_allreduce.ipynb",
        "# Each graded cell's stored output is the pass line behind a label ('when solved,",
        "# this cell prints: '); this strips the label before nbval compares.",
    ]
    for lang in LANGS:
        label = re.escape(MESSAGES("target_label", lang).strip())
        label = "".join(c if ord(c) < 128 else f"\\u{ord(c):04x}" for c in label)
        # nbval reads "regex: (.*)" and "replace: (.*)" line pairs; an empty replacement would
        # need a trailing space, so the first character after the label is kept instead.
        lines += ["", f"[target-label-{lang}]", f"regex: (?m)^{label}\\s*(\\S)", "replace: \\1"]
    return "\n".join(lines) + "\n"


def grade_pass_line(grade_id: str, points: int, lang: str) -> str:
    """The line a graded cell prints when every hidden case passed."""
    return i18n.MESSAGES["grade_pass"][lang].format(grade_id=grade_id, points=points)


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
            msg = i18n.MESSAGES["your_code_here"][lang]
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


def _header(src: str, lang: str, kind: str) -> str:
    if kind != "exercises":
        return MESSAGES("generated_note", lang, src=src)
    name = Path(src).stem
    return MESSAGES(
        "generated_note_exercise",
        lang,
        src=src,
        chapter=name[:2],
        copy=f"work/{lang}/{name}.ipynb",
    )


def render(nb: nbformat.NotebookNode, src: str, lang: str, kind: str) -> nbformat.NotebookNode:
    """One generated notebook: ``kind`` in KINDS, ``lang`` in LANGS."""
    title = nb.metadata.get("ddp_lab", {}).get("title", {})
    cells = [nbformat.v4.new_markdown_cell(_header(src, lang, kind))]
    cells[0].metadata["tags"] = ["generated"]
    guarded = False
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
            if not guarded:
                guard = nbformat.v4.new_code_cell(kernel_guard_source())
                guard.metadata["tags"] = ["generated", "kernel-check"]
                cells.append(guard)
                guarded = True
            new.source = (
                stub_solutions(new.source, lang)
                if kind == "exercises"
                else strip_markers(new.source)
            )
            new.outputs, new.execution_count = [], None
            if "grade" in tags:
                meta = new.metadata
                grade_id, points = meta["grade_id"], int(meta["points"])
                line = (
                    target_line(grade_id, points, lang)
                    if kind == "exercises"
                    else grade_pass_line(grade_id, points, lang)
                )
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
        "kernelspec": {
            "display_name": KERNEL_DISPLAY_NAME,
            "language": "python",
            "name": KERNEL_NAME,
        },
        # What ipykernel reports, but its "version" (the Python's, which differs between
        # machines): JupyterLab writes that in on open, so a saved copy differs in that line.
        "language_info": {
            "codemirror_mode": {"name": "ipython", "version": 3},
            "file_extension": ".py",
            "mimetype": "text/x-python",
            "name": "python",
            "nbconvert_exporter": "python",
            "pygments_lexer": "ipython3",
        },
        "ddp_lab": {
            "generated_from": src,
            "kind": kind,
            "lang": lang,
            "title": title.get(lang, ""),
        },
    }
    # Stable cell ids: the same source always gives the same file. The kernel check is left
    # out of the numbering, so that adding it changed no other cell's id.
    i = 0
    for cell in out.cells:
        if "kernel-check" in cell.metadata.get("tags", []):
            cell.id = f"{kind[:2]}{lang}-kernel-check"
            continue
        cell.id = f"{kind[:2]}{lang}-{i:03d}"
        i += 1
    return out


def copy_exercise(
    chapter: str, lang: str, root: Path = ROOT, force: bool = False
) -> tuple[int, str]:
    """``ddp-lab exercise NN``: copy an exercise notebook to ``work/<lang>/`` (ignored by git),
    where the learner works, so that ``git pull`` never conflicts with their answers.

    Returns (exit code, message). The copy keeps its ``<lang>`` folder, from which the
    notebook takes its language.
    """
    import shutil

    folder = root / "exercises" / lang
    found = sorted(folder.glob(f"{chapter}*.ipynb")) if chapter else []
    if len(found) != 1:
        choices = ", ".join(p.stem for p in sorted(folder.glob("*.ipynb")))
        rel = folder.relative_to(root).as_posix()
        return 2, MESSAGES("no_exercise", lang, chapter=chapter, folder=rel, choices=choices)
    src = found[0]
    dst = root / "work" / lang / src.name
    shown = {"src": src.relative_to(root).as_posix(), "dst": dst.relative_to(root).as_posix()}
    if dst.exists() and not force:
        return 1, MESSAGES("copy_exists", lang, **shown)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return 0, MESSAGES("copied", lang, **shown)


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
    sanitize = root / SANITIZE_FILE
    if any(True for _ in sources(root)) and (
        not sanitize.exists() or sanitize.read_text(encoding="utf-8") != sanitize_config()
    ):
        sanitize.parent.mkdir(parents=True, exist_ok=True)
        sanitize.write_text(sanitize_config(), encoding="utf-8")
        written.append(sanitize)
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
    sanitize = root / SANITIZE_FILE
    if not sanitize.exists() or sanitize.read_text(encoding="utf-8") != sanitize_config():
        problems.append(f"stale: {SANITIZE_FILE}")
    for kind in KINDS:
        for path in sorted((root / kind).glob("*/*.ipynb")):
            if path not in expected:
                problems.append(f"orphan (no source): {path.relative_to(root)}")
    return problems
