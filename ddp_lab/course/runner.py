"""The learner's side of grading: run a submission's cells, then serve the checker's probes.

Started by ``course.verdict`` inside the sandbox (``course.sandbox``) as
``python -m ddp_lab.course.runner JOB.json``. It is the only process that runs the learner's
code; it decides nothing. It:
1. moves the protocol off fd 0/1 (the learner's prints go to ``output.log``, their reads
   get an empty stdin), then runs the submission's code cells in order in one IPython shell
   (so ``%%ddp`` and ``%%ranks`` work as in JupyterLab), each with a time limit;
2. at each graded cell it does not run the cell: it evaluates the arguments of the released
   ``dl.grade(...)`` call and keeps them under the exercise id (the objects *as they were at
   that point of the notebook*, as the in-notebook check would see them);
3. says ``ready`` with each cell's outcome, then answers requests (JSON lines): run a probe
   of a checker module on the kept objects, in this process (``call``) or on N gloo ranks
   (``spawn``); the reply is data (``course.wire``) or the error's type and message.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any


class CellTimeout(BaseException):
    """A cell ran past its limit (BaseException: a bare ``except Exception`` won't hide it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CellTimeout()


def grade_call_args(source: str) -> tuple[str, list[ast.expr]] | None:
    """The exercise id and the object expressions of the ``dl.grade("id", ...)`` in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "grade"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return node.args[0].value, node.args[1:]
    return None


def _protocol() -> tuple[Any, Any]:
    """Keep fd 0/1 for the protocol on new fds; give the learner's code a quiet stdio."""
    proto_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open("output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", closefd=False)
    return proto_in, proto_out


def run_cells(job: dict) -> tuple[dict[str, Any], list[dict]]:
    """Run the job's cells; return the kept objects per exercise and each cell's outcome."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell(f"import ddp_lab as dl\ndl.setup({job.get('lang', 'en')!r})", silent=True)
    kept: dict[str, Any] = {}
    outcomes: list[dict] = []
    signal.signal(signal.SIGALRM, _on_alarm)
    for cell in job["cells"]:
        outcome: dict[str, Any] = {"ok": True}
        signal.setitimer(signal.ITIMER_REAL, float(job.get("cell_timeout", 300)))
        try:
            if cell.get("grade_id"):
                parsed = grade_call_args(cell["source"])
                if parsed is None or parsed[0] != cell["grade_id"]:
                    raise ValueError("graded cell without its dl.grade call")
                values = []
                for expr in parsed[1]:
                    code = compile(ast.Expression(expr), "<graded cell>", "eval")
                    values.append(eval(code, shell.user_ns))  # noqa: S307  # the learner's names
                kept[cell["grade_id"]] = tuple(values)
            else:
                result = shell.run_cell(cell["source"], store_history=True)
                err = result.error_before_exec or result.error_in_exec
                if err is not None:
                    outcome = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
        except CellTimeout:
            outcome = {"ok": False, "error": "timeout"}
        except Exception as exc:  # noqa: BLE001  # a graded cell whose names are missing
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            if cell.get("grade_id"):
                kept[cell["grade_id"]] = exc
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        outcomes.append(outcome)
    return kept, outcomes


def serve(kept: dict[str, Any], proto_in: Any, proto_out: Any) -> None:
    """Answer probe requests until the grader closes the pipe."""
    from ddp_lab.course import wire
    from ddp_lab.course.learner import LearnerError, LocalLearner, resolve_probe

    for line in proto_in:
        reply: dict[str, Any]
        try:
            req = json.loads(line)
            objects = kept.get(req["grade_id"])
            if objects is None or isinstance(objects, BaseException):
                raise LearnerError("NameError", str(objects or "not defined"))
            probe = resolve_probe(req["probe"])
            data = wire.loads(req["data"])
            learner = LocalLearner(objects)
            timeout = float(req.get("timeout", 60))
            if req["op"] == "spawn":
                out = learner.spawn(probe, *data, nprocs=int(req["nprocs"]), timeout=timeout)
            else:
                signal.setitimer(signal.ITIMER_REAL, timeout)
                try:
                    out = learner.call(probe, *data, timeout=timeout)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            reply = {"ok": wire.dumps(out)}
        except LearnerError as exc:
            reply = {"error": {"type": exc.type_name, "message": exc.message}}
        except CellTimeout:
            reply = {"error": {"type": "TimeoutError", "message": "timed out"}}
        except Exception as exc:  # noqa: BLE001
            reply = {"error": {"type": type(exc).__name__, "message": str(exc)[:500]}}
            traceback.print_exc()
        proto_out.write(json.dumps(reply) + "\n")
        proto_out.flush()


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    proto_in, proto_out = _protocol()
    kept, outcomes = run_cells(job)
    proto_out.write(json.dumps({"ready": True, "cells": outcomes}) + "\n")
    proto_out.flush()
    serve(kept, proto_in, proto_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
