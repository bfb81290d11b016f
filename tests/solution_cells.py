"""The solution notebooks reduced to what the lesson notebooks do not already run.

A solution notebook (``solutions/en/NN_*.ipynb``) is its chapter's lesson with the exercises
solved: most of its code cells are the lesson's, which test.sh runs in ``notebooks/en`` (and
``notebooks/zh``: the same code). Run whole, every chapter's lesson ran twice. Reduced, it
keeps the cells that are its own (the exercises, their graded cells, anything not in the
lesson) and the cells those need (``course.grading.needed``: the slice ``ddp-lab check``
runs), and nbval runs that. Where the slice cannot be known, the whole notebook is kept.

    python tests/solution_cells.py build/solutions-en   # writes build/solutions-en/NN_*.ipynb

The folder is two levels below the repository, as ``solutions/en`` is, so a cell's relative
paths mean the same. tests/course/test_solution_cells.py checks that every code cell of a
solution notebook runs in one of the two runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def reduced(solution: Path, lesson: Path) -> tuple[nbformat.NotebookNode, list[int]]:
    """``solution`` with only its own code cells and the cells they need; and the indices
    (among its code cells) of those kept."""
    from ddp_lab.course.grading.needed import needed_cells

    nb = nbformat.read(solution, as_version=4)
    taught = {c.source for c in nbformat.read(lesson, as_version=4).cells if c.cell_type == "code"}
    code = [c for c in nb.cells if c.cell_type == "code"]
    own = [i for i, c in enumerate(code) if c.source not in taught]
    kept = needed_cells([c.source for c in code], own)  # sorted, ``own`` included
    if kept is None:  # a cell whose names cannot be known: all of them
        kept = list(range(len(code)))
    nb.cells = [code[i] for i in kept]
    return nb, kept


def write_all(out: Path, lang: str = "en") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ipynb"):
        old.unlink()
    written = []
    for solution in sorted((ROOT / "solutions" / lang).glob("*.ipynb")):
        nb, _ = reduced(solution, ROOT / "notebooks" / lang / solution.name)
        nbformat.write(nb, out / solution.name)
        written.append(out / solution.name)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if len(target.resolve().relative_to(ROOT).parts) != 2:
        sys.exit(f"{target}: must be two levels below {ROOT}, as solutions/en is")
    for path in write_all(target):
        print(f"wrote {path}")
