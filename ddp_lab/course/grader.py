"""``ddp-lab check`` (learners) and ``ddp-lab grade`` (instructors): score exercise notebooks.

A graded cell is a code cell tagged ``grade`` with ``grade_id`` and ``points`` metadata.
Scoring a notebook:
1. compare it with the release: a graded cell whose code changed, that is missing, or that
   moved relative to the other graded and exercise cells scores 0 ("tampered");
2. hand the submission to ``course.verdict`` in a process of its own: it runs the learner's
   code cells in the sandbox (``course.sandbox``, ``course.runner``), keeps the objects each
   graded cell names, and computes every verdict itself (``course.learner``: the checker
   reaches the learner's code through probes that return data only);
3. kill everything the run started (its process group, then every process carrying the
   run's token), whatever happened; a timeout or a crash gives the exercises left their
   zeroes with the reason.
The in-notebook line printed by ``dl.grade`` is never read: nothing a learner's code does in
its own process decides a verdict.

How it differs from nbgrader and otter-grader: no database, server or student ids; the
kernel's own report is not trusted; each submission runs in a bubblewrap sandbox instead of
a container.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ddp_lab.course import export
from ddp_lab.course.i18n import Messages

TOKEN_VAR = "DDP_LAB_GRADE_TOKEN"
OUTPUT_PROP = "ddp_lab_output"
ERROR_PROP = "ddp_lab_error"
KERNEL_DIED = "ddp-lab: the kernel died"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # holds ddp_lab/ (this is ddp_lab/course/)

MESSAGES = Messages(
    __name__,
    {
        "passed": {"en": "passed", "zh": "通过"},
        "failed": {"en": "failed", "zh": "未通过"},
        "tampered-changed": {"en": "graded cell changed", "zh": "评分单元被修改"},
        "tampered-deleted": {"en": "graded cell deleted", "zh": "评分单元被删除"},
        "tampered-moved": {"en": "graded cell moved", "zh": "评分单元被移动"},
        "timeout": {"en": "timed out", "zh": "超时"},
        "kernel-died": {"en": "kernel died", "zh": "内核崩溃"},
        "flagged": {"en": "flagged for review", "zh": "已标记待审核"},
        "invalid": {"en": "invalid notebook", "zh": "notebook 文件无效"},
        "error": {"en": "not run", "zh": "未能运行"},
        "why_changed": {
            "en": "the code of the graded cell was changed; copy it back from the released notebook.",
            "zh": "评分单元的代码被修改了；请从发布的 notebook 中把它复制回来。",
        },
        "why_dup": {"en": "the graded cell appears {n} times.", "zh": "评分单元出现了 {n} 次。"},
        "why_deleted": {"en": "the graded cell is missing.", "zh": "找不到评分单元。"},
        "why_moved": {
            "en": "the graded cell was moved relative to the exercise cells; put it back in place.",
            "zh": "评分单元相对于练习单元的位置被移动了；请把它移回原处。",
        },
        "why_total": {
            "en": "the notebook did not finish within {timeout:g} s and was stopped.",
            "zh": "notebook 在 {timeout:g} 秒内没有运行完，已被停止。",
        },
        "why_cell": {
            "en": "a cell ran longer than {timeout:g} s and was interrupted (an endless loop?).",
            "zh": "有代码单元运行超过 {timeout:g} 秒，已被中断（是否有死循环？）。",
        },
        "why_died": {
            "en": "the Python kernel died (os._exit, a crash or out of memory) before this cell ran.",
            "zh": "在运行这个单元之前 Python 内核已经退出（os._exit、崩溃或内存不足）。",
        },
        "why_invalid": {
            "en": "not a valid notebook: {error}",
            "zh": "不是有效的 notebook：{error}",
        },
        "why_error": {
            "en": "the notebook could not be run: {error}",
            "zh": "无法运行 notebook：{error}",
        },
        "total": {"en": "total {points}/{max_points} points", "zh": "总分 {points}/{max_points}"},
        "feedback": {"en": "Feedback for {student}: {title}", "zh": "{student} 的反馈：{title}"},
        "no_file": {"en": "No such file: {path}", "zh": "找不到文件：{path}"},
        "no_graded": {
            "en": "{path} has no graded cells: is it an exercise notebook?",
            "zh": "{path} 中没有评分单元：它是练习 notebook 吗？",
        },
        "no_subs": {
            "en": "No .ipynb submissions found in {paths}",
            "zh": "在 {paths} 中找不到 .ipynb 提交",
        },
        "bad_number": {
            "en": "--{name} must be a positive number, got {value!r}.",
            "zh": "--{name} 必须是正数，但收到的是 {value!r}。",
        },
        "wrote": {"en": "wrote {path}", "zh": "已写入 {path}"},
        "progress": {
            "en": "{done}/{total} graded, {zeros} with no points, about {left} s left",
            "zh": "已评 {done}/{total} 份，{zeros} 份零分，预计还需约 {left} 秒",
        },
        "no_such_exercise": {
            "en": "{path} has no exercise {grade_id}; it has: {ids}",
            "zh": "{path} 中没有练习 {grade_id}；现有的练习：{ids}",
        },
    },
)


@dataclass
class Exercise:
    """A graded cell of the release: what it is worth and what it must print."""

    grade_id: str
    points: int
    cell: nbformat.NotebookNode


@dataclass
class Result:
    """One exercise of one notebook: points and a status (a key of ``M``) with details."""

    grade_id: str
    points: int
    max_points: int
    status: str
    detail: str = ""


def _norm(source: str) -> str:
    # Editors add or drop trailing spaces and newlines; that is not tampering.
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _is_graded(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and "grade_id" in cell.metadata


def exercises_of(release: nbformat.NotebookNode) -> list[Exercise]:
    """The graded cells of a released exercise notebook, in order."""
    return [
        Exercise(str(c.metadata["grade_id"]), int(c.metadata.get("points", 0)), c)
        for c in release.cells
        if _is_graded(c)
    ]


def language_of(nb: nbformat.NotebookNode, default: str = "en") -> str:
    lang = str(nb.metadata.get("ddp_lab", {}).get("lang", default))[:2]
    return lang if lang in ("en", "zh") else default


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
    claimed = {str(c.metadata["grade_id"]) for c in sub.cells if _is_graded(c)}
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
                and _norm(c.source) == _norm(ex.cell.source)
            ]
        if not hits:
            tampered[ex.grade_id] = "deleted"
        elif len(hits) > 1:
            tampered[ex.grade_id] = f"dup:{len(hits)}"
        elif _norm(sub.cells[hits[0]].source) != _norm(ex.cell.source):
            tampered[ex.grade_id] = "changed"
        else:
            found[ex.grade_id] = hits[0]
    # Key cells in release order: graded cells and exercise code cells (by id).
    ids = {c.get("id"): i for i, c in enumerate(sub.cells) if c.cell_type == "code" and c.get("id")}
    keys: list[tuple[str | None, int]] = []  # (grade_id or None, position in sub)
    for c in release.cells:
        if _is_graded(c) and str(c.metadata["grade_id"]) in found:
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


def _token_pids(token: str) -> list[int]:
    """Processes whose environment holds this run's token: everything the run started."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if f"{TOKEN_VAR}={token}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
    if not pids and not Path("/proc/self").exists():  # macOS: no /proc
        with contextlib.suppress(ImportError):
            import psutil

            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    if p.environ().get(TOKEN_VAR) == token:
                        pids.append(p.pid)
    return [p for p in pids if p != os.getpid()]


_RUNNING: dict[int, str] = {}  # process group -> token of each grading run in progress


def kill_all_runs() -> None:
    """Stop every grading run of this process (on Ctrl-C: their sessions do not get it)."""
    for pgid, token in list(_RUNNING.items()):
        kill_run(pgid, token)


def kill_run(pgid: int, token: str) -> None:
    """SIGKILL the run's process group, then every process with its token, until none is left."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):  # a zygote may fork while we kill; look again
        pids = _token_pids(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def run_verdict(
    release: nbformat.NotebookNode,
    sub: nbformat.NotebookNode,
    found: dict[str, int],
    lang: str,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
) -> dict[str, dict]:
    """grade_id -> {status, detail} from ``course.verdict``, run in a process of its own.

    That process never runs learner code: it starts the submission's code in the sandbox
    and computes each verdict itself. Its process group and everything carrying this run's
    token are killed afterwards, whatever happened.
    """
    from ddp_lab.course import sandbox

    sandbox.warn_unsandboxed(lang)
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in ("JPY_SESSION_NAME", "PYTEST_ADDOPTS")}
    env.update(
        {
            TOKEN_VAR: token,
            "DDP_LAB_LANG": lang,
            "PYTHONPATH": os.pathsep.join(
                [str(PACKAGE_PARENT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
    )
    request = {
        "release": nbformat.writes(release),
        "submission": nbformat.writes(sub),
        "found": found,
        "lang": lang,
        "cell_timeout": cell_timeout,
        "timeout": timeout,
        "job": job,
        "env": {TOKEN_VAR: token},
    }
    cmd = [sys.executable, "-m", "ddp_lab.course.verdict"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        _RUNNING[proc.pid] = token
        try:
            out, _ = proc.communicate(json.dumps(request).encode(), timeout=timeout + 60)
            answer = json.loads(out or b"{}")
        except subprocess.TimeoutExpired:
            answer = {"results": {g: {"status": "timeout"} for g in found}}
        except ValueError:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-1:]
            error = " ".join(tail)[-300:]
            answer = {"results": {g: {"status": "error", "detail": error} for g in found}}
        finally:  # no sandbox, zygote or rank may outlive the run
            kill_run(proc.pid, token)
            proc.wait()
            _RUNNING.pop(proc.pid, None)
    return answer.get("results", {})


def _stream_text(outputs: list) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def score(
    release: nbformat.NotebookNode,
    path: Path,
    cell_timeout: float,
    timeout: float,
    job: int = 0,
) -> tuple[str, list[Result]]:
    """Score one submission against ``release``: (its language, one Result per exercise)."""
    lang = language_of(release)
    exercises = exercises_of(release)
    try:
        sub = nbformat.read(path, as_version=4)
        if not isinstance(sub.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as exc:  # noqa: BLE001  # any unreadable file scores 0, the rest go on
        why = MESSAGES("why_invalid", lang, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        return lang, [Result(e.grade_id, 0, e.points, "invalid", why) for e in exercises]
    lang = language_of(sub, lang)
    found, tampered = locate(release, sub)
    verdicts = run_verdict(release, sub, found, lang, cell_timeout, timeout, job) if found else {}
    results = {}
    by_id = {ex.grade_id: ex for ex in exercises}
    for grade_id in found:
        ex = by_id[grade_id]
        v = verdicts.get(grade_id, {"status": "error"})
        status, detail = v.get("status", "error"), v.get("detail", "")
        if status == "passed":
            results[grade_id] = Result(grade_id, ex.points, ex.points, "passed", detail)
        elif status == "timeout":  # the whole submission ran out of time
            why = MESSAGES("why_total", lang, timeout=timeout)
            results[grade_id] = Result(grade_id, 0, ex.points, "timeout", why)
        elif status == "timeout-cell":
            why = MESSAGES("why_cell", lang, timeout=cell_timeout)
            results[grade_id] = Result(grade_id, 0, ex.points, "timeout", why)
        elif status == "kernel-died":
            results[grade_id] = Result(grade_id, 0, ex.points, status, MESSAGES("why_died", lang))
        elif status in ("failed", "flagged"):  # flagged: course.scan, 0 until reviewed
            results[grade_id] = Result(grade_id, 0, ex.points, status, detail)
        else:
            why = MESSAGES("why_error", lang, error=detail or "-")
            results[grade_id] = Result(grade_id, 0, ex.points, "error", why)
    for ex in exercises:
        kind = tampered.get(ex.grade_id)
        if kind:  # a copied graded cell counts as changed: it runs more than once
            key = "why_dup" if kind.startswith("dup:") else f"why_{kind}"
            status = "tampered-changed" if kind.startswith("dup:") else f"tampered-{kind}"
            results[ex.grade_id] = Result(
                ex.grade_id, 0, ex.points, status, MESSAGES(key, lang, n=kind[4:])
            )
    return lang, [results[e.grade_id] for e in exercises]


def report_lines(results: list[Result], lang: str) -> list[str]:
    """One line per exercise and a total, in ``lang``."""
    lines = [
        f"- {r.grade_id}: {MESSAGES(r.status, lang)}, {r.points}/{r.max_points}"
        + (f"\n  {r.detail}" if r.detail and r.status != "passed" else "")
        for r in results
    ]
    total = MESSAGES(
        "total",
        lang,
        points=sum(r.points for r in results),
        max_points=sum(r.max_points for r in results),
    )
    return [*lines, total]


def _positive(args: argparse.Namespace, *names: str) -> str | None:
    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return MESSAGES("bad_number", _cli_lang(), name=name.replace("_", "-"), value=value)
    return None


def _cli_lang() -> str:
    from ddp_lab.course.i18n import get_language

    return get_language()


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
        if _is_graded(cell):
            line = build.grade_pass_line(
                str(cell.metadata["grade_id"]), int(cell.metadata.get("points", 0)), language_of(nb)
            )
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=line + "\n")]
            cell.execution_count = 1
    return ref


def check_main(args: argparse.Namespace) -> int:
    """``ddp-lab check NOTEBOOK``: run it, print each exercise's status; 0 only if all passed."""
    path = Path(args.notebook)
    problem = _positive(args, "cell_timeout", "timeout")
    if problem is None and not path.is_file():
        problem = MESSAGES("no_file", _cli_lang(), path=path)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001  # any unreadable file: say why, in one line
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(f"{path}: {MESSAGES('why_invalid', _cli_lang(), error=error)}", file=sys.stderr)
        return 1
    release = reference_for(nb)
    if nb.metadata.get("ddp_lab", {}).get("kind") == "notebooks" or not exercises_of(release):
        print(MESSAGES("no_graded", language_of(nb), path=path), file=sys.stderr)
        return 1
    only = getattr(args, "only", None)
    if only:
        ids = [e.grade_id for e in exercises_of(release)]
        if only not in ids:
            print(
                MESSAGES("no_such_exercise", language_of(nb), path=path, grade_id=only, ids=ids),
                file=sys.stderr,
            )
            return 2
        release = copy.deepcopy(release)
        release.cells = [c for c in release.cells if c.metadata.get("grade_id", only) == only]
    lang, results = score(release, path, args.cell_timeout, args.timeout)
    print(path)
    print("\n".join(report_lines(results, lang)))
    return 0 if results and all(r.status == "passed" for r in results) else 1


def find_submissions(paths: list[str]) -> list[Path]:
    """Notebooks named on the command line or found (recursively) in the folders named."""
    found: list[Path] = []
    for p in map(Path, paths):
        items = sorted(p.rglob("*.ipynb")) if p.is_dir() else [p]
        found += [i for i in items if ".ipynb_checkpoints" not in i.parts]
    return list(dict.fromkeys(found))


def student_names(subs: list[Path], release_stem: str) -> list[str]:
    """``alice.ipynb`` -> alice; ``alice/00_quickstart.ipynb`` -> alice; unique names."""
    names, seen = [], set()
    for s in subs:
        name = s.parent.name if s.stem == release_stem and s.parent.name else s.stem
        base, k = name, 2
        while name in seen:
            name, k = f"{base}-{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def _title(path: Path, default: str) -> str:
    """The notebook's title (in its own language), or ``default``."""
    with contextlib.suppress(Exception):
        return str(json.loads(path.read_text(encoding="utf-8"))["metadata"]["ddp_lab"]["title"])
    return default


class Progress:
    """One line per graded submission: done/total, failures so far, time left (estimated)."""

    def __init__(self, total: int, lang: str) -> None:
        self.total, self.lang, self.count, self.zeros = total, lang, 0, 0
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def done(self, name: str, summary: str, zero: bool) -> None:
        with self.lock:
            self.count += 1
            self.zeros += zero
            elapsed = time.monotonic() - self.start
            left = elapsed / self.count * (self.total - self.count)
            bar = MESSAGES(
                "progress",
                self.lang,
                done=self.count,
                total=self.total,
                zeros=self.zeros,
                left=f"{left:.0f}",
            )
            print(f"[{bar}] {name}: {summary}", flush=True)


def grade_main(args: argparse.Namespace) -> int:
    """``ddp-lab grade --release R SUBMISSIONS...``: write gradebook.csv and feedback files."""
    lang = _cli_lang()
    release_path = Path(args.release)
    problem = _positive(args, "cell_timeout", "timeout")
    if problem is None and (not isinstance(args.jobs, int) or args.jobs < 0):
        problem = MESSAGES("bad_number", lang, name="jobs", value=args.jobs)
    if problem is None and not release_path.is_file():
        problem = MESSAGES("no_file", lang, path=release_path)
    missing = [p for p in args.submissions if not Path(p).exists()]
    if problem is None and missing:
        problem = MESSAGES("no_file", lang, path=", ".join(missing))
    subs = [] if problem else find_submissions(args.submissions)
    if problem is None and not subs:
        problem = MESSAGES("no_subs", lang, paths=" ".join(args.submissions))
    if problem is None:
        release = nbformat.read(release_path, as_version=4)
        if not exercises_of(release):
            problem = MESSAGES("no_graded", lang, path=release_path)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    names = student_names(subs, release_path.stem)
    title = release.metadata.get("ddp_lab", {}).get("title", release_path.stem)

    workers = args.jobs or os.cpu_count() or 1
    progress = Progress(len(subs), lang)

    def one(i: int) -> tuple[str, list[Result]]:
        started = time.monotonic()
        try:
            sub_lang, results = score(
                release, subs[i], args.cell_timeout, args.timeout, job=i % workers
            )
        except Exception as exc:  # noqa: BLE001  # a bug here must not stop the other gradings
            sub_lang, why = lang, MESSAGES("why_error", lang, error=f"{type(exc).__name__}: {exc}")
            results = [Result(e.grade_id, 0, e.points, "error", why) for e in exercises_of(release)]
        text = [
            f"# {MESSAGES('feedback', sub_lang, student=names[i], title=_title(subs[i], title))}",
            "",
            *report_lines(results, sub_lang),
            "",
        ]
        (out / "feedback" / f"{names[i]}.md").write_text("\n".join(text), encoding="utf-8")
        doc = export.gradescope_results(results, sub_lang, time.monotonic() - started)
        (out / "results").mkdir(exist_ok=True)
        (out / "results" / f"{names[i]}.json").write_text(json.dumps(doc, ensure_ascii=False))
        if getattr(args, "gradescope", None) and len(subs) == 1:
            Path(args.gradescope).parent.mkdir(parents=True, exist_ok=True)
            Path(args.gradescope).write_text(json.dumps(doc, ensure_ascii=False))
        progress.done(
            names[i], report_lines(results, lang)[-1], all(r.status != "passed" for r in results)
        )
        return names[i], results

    pool = ThreadPoolExecutor(max_workers=workers)
    # SIGTERM (a job scheduler, `kill`) stops the grading like Ctrl-C: every run is killed.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        graded = list(pool.map(one, range(len(subs))))
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_all_runs()
        raise
    finally:
        pool.shutdown()
        signal.signal(signal.SIGTERM, previous)
    with open(out / "gradebook.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "exercise", "points", "max_points", "status"])
        for name, results in graded:
            for r in results:
                writer.writerow([name, r.grade_id, r.points, r.max_points, r.status])
    print(MESSAGES("wrote", lang, path=out / "gradebook.csv"))
    _similarity(release, subs, names, out, lang)
    return 0


def _similarity(
    release: nbformat.NotebookNode, subs: list[Path], names: list[str], out: Path, lang: str
) -> None:
    """``out/similarity.md`` (course.similarity): for the instructor; never a grade's cause."""
    from ddp_lab.course import similarity

    notebooks = {}
    for path, name in zip(subs, names, strict=True):
        try:
            if path.is_file() and not path.is_symlink() and path.stat().st_size <= 16 * 2**20:
                notebooks[name] = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001, S112  # unreadable: graded (and reported) elsewhere
            continue
    try:
        similarity.write_report(release, notebooks, out, lang)
    except Exception as exc:  # noqa: BLE001  # the report is extra: never fail the class on it
        print(f"similarity report: {type(exc).__name__}: {exc}", file=sys.stderr)
