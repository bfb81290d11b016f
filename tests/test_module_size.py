"""No module of ddp_lab is over 450 lines (issue 42: rooms a newcomer can read whole)."""

from __future__ import annotations

from pathlib import Path

import ddp_lab

PACKAGE = Path(ddp_lab.__file__).parent
LIMIT = 450


def long_modules(package: Path = PACKAGE) -> dict[str, int]:
    lines = {
        str(p.relative_to(package)): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(package.rglob("*.py"))
    }
    return {name: n for name, n in lines.items() if n > LIMIT}


def test_the_count_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "long.py").write_text("x = 1\n" * (LIMIT + 1), encoding="utf-8")
    (tmp_path / "short.py").write_text("x = 1\n" * LIMIT, encoding="utf-8")
    assert long_modules(tmp_path) == {"deep/long.py": LIMIT + 1}
    assert len((PACKAGE / "__init__.py").read_text().splitlines()) < LIMIT


def test_no_module_is_over_450_lines() -> None:
    # No exceptions: a module that grows past the limit is split along a seam it has.
    assert long_modules() == {}
