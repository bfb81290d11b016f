"""Every learner-facing message is in a registered table, in both languages, same placeholders.

The convention (docs/AUTHORING.md, "Messages"): a module that shows text to learners declares
``MESSAGES = Messages(__name__, {key: {"en": ..., "zh": ...}})``. Importing every module of
the package fills ``i18n.TABLES``; a scan of the source finds Chinese text outside a table.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import string
from pathlib import Path

import pytest

import ddp_lab
from ddp_lab.course import i18n

PACKAGE = Path(ddp_lab.__file__).parent
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def _import_all() -> list[str]:
    names = [info.name for info in pkgutil.walk_packages(ddp_lab.__path__, "ddp_lab.")]
    for name in names:
        importlib.import_module(name)
    return names


MODULES = _import_all()
ENTRIES = sorted((owner, key) for owner, table in i18n.TABLES.items() for key in table)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_table(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Messages"


def _fields(text: str) -> set[tuple[str, str | None, str | None]]:
    return {(f, conv, spec) for _, f, spec, conv in string.Formatter().parse(text) if f is not None}


def test_the_scan_sees_every_module_and_the_registry_every_table():
    files = sorted(PACKAGE.rglob("*.py"))
    assert {_module_name(p) for p in files} - {"ddp_lab"} == set(MODULES)
    declared = {
        _module_name(p) for p in files if any(map(_is_table, ast.walk(ast.parse(p.read_text()))))
    }
    assert declared == set(i18n.TABLES)
    assert len(ENTRIES) > 200  # the package has a few hundred messages; an empty scan is a bug


def test_no_chinese_text_outside_a_message_table():
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inside = {id(n) for t in ast.walk(tree) if _is_table(t) for n in ast.walk(t)}
        stray += [
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value[:40]!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and CJK.search(node.value)
            and id(node) not in inside
        ]
    assert stray == []


@pytest.mark.parametrize("owner,key", ENTRIES, ids=[f"{o}:{k}" for o, k in ENTRIES])
def test_message_has_both_languages_with_same_fields(owner, key):
    entry = i18n.TABLES[owner][key]
    assert set(entry) == set(i18n.LANGUAGES)
    assert all(isinstance(entry[lang], str) and entry[lang].strip() for lang in i18n.LANGUAGES)
    assert _fields(entry["en"]) == _fields(entry["zh"])
    assert CJK.search(entry["zh"]) or entry["zh"] == entry["en"]  # zh is Chinese (or a symbol)


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
        assert i18n.t("your_code_here") == "在这里写你的代码"
        i18n.set_language("en")
        assert i18n.t("your_code_here") == "your code here"
        with pytest.raises(ValueError, match="语言必须是"):
            i18n.set_language("fr")
    finally:
        i18n.set_language("en")


def test_a_table_formats_in_the_current_language_or_the_one_asked_for():
    table = i18n.Messages("tests.example", {"hi": {"en": "hi {name}", "zh": "你好 {name}"}})
    try:
        assert table.pair("hi", name="A") == ("hi A", "你好 A")
        assert table("hi", "zh", name="B") == "你好 B"
        i18n.set_language("zh")
        assert table("hi", name="C") == "你好 C"
    finally:
        i18n.set_language("en")
        del i18n.TABLES["tests.example"]
