"""The cells a notebook's graded cells need: a backward slice over names, for ``ddp-lab check``.

``ddp-lab check`` (the learner's self-check) runs only the code cells that bind a name the
graded cells use, directly or through another kept cell (a function's globals count), and
skips the rest: benchmark sweeps, deadlock demos, figures. ``ddp-lab grade`` still runs every
cell. The slice is conservative and static (``ast`` on IPython's transformed source):

- a cell whose names cannot be known (``exec``, ``eval``, ``globals()``, ``import *``,
  ``get_ipython``, a line magic that binds, a syntax error) makes the slice give up: every
  cell runs;
- a cell magic (``%%ddp``, ``%%ranks``) binds nothing in the kernel and is skipped unless it
  is ``%%capture`` style (then the slice gives up too);
- a kept cell keeps every earlier cell that binds one of the names it reads.

How it differs from a program slicer (e.g. nbgather's): it works on whole cells and names
only, no data flow inside a cell; a wrong guess can only keep too much, or, where a cell
reaches a name by a way ``ast`` cannot see, make ``check`` report a ``NameError``, after
which ``check`` runs the whole notebook (``grader.check_main``).
"""

from __future__ import annotations

import ast

# Calls and names that reach the namespace in ways names cannot show.
_OPAQUE = {"exec", "eval", "globals", "locals", "vars", "get_ipython", "__import__", "setattr"}
_HARMLESS_LINE_MAGICS = {"matplotlib", "load_ext", "config", "ranks", "pip"}
# Cell magics whose body runs in the kernel's namespace.
_KERNEL_CELL_MAGICS = {"capture", "time", "timeit", "prun", "debug", "python", "writefile"}


class Opaque(Exception):
    """A cell whose names cannot be known statically."""


def _python(source: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds at the top level, names it reads anywhere); ``Opaque`` if unknown."""
    stripped = source.lstrip()
    if stripped.startswith("%%"):
        magic = stripped[2:].split(None, 1)[0] if stripped[2:].split() else ""
        if magic in _KERNEL_CELL_MAGICS:
            raise Opaque(magic)
        return set(), set()  # runs elsewhere (ranks, a shell): binds nothing here
    try:
        tree = ast.parse(_python(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Opaque(str(exc)) from None
    except Exception as exc:  # noqa: BLE001  # IPython's transformer fails on some text
        # ('""""""=%\\': an IndexError in its assignment-magic rule), which killed the
        # verdict process of ``ddp-lab check``: such a cell's names are unknown.
        raise Opaque(f"{type(exc).__name__}: {exc}") from None
    binds: set[str] = set()
    reads: set[str] = set()
    allowed = _harmless_magics(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in _OPAQUE and id(node) not in allowed:
                raise Opaque(node.id)
            (reads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
        elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            raise Opaque("import *")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                binds.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            binds.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            binds.update(node.names)
    # A name bound inside a function is not a top-level binding, but keeping a cell for it
    # costs only time: the slice stays conservative.
    return binds, reads


def _harmless_magics(tree: ast.AST) -> set[int]:
    """ids of the ``get_ipython`` names of line magics that bind nothing (``%matplotlib``,
    ``%ranks start``, ``!cmd``): IPython turns them into ``get_ipython().run_line_magic``."""
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "get_ipython"
            and (
                node.func.attr in ("system", "getoutput")
                or (
                    node.func.attr == "run_line_magic"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in _HARMLESS_LINE_MAGICS
                )
            )
        ):
            out.add(id(node.func.value.func))
    return out


def needed_cells(sources: list[str], graded: list[int]) -> list[int] | None:
    """Indices (into ``sources``, in order) of the cells to run before and at the graded
    cells ``graded``; None when the slice gives up (every cell must run)."""
    if not graded:
        return None
    try:
        info = [names(s) for s in sources]
    except Opaque:
        return None
    keep = set(graded)
    want: set[str] = set()
    for g in graded:
        want |= info[g][1]
    last = max(graded)
    changed = True
    while changed:  # to a fixed point: a kept cell may need an earlier one's names
        changed = False
        for i in range(last, -1, -1):
            if i in keep:
                continue
            if info[i][0] & want:
                keep.add(i)
                want |= info[i][1]
                changed = True
    return sorted(keep)
