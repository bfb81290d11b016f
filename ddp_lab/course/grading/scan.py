"""A static read of a submission's own code for what an honest solution has no use for.

The grader flags an exercise for the instructor (status ``flagged``, 0 points until someone
looks, and a line in the feedback naming what was found) when the learner's code before its
graded cell
- reaches for a reference implementation of an exercise (``ANSWERS``: an import of it, an
  attribute or a string of its name), or
- looks at the grader's machinery from the inside (``INTROSPECTION``: frames, the garbage
  collector's object lists, a function's closure and globals, ``/proc/self/fd``, tracing
  hooks, ``ctypes``), or
- reads the package's files or runs text as code (``exec``, ``compile``, ``__import__``,
  ``importlib``, ``runpy``, ``linecache``, ``open`` of a module's file, a file name of a
  reference, magics that show or load a file's source, shell lines), or
- gets a fresh copy of what an exercise refuses (``sys.modules``, ``sys.meta_path``: a module
  imported again; ``subprocess``, ``os.system``, ``os.exec*``: another program, a new Python
  without the refusal), or
- changes how the shell reads later cells (``SHELL_HOOKS``: IPython's input and AST
  transformers), so that the cells this scan reads are not the code that runs.

A cell is read as IPython runs it: IPython's ``TransformerManager`` first turns ``%`` magics
and ``!`` lines into Python (``%time from ddp_lab.ring import ...`` is a call whose text is
read again, as the cell it runs). The scan is never the only defence: the package view of the
learner's processes (``course.grading.view``) has no answers to find.

Only the learner's code is read: a code cell identical to one of the release's is not. Nothing
is run; the parser is Python's ``ast``. A finding is a reason to look, not a proof: the
instructor decides (``ddp-lab grade`` never zeroes silently on a guess, and the verdict of the
checker is kept in the feedback next to the finding).
"""

from __future__ import annotations

import ast
from typing import Any

import nbformat

from ddp_lab._moved import MOVED
from ddp_lab.course.grading import view
from ddp_lab.i18n import _t

# The package's reference implementations of the exercises: module -> the names that answer one.
ANSWERS: dict[str, set[str]] = {
    "ddp_lab.ring": {"ring_all_reduce"},
    "ddp_lab.parallel.balanced": {"balanced_chunk_sizes", "BalancedDataParallel"},
    "ddp_lab.parallel._functions": {"Gather"},
    "ddp_lab.ddp": {"NaiveDDP", "average_gradients", "broadcast_state"},
    "ddp_lab.bucketed_ddp": {"BucketedDDP"},
    "ddp_lab.zero": {"ShardedOptimizer", "assign_shards"},
    "ddp_lab.comm_hooks": {"my_bf16_hook", "builtin_bf16_hook"},
    "ddp_lab.fsdp": {"FullyShardedDP"},
    "ddp_lab.tensor_parallel": {
        "copy_to_parallel_region",
        "reduce_from_parallel_region",
        "ColumnParallelLinear",
        "RowParallelLinear",
        "TensorParallelMLP",
    },
    "ddp_lab.pipeline_1f1b": {"one_f_one_b_order"},
    "ddp_lab.sampler": {"DistributedSampler", "permutation", "pad_or_trim"},
    "ddp_lab.labs.evaluation": {
        "gather_tensor",
        "gather_in_index_order",
        "gather_by_index",
        "all_reduce_accuracy",
    },
    "ddp_lab.collectives": {"run_op"},
    "ddp_lab.tools.ranks": {"assign"},  # 02.place's reference
}
# Their old paths (``ddp_lab.evaluation``, ``ddp_lab.ranks``: see ``_moved``) import the same.
ANSWERS.update({old: ANSWERS[new] for old, new in MOVED.items() if new in ANSWERS})
ANSWER_NAMES = set().union(*ANSWERS.values()) - {"Gather", "permutation"}
# Names that reach past the objects a process is given, flagged as attributes and as strings
# (``getattr(f, "__closure__")``):
RAW_STATE = (
    # a function's captured state: the grader's wrappers keep what they record, and the
    # real methods they wrap, in their closures and globals (review 8: 07.bucketed's record)
    "__closure__",
    "cell_contents",
    "__globals__",
    # memory at a raw address, without ctypes (an array or a storage over any pointer): how a
    # locked rank's lock can still be undone (INSTRUCTORS, "the lock")
    "__array_interface__",
    "__array_struct__",
    "_construct_storage_from_data_pointer",
)
# Attribute names (and dotted calls) that read the grader's state from inside a process.
INTROSPECTION = {
    "_getframe",
    "f_back",
    "f_locals",
    "f_globals",
    "tb_frame",
    "gi_frame",
    "get_objects",
    "get_referrers",
    "get_referents",
    "settrace",
    "setprofile",
    *RAW_STATE,
}
INSPECT_FRAMES = {"currentframe", "stack", "getouterframes", "getinnerframes", "trace"}
# imports flagged as such; ``copyreg`` registers what unpickling calls (below)
MODULES = {"ctypes", "gc", "inspect", "ddp_lab.course", "copyreg"}
# The grader's own modules reached as attributes (``dl.course.grading.checks.ch05``): the rank
# holds them, and a learner who replaced one of their globals had a blocking ring pass 05.ring
# (review 10). No exercise needs them.
GRADER_ATTRS = {"course", "grading"}
# What runs the learner's code while a rank unpickles their objects, before the probe: review
# 10 replaced a grader's global from a ``__reduce__`` (and review 9 a probe's code).
PICKLE_HOOKS = {"__reduce__", "__reduce_ex__", "__setstate__"}
# Names an exercise notebook binds to ddp_lab's and torch's modules (its first cell's imports)
# and the packages themselves: an assignment to one of their attributes changes what the
# grader's rank finds there (``ddp_lab.comm_debug.watch_c10d = ...``: review 10). Settings
# under ``torch.backends`` (``cudnn.allow_tf32``, a lesson's cell) are not flagged.
PACKAGE_ROOTS = ("ddp_lab", "torch")
PACKAGE_NAMES = {"ddp_lab", "dl", "torch", "dist", "nn", "F", "optim", "mp"}
STRINGS = (
    "/proc/self",
    "/proc/",
    "/dev/fd",
    "ddp_lab.course",
    "ddp_lab/course",
    *RAW_STATE,
)


# Calls that run or compile text as code, and modules that import by name: an honest solution
# has no use for them; a learner who reads a reference's file and runs it does.
RUNS_TEXT = {"exec", "eval", "compile", "__import__", "execfile"}
# The import system's own tables: deleting a module from ``sys.modules`` and importing it
# again gives a fresh copy of a function or class that an exercise refuses
# (``course.grading.learner.refuse`` changes the objects already imported), e.g. torch's
# ``DistributedSampler`` in 06.indices.
IMPORT_TABLES = {"modules", "meta_path", "path_hooks", "path_importer_cache"}
# Starting another program (a fresh Python has none of an exercise's refusals): what ``!`` lines
# and ``%%bash``/``%%python`` do, written as Python.
PROGRAMS = {"subprocess", "pty"}  # modules
OS_PROGRAMS = {
    "system",
    "popen",
    "fexecve",
    "posix_spawn",
    "posix_spawnp",
    *(f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
    *(f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
}
# ``builtins.exec(...)``: an attribute call is flagged only on these (``re.compile`` and
# ``torch.compile`` are not text run as code).
BUILTINS = {"builtins", "__builtins__"}
# IPython's hooks that rewrite a cell before it runs: a transformer registered in one cell
# turns the text (or the tree) of every later cell into other code, which this scan, reading
# the cells as written, would not see. An honest solution has no use for them.
SHELL_HOOKS = {
    "input_transformers_cleanup",
    "input_transformers_post",
    "input_transformer_manager",
    "ast_transformers",
    "cleanup_transforms",
    "line_transforms",
    "token_transformers",
}
LOADERS = ("importlib", "runpy", "linecache", "imp", "zipimport", "pkgutil")
# What finds or reads a module's file: with these, ``open`` and the like reach the package.
LOCATES = {
    "__file__",
    "__path__",
    "__spec__",
    "__loader__",
    "__cached__",
    "origin",
    "find_spec",
    "getsource",
    "getsourcelines",
    "getsourcefile",
    "getfile",
    "get_source",
    "get_data",
    "get_code",
    "getlines",
}
READS = {"open", "read_text", "read_bytes", "fdopen", "getlines", "getsource", "get_source"}
# Magics that read or show a file's source, or run another program.
READING_MAGICS = {
    "load",
    "loadpy",
    "run",
    "pycat",
    "psource",
    "pfile",
    "pinfo",
    "pinfo2",
    "sx",
    "system",
    "sc",
    "bash",
    "sh",
    "script",
    "python",
    "python2",
    "python3",
    "pypy",
    "perl",
    "ruby",
}
# File names of the package's reference implementations (``course.grading.view``).
ANSWER_FILES = (*sorted({rel.rsplit("/", 1)[-1] for rel in view.REFERENCES}), "ddp_lab/")
# (module, name) pairs flagged as ``module.name`` or ``from module import name``.
_FROM_FLAGGED = {("sys", n) for n in IMPORT_TABLES} | {("os", n) for n in OS_PROGRAMS}
MAX_DEPTH = 8  # magics inside magics (``%time %time ...``)


def findings(source: str, depth: int = 0) -> list[str]:
    """What ``source`` (one code cell, read as IPython runs it: magics and ``!`` lines turned
    into Python first) uses that this module flags, as short descriptions."""
    try:
        tree = ast.parse(_as_ipython_runs_it(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[str] = []
    answer_modules = set(ANSWERS)
    locates = reads = False
    packages = PACKAGE_NAMES | _package_aliases(tree)
    for node in ast.walk(tree):
        found += _assignment_findings(node, packages)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in PICKLE_HOOKS:
            found.append(f"`{node.name}`")
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _module_findings(alias.name, answer_modules)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += _module_findings(node.module, answer_modules)
            for alias in node.names:
                if (node.module, alias.name) in _FROM_FLAGGED:
                    found.append(f"`{node.module}.{alias.name}`")
                full = f"{node.module}.{alias.name}"
                if any(full == m or full.startswith(f"{m}.") for m in MODULES):
                    found.append(f"`import {full}`")  # ``from ddp_lab import course``
                if full in answer_modules or (
                    node.module in answer_modules and alias.name in ANSWERS[node.module]
                ):
                    found.append(f"`{full}`")
        elif isinstance(node, ast.Call):
            found += _magic_findings(node, depth)
            name = _called_name(node)
            func = node.func
            if (
                name in RUNS_TEXT
                and isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in BUILTINS
            ):
                found.append(f"`{name}(...)`")
            reads = reads or name in READS
            locates = locates or name in LOCATES
        elif isinstance(node, ast.Attribute):
            locates = locates or node.attr in LOCATES
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if (owner, node.attr) in _FROM_FLAGGED:
                found.append(f"`{owner}.{node.attr}`")
            elif node.attr in ANSWER_NAMES or node.attr in SHELL_HOOKS:
                found.append(f"`.{node.attr}`")
            elif node.attr in GRADER_ATTRS or node.attr in PICKLE_HOOKS:
                found.append(f"`.{node.attr}`")
            elif node.attr in INTROSPECTION or (
                node.attr in INSPECT_FRAMES
                and isinstance(node.value, ast.Name)
                and node.value.id == "inspect"
            ):
                found.append(f"`.{node.attr}`")
        elif isinstance(node, ast.Name):
            locates = locates or node.id in LOCATES
            if node.id in RUNS_TEXT:
                found.append(f"`{node.id}`")
            elif node.id in INTROSPECTION and node.id.startswith("__"):  # a class's own
                found.append(f"`{node.id}`")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if (
                text in ANSWER_NAMES
                or text in SHELL_HOOKS
                or text in PICKLE_HOOKS
                or text in GRADER_ATTRS
                or any(m in text for m in answer_modules)
            ):
                found.append(f"`{text[:60]!r}`")
            elif any(s in text for s in STRINGS) or any(f in text for f in ANSWER_FILES):
                found.append(f"`{text[:60]!r}`")
    if reads and locates:
        found.append("`open(<a module's file>)`")
    return list(dict.fromkeys(found))


def _package_aliases(tree: ast.AST) -> set[str]:
    """The names ``tree``'s imports bind to ddp_lab's or torch's modules and objects."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGE_ROOTS:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PACKAGE_ROOTS:
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node: ast.AST) -> tuple[str, str]:
    """The name an attribute chain starts from, and the chain (``a.b.c``)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return "", ""
    return node.id, ".".join([node.id, *reversed(parts)])


def _assignment_findings(node: ast.AST, packages: set[str]) -> list[str]:
    """An attribute of ddp_lab's or torch's set or deleted (``dist.all_reduce = f``,
    ``setattr(torch.Tensor, "detach", f)``), or a module's namespace written
    (``vars(m)[k] = v``, ``m.__dict__[k] = v``)."""
    if isinstance(node, ast.Assign | ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Call) and _called_name(node) in ("setattr", "delattr") and node.args:
        targets = [ast.Attribute(value=node.args[0], attr=f"<{_called_name(node)}>")]
    else:
        return []
    found = []
    for target in targets:
        for item in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
            if isinstance(item, ast.Subscript) and (
                (isinstance(item.value, ast.Attribute) and item.value.attr == "__dict__")
                or (isinstance(item.value, ast.Call) and _called_name(item.value) == "vars")
            ):
                found.append("`__dict__[...] =`")
            elif isinstance(item, ast.Attribute):
                name, chain = _root(item)
                if name in packages and not chain.startswith("torch.backends."):
                    found.append(f"`{chain} =`")
    return found


def _called_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _magic_findings(node: ast.Call, depth: int) -> list[str]:
    """What a magic or shell line does, as IPython's transformers write it
    (``get_ipython().run_line_magic(name, line)`` and the like): a magic that reads files or
    runs another program is flagged; the Python a code magic runs (``%time``, ``%%ddp``, ...)
    is read like a cell."""
    func = node.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and _called_name(func.value) == "get_ipython"
    ):
        return []
    texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if func.attr in ("system", "getoutput"):
        return [f"`!{texts[0][:60] if texts else ''}`"]
    if func.attr not in ("run_line_magic", "run_cell_magic") or not texts:
        return []
    name = texts[0]
    if name in READING_MAGICS:
        return [f"`%{name}`"]
    found: list[str] = []
    if depth < MAX_DEPTH:
        for text in texts[1:]:
            found += findings(text, depth + 1)
    return found


_transformer: Any = None


def _as_ipython_runs_it(source: str) -> str:
    """``source`` as the Python IPython runs for it (IPython's own ``TransformerManager``:
    ``%`` magics, ``!`` shell lines, ``?`` help), or with those lines blanked without IPython
    or where IPython's transformer fails on it.

    The transformer raises on some learner text (``\"\"\"\"\"\"=%\\`` gives an IndexError
    in its assignment-magic rule); that escaped the verdict process, which died, and every
    exercise of the submission became "error" (a flagged one too, its finding unseen). IPython
    cannot run such a cell either (its ``run_cell`` uses the same transformer), so the
    blanked text is read instead."""
    global _transformer
    try:
        if _transformer is None:
            from IPython.core.inputtransformer2 import TransformerManager

            _transformer = TransformerManager()
        return _transformer.transform_cell(source)
    except Exception:  # noqa: BLE001  # ImportError (no IPython), or IPython's own failure
        return "\n".join(
            "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
        )


def _module_findings(module: str, answer_modules: set[str]) -> list[str]:
    if module in answer_modules or any(module.startswith(m + ".") for m in answer_modules):
        return [f"`import {module}`"]
    flagged = MODULES | set(LOADERS) | PROGRAMS
    if module in flagged or any(module.startswith(m + ".") for m in flagged):
        return [f"`import {module}`"]
    return []


def flags_by_exercise(
    release: nbformat.NotebookNode, sub: nbformat.NotebookNode, found: dict[str, int]
) -> dict[str, list[str]]:
    """grade_id -> what the learner's own cells before its graded cell use (see the module
    docstring); a cell identical to one of the release's is the release's, not read."""
    released = {c.source for c in release.cells if c.cell_type == "code"}
    flags: dict[str, list[str]] = {}
    for grade_id, position in found.items():
        seen: list[str] = []
        for cell in sub.cells[:position]:
            if cell.cell_type != "code" or cell.source in released:
                continue
            if "grade_id" in cell.metadata:
                continue
            seen += findings(cell.source)
        if seen:
            flags[grade_id] = list(dict.fromkeys(seen))[:8]
    return flags


def apply(result: dict[str, Any], flags: list[str] | None, lang: str) -> dict[str, Any]:
    """The verdict for an exercise with these findings: ``flagged`` (with the checker's line),
    or the verdict unchanged if there are none or the exercise earned nothing anyway."""
    if not flags or result.get("status") not in ("passed", "failed", "not-attempted"):
        return result
    verdict = str(result.get("detail", "")) or result["status"]
    line = _t(
        "flagged for the instructor (0 points until reviewed): the code before "
        "this graded cell uses {what}. The checker said: {verdict}",
        lang,
        what=", ".join(flags),
        verdict=verdict,
    )
    return {"status": "flagged", "detail": line, "checker": result["status"]}
