"""No import circles among ddp_lab's modules (read from the source: every import, lazy ones too).

``import ddp_lab`` (the package's ``__init__``, which imports the public names) is left out:
modules may use ``dl.`` names at run time. Old paths (``ddp_lab/_moved.py``) count as their
new place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ddp_lab
from ddp_lab import _moved

PACKAGE = Path(ddp_lab.__file__).parent


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(name: str) -> str | None:
    name = _moved.new_name(name) or name
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name if name and name != "ddp_lab" else None


def imports(module: str) -> set[str]:
    """The ddp_lab modules that ``module`` imports, anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_target(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(_target(f"{base}.{a.name}") if base else None)
    return {m for m in found if m and m != module}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: imports(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def test_the_scan_sees_imports():
    assert "ddp_lab.i18n" in imports("ddp_lab.ring")
    assert "ddp_lab.runtime.launcher" in imports("ddp_lab.runtime.magic")


def test_no_import_cycles():
    assert cycles() == []


def test_the_foundation_imports_nothing_from_ddp_lab():
    assert imports("ddp_lab.i18n") == set()
