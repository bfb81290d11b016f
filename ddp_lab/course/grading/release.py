"""Stage 2 of grading, match: where each graded cell of the release is in a submission.

The release (the exercise notebook the class was given) says what is graded: its graded
cells (code cells tagged ``grade`` with ``grade_id`` and ``points`` metadata) and its exercise
cells. A submission's graded cell whose code changed (its syntax tree: a comment or spacing is
not a change), that is missing, copied, or that moved relative to the other graded and
exercise cells scores 0 ("tampered") and is not run; the others are run (stages 3 and 4,
``execute``). ``reference_for`` rebuilds the release of a learner's own notebook for
``ddp-lab check``.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

import nbformat


@dataclass
class Exercise:
    """A graded cell of the release: what it is worth and what it must print."""

    grade_id: str
    points: int
    cell: nbformat.NotebookNode


@dataclass
class Release:
    """What a class is graded against, known before any submission is read: the released
    exercise notebook, its language and its graded cells (``Release.of``)."""

    notebook: nbformat.NotebookNode
    lang: str
    exercises: list[Exercise]

    @classmethod
    def of(cls, notebook: nbformat.NotebookNode) -> Release:
        return cls(notebook, language_of(notebook), exercises_of(notebook))


@dataclass
class Match:
    """Stage 2's value: the submission's language, each graded cell found (grade_id -> its
    position in the submission) and each one tampered with (grade_id -> reason key)."""

    lang: str
    found: dict[str, int]
    tampered: dict[str, str]


def _norm(source: str) -> str:
    # Editors add or drop trailing spaces and newlines; that is not tampering.
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def same_code(a: str, b: str) -> bool:
    """Whether two cells run the same code: equal syntax trees (a comment, spacing or a
    line break inside parentheses is no change), or equal text where either is not Python
    (a cell magic)."""
    if _norm(a) == _norm(b):
        return True
    if max(len(a), len(b)) > 4 * min(len(a), len(b)) + 1000:  # comments cannot explain that
        return False
    try:
        return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def is_graded(cell: nbformat.NotebookNode) -> bool:
    """Whether ``cell`` is a graded cell (a code cell with ``grade_id`` metadata)."""
    return cell.cell_type == "code" and "grade_id" in cell.metadata


def exercises_of(release: nbformat.NotebookNode) -> list[Exercise]:
    """The graded cells of a released exercise notebook, in order."""
    return [
        Exercise(str(c.metadata["grade_id"]), int(c.metadata.get("points", 0)), c)
        for c in release.cells
        if is_graded(c)
    ]


def language_of(nb: nbformat.NotebookNode, default: str = "en") -> str:
    lang = str(nb.metadata.get("ddp_lab", {}).get("lang", default))[:2]
    return lang if lang in ("en", "zh") else default


def match(release: Release, sub: nbformat.NotebookNode) -> Match:
    """Stage 2: the submission's language and where its graded cells are (``locate``)."""
    found, tampered = locate(release.notebook, sub)
    return Match(language_of(sub, release.lang), found, tampered)


def locate(
    release: nbformat.NotebookNode, sub: nbformat.NotebookNode
) -> tuple[dict[str, int], dict[str, str]]:
    """Find each graded cell of ``release`` in ``sub``.

    Returns (grade_id -> index of its cell in ``sub``, grade_id -> tampering reason key).
    A graded cell is found by its ``grade_id`` metadata or, when a tool dropped the
    metadata, by identical code. Exercise cells are found by cell id (JupyterLab keeps ids
    when cells are edited or moved); the order of all found cells must match the release.
    """
    found: dict[str, int] = {}
    tampered: dict[str, str] = {}
    claimed = {str(c.metadata["grade_id"]) for c in sub.cells if is_graded(c)}
    for ex in exercises_of(release):
        hits = [
            i
            for i, c in enumerate(sub.cells)
            if c.cell_type == "code" and str(c.metadata.get("grade_id", "")) == ex.grade_id
        ]
        if not hits and ex.grade_id not in claimed:
            hits = [
                i
                for i, c in enumerate(sub.cells)
                if c.cell_type == "code"
                and "grade_id" not in c.metadata
                and same_code(c.source, ex.cell.source)
            ]
        if not hits:
            tampered[ex.grade_id] = "deleted"
        elif len(hits) > 1:
            tampered[ex.grade_id] = f"dup:{len(hits)}"
        elif not same_code(sub.cells[hits[0]].source, ex.cell.source):
            tampered[ex.grade_id] = "changed"
        else:
            found[ex.grade_id] = hits[0]
    # Key cells in release order: graded cells and exercise code cells (by id).
    ids = {c.get("id"): i for i, c in enumerate(sub.cells) if c.cell_type == "code" and c.get("id")}
    keys: list[tuple[str | None, int]] = []  # (grade_id or None, position in sub)
    for c in release.cells:
        if is_graded(c) and str(c.metadata["grade_id"]) in found:
            keys.append((str(c.metadata["grade_id"]), found[str(c.metadata["grade_id"])]))
        elif (
            c.cell_type == "code"
            and "exercise" in c.metadata.get("tags", [])
            and c.get("id") in ids
        ):
            keys.append((None, ids[c.get("id")]))
    for r, (gid, pos) in enumerate(keys):
        if gid is not None and any(
            (r2 < r) != (pos2 < pos) for r2, (_, pos2) in enumerate(keys) if r2 != r
        ):
            tampered[gid] = "moved"
            del found[gid]
    return found, tampered


def reference_for(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The released exercise notebook ``nb`` came from: rebuilt from its chapter source when
    this checkout has it (learners edit the released file in place), else ``nb`` itself."""
    meta = nb.metadata.get("ddp_lab", {})
    from ddp_lab.course import build

    src = build.ROOT / str(meta.get("generated_from", "-"))
    if meta.get("generated_from") and src.is_file():
        target = build.ROOT / "exercises" / language_of(nb) / (src.stem + ".ipynb")
        return build.targets(src).get(target, nb)
    ref = copy.deepcopy(nb)  # no source: trust the notebook's own graded cells
    for cell in ref.cells:
        if is_graded(cell):
            line = build.grade_pass_line(
                str(cell.metadata["grade_id"]), int(cell.metadata.get("points", 0)), language_of(nb)
            )
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=line + "\n")]
            cell.execution_count = 1
    return ref
