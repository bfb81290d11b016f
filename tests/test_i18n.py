"""Every learner-facing message is in the zh catalog, with the same placeholders.

The convention (docs/AUTHORING.md, "Messages"): the English text is the msgid, inline at the
call (``_t("... {field} ...", field=...)``, ``_tp``, ``pair``, ``pair_p``, ``N_`` of
ddp_lab/i18n.py); the Chinese text is in ddp_lab/locale/zh/LC_MESSAGES/ddp_lab.po, compiled
to ddp_lab.mo. Babel's extractor finds the calls; a scan of the source finds Chinese text
outside the catalog.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import string
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import read_mo, write_mo
from babel.messages.pofile import read_po

import ddp_lab
from ddp_lab import i18n

PACKAGE = Path(ddp_lab.__file__).parent
PO = PACKAGE / "locale/zh/LC_MESSAGES/ddp_lab.po"
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
# The teaching modules: a learner reads them; they open on their docstring and algorithm.
TEACHING = [
    "ring.py", "sampler.py", "ddp.py", "buckets.py", "bucketed_ddp.py", "zero.py", "fsdp.py",
    "collectives.py", "costs.py", "comm_hooks.py", *(f"parallel/{p.name}" for p in
    sorted((PACKAGE / "parallel").glob("*.py"))),
]  # fmt: skip


def _catalog():
    with PO.open("rb") as f:
        return read_po(f, locale="zh", domain="ddp_lab")


CATALOG = _catalog()
ENTRIES = sorted(((m.context or "", m.id) for m in CATALOG if m.id), key=str)


def _extracted() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for filename, lineno, message, _, context in extract_from_dir(
        str(PACKAGE), method_map=[("**.py", "python")], keywords=i18n.BABEL_KEYWORDS
    ):
        found.setdefault((context or "", message), []).append(f"{filename}:{lineno}")
    return found


EXTRACTED = _extracted()


def _fields(text: str) -> set[tuple[str, str | None, str | None]]:
    return {(f, conv, spec) for _, f, spec, conv in string.Formatter().parse(text) if f is not None}


def test_the_catalog_and_the_extraction_see_every_message():
    assert len(ENTRIES) > 300  # the package has a few hundred messages; an empty scan is a bug
    missing = sorted(set(EXTRACTED) - set(ENTRIES))
    assert missing == [], [f"{EXTRACTED[k][0]}: {k}" for k in missing]
    stale = sorted(set(ENTRIES) - set(EXTRACTED))
    assert stale == []  # in the .po but used nowhere


@pytest.mark.parametrize("ctx,msgid", ENTRIES, ids=[f"{c}:{m[:40]}" for c, m in ENTRIES])
def test_message_has_chinese_with_the_same_fields(ctx, msgid):
    m = CATALOG.get(msgid, context=ctx or None)
    assert m.string and m.string.strip() and not m.fuzzy
    assert _fields(m.id) == _fields(m.string)
    assert CJK.search(m.string) or m.string == m.id  # zh is Chinese (or a symbol)


def test_the_committed_mo_is_the_compiled_po():
    buf = io.BytesIO()
    write_mo(buf, CATALOG)
    buf.seek(0)
    fresh = {(m.context, m.id): m.string for m in read_mo(buf) if m.id}
    with PO.with_suffix(".mo").open("rb") as f:
        committed = {(m.context, m.id): m.string for m in read_mo(f) if m.id}
    assert committed == fresh, "run: pybabel compile -D ddp_lab -d ddp_lab/locale"


def test_the_catalog_is_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    patterns = meta["tool"]["setuptools"]["package-data"]["ddp_lab"]
    for path in (PO, PO.with_suffix(".mo")):
        rel = str(path.relative_to(PACKAGE))
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), rel


def test_no_chinese_text_outside_the_catalog():
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        stray += [
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value[:40]!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and CJK.search(node.value)
        ]
    assert stray == []


def test_no_message_table_is_left():
    left = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Messages", "t")
    ]
    assert left == []  # convert with the codemod (docs/AUTHORING.md, "Messages")


@pytest.mark.parametrize("name", TEACHING)
def test_a_teaching_module_opens_on_its_docstring_then_its_code(name):
    tree = ast.parse((PACKAGE / name).read_text())
    assert ast.get_docstring(tree)
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert not {m for m in imported if m.startswith("ddp_lab.course")}
    # no table of texts before the first function or class
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            break
        calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call)]
        assert not any(getattr(c.func, "id", None) in i18n.BABEL_KEYWORDS for c in calls), (
            f"{name}:{stmt.lineno}"
        )


def _tr_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for path in sorted((PACKAGE.parent / "chapters").glob("*.py")):
        tree = ast.parse(path.read_text())  # jupytext percent scripts are Python
        calls += [
            (f"{path.name}:{node.lineno}", node)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("dl.tr", "tr")
        ]
    return calls


def test_chapter_code_gives_dl_tr_both_languages():
    # Chapter code cells (shared by both notebooks) pick their labels with dl.tr(en=, zh=);
    # the chapter source is their table.
    calls = _tr_calls()
    assert len(calls) > 10
    for where, call in calls:
        args = dict(zip(("en", "zh"), call.args, strict=False))
        args.update({k.arg: k.value for k in call.keywords})
        assert set(args) == {"en", "zh"}, where
        en, zh = (ast.unparse(args[lang]) for lang in ("en", "zh"))
        assert en.strip("'\"f ") and zh.strip("'\"f "), where
        if isinstance(args["zh"], ast.Constant | ast.JoinedStr):
            assert CJK.search(zh) or zh == en, where


def test_switch_language():
    try:
        i18n.set_language("zh")
        assert i18n._t("your code here") == "在这里写你的代码"
        i18n.set_language("en")
        assert i18n._t("your code here") == "your code here"
        with pytest.raises(ValueError, match="语言必须是") as info:
            i18n.set_language("fr")
        assert "language must be one of" in str(info.value)  # both languages
    finally:
        i18n.set_language("en")


def test_lookups_format_in_the_current_language_or_the_one_asked_for():
    text = "rank {rank} was killed by signal {signal}"
    assert i18n.pair(text, rank=1, signal="SIGKILL") == (
        "rank 1 was killed by signal SIGKILL",
        "rank 1 被信号 SIGKILL 杀死",
    )
    assert i18n._t(text, "zh", rank=2, signal="X") == "rank 2 被信号 X 杀死"
    texts = {"killed": i18n.N_(text)}
    assert i18n.lookup(texts, "killed", "zh", rank=4, signal="X") == "rank 4 被信号 X 杀死"
    try:
        i18n.set_language("zh")
        assert i18n._t(text, rank=3, signal="X") == "rank 3 被信号 X 杀死"
        assert i18n._t("no such message {x}", x=1) == "no such message 1"  # English fallback
    finally:
        i18n.set_language("en")


def test_a_msgctxt_picks_its_own_chinese_text():
    with_ctx = [m for m in CATALOG if m.id and m.context]
    assert with_ctx  # one English text, two Chinese ones: see the .po
    for m in with_ctx:
        fields = {name: "x" for name, _, _ in _fields(m.id)}
        assert i18n._tp(m.context, m.id, "zh", **fields) == m.string.format(**fields)
        assert i18n.pair_p(m.context, m.id, **fields) == (
            m.id.format(**fields),
            m.string.format(**fields),
        )
