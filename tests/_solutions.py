"""The released solutions' code, read from the built solution notebooks
(``solutions/<lang>/NN_*.ipynb``): a test grades the code a learner is given as the
answer, not a copy of it that could drift (and, the same way, the stubs of the released
unsolved notebooks, ``exercises/<lang>/``: tests/course/test_exercises.py). Imported as ``from _solutions import ...``
(``tests/`` is on sys.path, as for ``conftest``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def _defines(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def graded_solution(grade_id: str, lang: str = "en", kind: str = "solutions") -> tuple[Any, ...]:
    """What the solution notebook's graded cell of ``grade_id`` passes to ``dl.grade``
    (``kind="exercises"``: the released, unsolved notebook's, its stubs).

    The notebook's top-level imports run first, then each cell above the graded cell that
    defines one of the graded names (the last such cell per name), in a namespace of its
    own whose module is not importable: cloudpickle sends the objects by value, as it sends
    a notebook's code.
    """
    chapter = grade_id.split(".", 1)[0]
    (path,) = (ROOT / kind / lang).glob(f"{chapter}_*.ipynb")
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    graded = next(i for i, c in enumerate(cells) if c.metadata.get("grade_id") == grade_id)
    call = ast.parse(cells[graded].source).body[0].value  # dl.grade("NN.x", name, ...)
    assert isinstance(call, ast.Call) and ast.literal_eval(call.args[0]) == grade_id
    names = [arg.id for arg in call.args[1:]]

    trees: dict[int, ast.Module] = {}
    for i, cell in enumerate(cells[:graded]):
        try:
            trees[i] = ast.parse(cell.source)
        except SyntaxError:  # a cell magic (%%ddp, %%ranks): not Python
            continue
    namespace: dict[str, Any] = {"__name__": f"_solution_{chapter}"}
    imports = [
        node
        for tree in trees.values()
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    exec(compile(ast.Module(imports, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    defining = sorted({max(i for i, t in trees.items() if _defines(t, n)) for n in names})
    for i in defining:
        exec(compile(cells[i].source, f"{path.name}, cell {i}", "exec"), namespace)  # noqa: S102
    return tuple(namespace[n] for n in names)
