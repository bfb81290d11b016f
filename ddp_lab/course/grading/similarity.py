"""A similarity report for the instructor: each exercise's code vs the package's reference
implementation, vs torch's own implementation where torch has one (the one the exercise
refuses at run time, ``course.grading.guard``: its source text copied into a cell is the
learner's code to the grader, and shows here), and vs the other submissions, with
``copydetect`` (MOSS-like winnowing).

The learner's code of an exercise is their code cells before its graded cell that differ from
the release's (as ``course.grading.scan`` reads it), its graded cell found by the release's source
(never by the submission's metadata). Pairs at or above ``THRESHOLD`` of either side's
fingerprinted tokens are listed in ``similarity.md`` in the grade's output folder, every
name and id as a Markdown code span (``report.code_span``). The report flags, it never
changes a grade: copying is for the instructor to judge.

Its cost is bounded per learner: a learner's code past ``MAX_CHARS`` is not compared ("too
large"); fingerprinting and comparing run in a child process (``python -m
ddp_lab.course.grading.similarity``, text in and numbers out as JSON, under ``RLIMIT_AS``),
where each learner's fingerprints get ``CPU_SECONDS`` of CPU (``RLIMIT_CPU``'s soft limit,
moved before each learner; SIGXCPU cuts that learner alone) and the whole child a wall-clock
limit. A learner cut is listed as "not compared"; the grader's own process never tokenizes a
learner's text.

Without copydetect installed (``pip install copydetect``) the report says so and lists nothing.
"""

from __future__ import annotations

import inspect
import io
import json
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

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
# grade_id -> torch's implementation of what the exercise asks for (module, names).
TORCH_REFERENCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "06.indices": ("torch.utils.data.distributed", ("DistributedSampler",)),
    "10.sharded_optimizer": (
        "torch.distributed.optim.zero_redundancy_optimizer",
        ("ZeroRedundancyOptimizer",),
    ),
    "10.bf16_hook": (
        "torch.distributed.algorithms.ddp_comm_hooks.default_hooks",
        ("_compress_hook", "bf16_compress_hook"),
    ),
    "12.one_f_one_b": ("torch.distributed.pipelining.schedules", ("Schedule1F1B",)),
}
TORCH = "(torch)"
# The course's own solution of the exercise (solutions/<lang>/, beside the package when the
# course is a checkout): a learner who hands it in shows as a pair with it, not only as a
# crowd of pairs with every classmate who did the same.
SOLUTION = "(solution)"
SOURCES = (REFERENCE, TORCH, SOLUTION)  # the report's names that are not learners
MAX_CHARS = 200_000  # a learner's own code over all exercises; an honest one is a few KiB
CPU_SECONDS = 5  # each learner's fingerprints, in the child
MEMORY_BYTES = 2 * 2**30  # the child's address space
WALL_SECONDS = 120.0  # the whole child (plus 1 s per learner); past it, no pairs at all
TOO_LARGE, TOO_SLOW = "too large", "took too long"
# A concept check's answers (``NN.concepts``: a dict of letters and numbers) are alike in every
# learner who got them right: listed, they buried the pairs that mean something.
CONCEPTS = ".concepts"


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


def reference_code(grade_id: str, references: dict = REFERENCES) -> str:
    """The package's reference implementation of ``grade_id`` (``references``: or torch's,
    ``TORCH_REFERENCES``), or "" if it has none."""
    import importlib

    if grade_id not in references:
        return ""
    module, names = references[grade_id]
    try:
        mod = importlib.import_module(module)
        return "\n\n".join(inspect.getsource(getattr(mod, n)) for n in names)
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


def solution_code(release: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> the course's solution code of ``release``'s exercises: the solution
    notebook (``solutions/en``; code cells are the same in both languages) whose graded cells
    are the release's, read as a learner's submission is. Empty where the course has no
    ``solutions/`` (a copy handed to learners without it, an installed package)."""
    folder = Path(__file__).resolve().parents[3] / "solutions" / "en"
    wanted = {
        str(c.metadata.get("grade_id"))
        for c in release.cells
        if c.cell_type == "code" and c.metadata.get("grade_id")
    }
    for path in sorted(folder.glob("*.ipynb")) if wanted else []:
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001, S112  # not ours to judge here
            continue
        code = exercise_code(release, nb)
        if code and set(code) <= wanted:
            return code
    return {}


def pairs(codes: dict[str, str], threshold: float = THRESHOLD) -> list[tuple[str, str, float]]:
    """(a, b, similarity) for every pair of ``codes`` at or above ``threshold``, here, with
    no bound (``compare`` is the bounded road the report takes)."""
    return _pairs(_fingerprints(codes, None)[0], threshold)


def _fingerprints(codes: dict[str, str], cpu: float | None) -> tuple[dict, list[str]]:
    """name -> copydetect fingerprint of ``codes``; with ``cpu``, each name gets that many
    seconds of CPU (``RLIMIT_CPU``, SIGXCPU); the names cut are returned too."""
    from copydetect import CodeFingerprint

    prints, cut = {}, []
    for name, text in codes.items():
        if not text.strip():
            continue
        if cpu is not None:
            used = resource.getrusage(resource.RUSAGE_SELF)
            spent = used.ru_utime + used.ru_stime
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            soft = int(spent + cpu) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))
        try:
            prints[name] = CodeFingerprint(
                "code.py", K, WINDOW, language="python", fp=io.StringIO(text)
            )
        except _OverBudget:
            cut.append(name)
        except Exception:  # noqa: BLE001, S112  # code the tokenizer cannot read: skip it
            continue
        finally:
            if cpu is not None:
                resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    return prints, cut


def _pairs(prints: dict, threshold: float) -> list[tuple[str, str, float]]:
    from copydetect import compare_files

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


class _OverBudget(Exception):
    pass


def _over_budget(signum: int, frame: Any) -> None:
    raise _OverBudget


def compare(
    by_exercise: dict[str, dict[str, str]],
    threshold: float = THRESHOLD,
    max_chars: int = MAX_CHARS,
    cpu_seconds: float = CPU_SECONDS,
) -> tuple[dict[str, list[tuple[str, str, float]]], dict[str, str]]:
    """Pairs per exercise (``by_exercise``: grade_id -> name -> code) and the learners not
    compared (name -> ``TOO_LARGE`` / ``TOO_SLOW``), computed in a child process with each
    learner's cost bounded (see the module docstring). A child that fails or runs past its
    wall-clock limit gives no pairs and every learner ``TOO_SLOW``."""
    size: dict[str, int] = {}
    for codes in by_exercise.values():
        for name, text in codes.items():
            size[name] = size.get(name, 0) + len(text)
    cut = {name: TOO_LARGE for name, n in size.items() if n > max_chars and name not in SOURCES}
    kept = {
        grade_id: {n: t for n, t in codes.items() if n not in cut}
        for grade_id, codes in by_exercise.items()
    }
    request = {"codes": kept, "threshold": threshold, "cpu_seconds": cpu_seconds}
    learners = [n for n in size if n not in cut and n not in SOURCES]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ddp_lab.course.grading.similarity"],
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=WALL_SECONDS + len(learners),
            start_new_session=True,
        )
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        answer = None
    if not isinstance(answer, dict):
        return {}, {**cut, **dict.fromkeys(learners, TOO_SLOW)}
    found = {  # the two implementations, alike or not, say nothing about a learner
        str(g): [
            (str(a), str(b), float(x)) for a, b, x in rows if a not in SOURCES or b not in SOURCES
        ]
        for g, rows in answer.get("pairs", {}).items()
    }
    for name in answer.get("cut", []):
        cut[str(name)] = TOO_SLOW
    return found, cut


def _child() -> int:
    """The child's side of ``compare``: JSON request on stdin, JSON answer on stdout."""
    from ddp_lab.runtime._process import set_parent_death_signal

    set_parent_death_signal(signal.SIGKILL)  # a grader killed takes this child along
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))  # before any input
    signal.signal(signal.SIGXCPU, _over_budget)
    request = json.load(sys.stdin)
    cpu = float(request["cpu_seconds"])
    by_exercise: dict[str, dict[str, str]] = request["codes"]
    cut: set[str] = set()
    found: dict[str, list] = {}
    for grade_id in sorted(by_exercise):
        codes = {n: t for n, t in by_exercise[grade_id].items() if n not in cut}
        prints, over = _fingerprints(codes, cpu)
        cut.update(over)
        for name in over:  # a learner cut in one exercise is cut in all
            for other in found.values():
                other[:] = [p for p in other if name not in p[:2]]
        rows = _pairs({n: f for n, f in prints.items() if n not in cut}, request["threshold"])
        if rows:
            found[grade_id] = [list(r) for r in rows]
    json.dump({"pairs": found, "cut": sorted(cut)}, sys.stdout)
    return 0


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
            "implementation, `(torch)` torch's own (the one the exercise refuses), "
            "`(solution)` the course's solution (solutions/). "
            "Nothing here changes a grade: look at the code before you decide.",
            lang,
            threshold=threshold,
        ),
        "",
    ]
    by_exercise: dict[str, dict[str, str]] = {}
    for name, nb in subs.items():
        for grade_id, text in exercise_code(release, nb).items():
            if not grade_id.endswith(CONCEPTS):
                by_exercise.setdefault(grade_id, {})[name] = text
    if any(e.endswith(CONCEPTS) for e in exercise_code(release, release)):
        lines += [
            _t("Concept checks are not compared: every right answer is the same text.", lang),
            "",
        ]
    solutions = solution_code(release) if by_exercise else {}
    for grade_id in by_exercise:
        for name, references in ((REFERENCE, REFERENCES), (TORCH, TORCH_REFERENCES)):
            reference = reference_code(grade_id, references)
            if reference:
                by_exercise[grade_id][name] = reference
        if solutions.get(grade_id, "").strip():
            by_exercise[grade_id][SOLUTION] = solutions[grade_id]
    all_found, cut = compare(by_exercise, threshold)
    any_pair = False
    for grade_id in sorted(all_found):
        found = all_found[grade_id]
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
    if cut:
        lines += ["## " + _t("Not compared", lang), ""]
        why = {
            TOO_LARGE: _t("not compared (too large)", lang),
            TOO_SLOW: _t("not compared (took too long)", lang),
        }
        lines += [f"- {code_span(n, MAX_NAME)}: {why[r]}" for n, r in sorted(cut.items())]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


if __name__ == "__main__":
    sys.exit(_child())
