"""The package as every process that runs learner code sees it: without the answers.

The runner (``course.grading.runner``: the learner's cells, and the ranks it spawns for a
``spawn`` probe) and the ranks of a per-rank exercise (``course.grading.rankhost``) see
``ddp_lab`` through bubblewrap arguments built here, laid over the sandbox's read-only view of
the package (``course.grading.sandbox``):

- the checkers whose oracles compute the answer from the inputs, the concept checks' key and
  the grading machinery (``HIDDEN``) are modules that raise ImportError; their source is not
  there to read either;
- in the runner, each module that holds the reference implementation of an exercise
  (``REFERENCES``) is shown *stripped*: a copy of its source in which every answer (a function
  or class named in ``REFERENCES``) is a stub that raises ImportError when called or
  instantiated. The rest of the module stays, so the lesson cells around an exercise and the
  checkers' probes that import it still run; the answers are not there, whatever the road: an
  import, a read of the file (``open``, ``inspect.getsource``, ``linecache``), an ``exec`` of
  its text, a function shipped by value (cloudpickle) from the runner to the ranks;
- in a rank, those modules are hidden whole (``RANK_HIDDEN``), and so is the runner;
- every cached bytecode file of those modules (``__pycache__/<name>.*.pyc``, any Python
  version or optimisation level) is an empty file, and any other copy of the package on the
  import path (an installed, non-editable copy in ``site-packages``) an empty folder.

The grader itself (``course.grading.verdict``, outside the sandbox) keeps the whole package.
This module holds no answer (it names them); the ranks import it with ``rankhost``.
"""

from __future__ import annotations

import ast
import contextlib
import sys
from pathlib import Path

from ddp_lab.i18n import _t

# module (relative to the package) -> the names in it that answer an exercise.
REFERENCES: dict[str, tuple[str, ...]] = {
    "ring.py": ("ring_all_reduce",),  # 05.ring
    "parallel/balanced.py": ("balanced_chunk_sizes", "BalancedDataParallel"),  # 03.balanced
    "ddp.py": ("NaiveDDP", "average_gradients", "broadcast_state"),  # 07.naive_ddp
    "bucketed_ddp.py": ("BucketedDDP",),  # 07.bucketed
    "zero.py": ("ShardedOptimizer", "assign_shards"),  # 10.sharded_optimizer
    "comm_hooks.py": ("my_bf16_hook", "builtin_bf16_hook"),  # 10.bf16_hook
    "fsdp.py": ("FullyShardedDP", "_reduce_scatter"),  # 10.fsdp_reduce
    "tensor_parallel.py": (  # 12.tp_pair
        "_CopyToParallelRegion",
        "_ReduceFromParallelRegion",
        "copy_to_parallel_region",
        "reduce_from_parallel_region",
    ),
    "pipeline_1f1b.py": ("one_f_one_b_order",),  # 12.one_f_one_b
    "sampler.py": ("DistributedSampler", "permutation", "pad_or_trim"),  # 06.indices
    "labs/evaluation.py": (  # 06.accuracy
        "gather_tensor",
        "gather_in_index_order",
        "gather_by_index",
        "all_reduce_accuracy",
    ),
    "tools/ranks.py": ("assign", "torchrun_assignment"),  # 02.place
    "collectives.py": ("run_op",),  # 04's reference collectives
}
# The concept checks' key: every file of its package (``checks/concept_key/``).
CONCEPT_KEY = tuple(
    f"course/grading/checks/concept_key/{name}.py"
    for name in ("__init__", "ch00_03", "ch04_07", "ch08_11", "ch12")
)
# Whole modules that raise ImportError wherever learner code runs: the checkers of the
# single-process exercises (their oracles compute the answers from the inputs; their probes
# live in ``checks/probes.py``), 08.fit's oracle (its probe runs in the runner), the concept
# checks and their key, and the grading machinery
# (the stages that run in the grader's process: ``release``, ``execute``, ``judge``,
# ``feedback``, and what drives them).
HIDDEN = (
    "course/grading/checks/ch01.py",
    "course/grading/checks/ch02.py",
    "course/grading/checks/ch03.py",
    "course/grading/checks/ch08_oracle.py",
    "course/grading/checks/concepts.py",
    *CONCEPT_KEY,
    "course/grading/grader.py",
    "course/grading/release.py",
    "course/grading/execute.py",
    "course/grading/judge.py",
    "course/grading/feedback.py",
    "course/grading/grade_class.py",
    "course/grading/verdict.py",
    "course/grading/sandbox.py",
    "course/grading/export.py",
    "course/grading/classroom.py",
    "course/grading/gradescope.py",
    "course/grading/scan.py",
    "course/grading/similarity.py",
    "course/grading/report.py",
    "course/cli.py",
    "course/build.py",
)
# A rank's view: the reference modules whole, and the runner (a rank runs none of it).
RANK_HIDDEN = (*REFERENCES, *HIDDEN, "course/grading/runner.py")


def package_dir() -> Path:
    import ddp_lab

    return Path(ddp_lab.__file__).resolve().parent


def _message(what: str, lang: str) -> str:
    return _t(
        "{module} is not available while grading: write the exercise yourself", lang, module=what
    )


def stripped(source: str, names: tuple[str, ...], module: str, lang: str = "en") -> str:
    """``source`` with each top-level function or class in ``names`` replaced by a stub that
    raises ImportError when called or instantiated (same name, nothing of its body)."""
    tree = ast.parse(source)
    body: list[ast.stmt] = []
    for node in tree.body:
        defined = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if defined and node.name in names:
            text = _message(f"{module}.{node.name}", lang)
            if isinstance(node, ast.ClassDef):
                stub = (
                    f"class {node.name}:\n"
                    f"    def __new__(cls, *args, **kwargs):\n"
                    f"        raise ImportError({text!r})\n"
                )
            else:
                stub = f"def {node.name}(*args, **kwargs):\n    raise ImportError({text!r})\n"
            body += ast.parse(stub).body
        else:
            body.append(node)
    tree.body = body
    return ast.unparse(tree) + "\n"


def _module_name(rel: str) -> str:
    return "ddp_lab." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _masked_caches(source: Path) -> list[str]:
    cache = source.parent / "__pycache__"
    if not cache.is_dir():
        return []
    args: list[str] = []
    for pyc in sorted(cache.glob(source.stem + ".*.pyc")):
        args += ["--ro-bind", "/dev/null", str(pyc)]
    return args


def _other_copies(package: Path) -> list[str]:
    """Other ``ddp_lab`` folders on the import path (a copy installed beside the one in use)."""
    copies: dict[str, None] = {}
    for entry in sys.path:
        with contextlib.suppress(OSError):
            copy = (Path(entry or ".") / "ddp_lab").resolve()
            if copy.is_dir() and copy != package:
                copies[str(copy)] = None
    return [arg for copy in copies for arg in ("--tmpfs", copy)]


def args(base: Path, lang: str = "en", rank: bool = False) -> list[str]:
    """bwrap arguments for the runner's view (``rank``: a rank's); the stripped copies and
    masks are written into ``base`` (a folder of the grader's that outlives the sandbox and
    is removed after it)."""
    package = package_dir()
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    out: list[str] = []
    stripped_here = {} if rank else REFERENCES
    for rel, names in stripped_here.items():
        source = package / rel
        if not source.exists():
            continue
        module = _module_name(rel)
        mask = base / f"view-{module}.py"
        text = stripped(source.read_text(encoding="utf-8"), names, module, lang)
        mask.write_text(text, encoding="utf-8")
        mask.chmod(0o644)
        out += ["--ro-bind", str(mask), str(source), *_masked_caches(source)]
    for rel in RANK_HIDDEN if rank else HIDDEN:
        source = package / rel
        if not source.exists():
            continue
        module = _module_name(rel)
        mask = base / f"hidden-{module}.py"
        mask.write_text(f"raise ImportError({_message(module, lang)!r})\n", encoding="utf-8")
        mask.chmod(0o644)
        out += ["--ro-bind", str(mask), str(source), *_masked_caches(source)]
    return out + _other_copies(package)


def insert(cmd: list[str], view: list[str]) -> list[str]:
    """``sandbox.wrap``'s command with the view's arguments before its ``--chdir``."""
    if not view or "--chdir" not in cmd:
        return cmd
    at = cmd.index("--chdir")
    return cmd[:at] + view + cmd[at:]
