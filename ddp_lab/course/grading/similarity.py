"""A similarity report for the instructor: each exercise's code vs the package's reference
implementation and vs the other submissions, with ``copydetect`` (MOSS-like winnowing).

The learner's code of an exercise is their code cells before its graded cell that differ from
the release's (as ``course.scan`` reads it), its graded cell found by the release's source
(never by the submission's metadata). Pairs at or above ``THRESHOLD`` of either side's
fingerprinted tokens are listed in ``similarity.md`` in the grade's output folder, every
name and id as a Markdown code span (``report.code_span``). The report flags, it never
changes a grade: copying is for the instructor to judge.

Without copydetect installed (``pip install copydetect``) the report says so and lists nothing.
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import nbformat

from ddp_lab.course.grading.report import MAX_NAME, code_span
from ddp_lab.i18n import _t

THRESHOLD = 0.6
K, WINDOW = 20, 3  # copydetect's noise threshold (tokens per k-gram) and winnowing window
# grade_id -> the package's reference implementation (module, names).
REFERENCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "03.balanced_chunks": ("ddp_lab.parallel.balanced", ("balanced_chunk_sizes",)),
    "05.ring": ("ddp_lab.ring", ("ring_all_reduce",)),
    "07.naive_ddp": ("ddp_lab.ddp", ("NaiveDDP",)),
    "07.bucketed": ("ddp_lab.bucketed_ddp", ("BucketedDDP",)),
    "10.sharded_optimizer": ("ddp_lab.zero", ("ShardedOptimizer",)),
    "10.bf16_hook": ("ddp_lab.comm_hooks", ("my_bf16_hook",)),
    "12.one_f_one_b": ("ddp_lab.pipeline_1f1b", ("one_f_one_b_order",)),
}
REFERENCE = "(ddp_lab)"


def exercise_code(release: nbformat.NotebookNode, sub: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> the learner's own code before its graded cell (cells unlike the release's).

    The exercise ids come from the release: a cell of the submission is the graded cell of
    ``grade_id`` when its source is the release's graded cell (whatever its metadata says:
    the submission's metadata is the learner's to write)."""
    graded = {
        str(c.source): str(c.metadata.get("grade_id"))
        for c in release.cells
        if c.cell_type == "code" and c.metadata.get("grade_id")
    }
    released = {str(c.source) for c in release.cells if c.cell_type == "code"}
    out: dict[str, str] = {}
    mine: list[str] = []
    for cell in sub.cells:
        if cell.cell_type != "code":
            continue
        source = str(cell.source)
        grade_id = graded.get(source)
        if grade_id:
            if grade_id not in out:
                out[grade_id] = "\n\n".join(mine)
            mine = []
        elif source not in released:
            mine.append(source)
    return out


def reference_code(grade_id: str) -> str:
    """The package's reference implementation of ``grade_id``, or "" if it has none."""
    import importlib

    if grade_id not in REFERENCES:
        return ""
    module, names = REFERENCES[grade_id]
    try:
        mod = importlib.import_module(module)
        return "\n\n".join(inspect.getsource(getattr(mod, n)) for n in names)
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


def pairs(codes: dict[str, str], threshold: float = THRESHOLD) -> list[tuple[str, str, float]]:
    """(a, b, similarity) for every pair of ``codes`` at or above ``threshold``."""
    from copydetect import CodeFingerprint, compare_files

    prints = {}
    for name, text in codes.items():
        if text.strip():
            try:
                prints[name] = CodeFingerprint(
                    "code.py", K, WINDOW, language="python", fp=io.StringIO(text)
                )
            except Exception:  # noqa: BLE001, S112  # code the tokenizer cannot read: skip it
                continue
    names = sorted(prints)
    found = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if not prints[a].token_coverage or not prints[b].token_coverage:
                continue
            _, (sim_a, sim_b), _ = compare_files(prints[a], prints[b])
            score = float(max(sim_a, sim_b))
            if score >= threshold:
                found.append((a, b, score))
    return sorted(found, key=lambda p: -p[2])


def write_report(
    release: nbformat.NotebookNode,
    subs: dict[str, nbformat.NotebookNode],
    out: Path,
    lang: str = "en",
    threshold: float = THRESHOLD,
) -> Path:
    """Write ``out/similarity.md`` for the submissions ``subs`` (student -> notebook)."""
    path = out / "similarity.md"
    lines = [("# " + _t("Similarity report", lang)), ""]
    try:
        import copydetect  # noqa: F401
    except ImportError:
        path.write_text(
            "\n".join(
                [
                    *lines,
                    _t(
                        "copydetect is not installed (pip install copydetect): no similarity "
                        "report.",
                        lang,
                    ),
                    "",
                ]
            ),
            encoding="utf-8",
        )
        return path
    lines += [
        _t(
            "Pairs whose code for an exercise overlaps by at least {threshold:.0%} "
            "(copydetect, winnowing). `(ddp_lab)` is the package's reference "
            "implementation. Nothing here changes a grade: look at the code before "
            "you decide.",
            lang,
            threshold=threshold,
        ),
        "",
    ]
    by_exercise: dict[str, dict[str, str]] = {}
    for name, nb in subs.items():
        for grade_id, text in exercise_code(release, nb).items():
            by_exercise.setdefault(grade_id, {})[name] = text
    any_pair = False
    for grade_id in sorted(by_exercise):
        codes = dict(by_exercise[grade_id])
        reference = reference_code(grade_id)
        if reference:
            codes[REFERENCE] = reference
        found = pairs(codes, threshold)
        if found:
            any_pair = True
            lines += [f"## {code_span(grade_id, MAX_NAME)}", ""]
            lines += [
                f"- {code_span(a, MAX_NAME)} ~ {code_span(b, MAX_NAME)}: {score:.0%}"
                for a, b, score in found
            ]
            lines.append("")
    if not any_pair:
        lines += [_t("No pair above the threshold.", lang), ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
