"""The learner's side of grading: run a submission's cells, then serve the checker's probes.

Started by ``course.grading.verdict`` inside the sandbox (``course.grading.sandbox``) as
``python -m ddp_lab.course.grading.runner JOB.json``. It is the only process that runs the learner's
code; it decides nothing. It:
1. moves the protocol off fd 0/1 (the learner's prints go to ``output.log``, their reads
   get an empty stdin), then runs the submission's code cells in order in one IPython shell
   (so ``%%ddp`` and ``%%ranks`` work as in JupyterLab), each with a time limit;
2. at each graded cell it does not run the cell: it evaluates the arguments of the released
   ``dl.grade(...)`` call (the objects *as they are at that point of the notebook*, as the
   in-notebook check would see them) and hands them out pickled (base64 in the ``graded`` line;
   ``course.grading.rankhost`` loads them in sandboxes of their own, the grader never does);
3. says ``graded`` and answers the grader's requests (JSON lines) until it says
   ``continue``: run a probe of a checker module on the kept objects, in this process
   (``call``) or on N gloo ranks (``spawn``); the reply is data (``course.grading.wire``) or the
   error's type and message. Verdicts of earlier exercises are then final, whatever a
   later cell does;
4. a cell past its time limit ends the run (``timeout``); the end says ``done``.
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

from ddp_lab.course.grading.wire import BLOB_LIMIT


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


def _keep(cell: dict, shell: Any) -> tuple:
    """The objects a graded cell passes to ``dl.grade``, evaluated in the learner's namespace."""
    parsed = grade_call_args(cell["source"])
    if parsed is None or parsed[0] != cell["grade_id"]:
        raise ValueError("graded cell without its dl.grade call")
    values = []
    for expr in parsed[1]:
        code = compile(ast.Expression(expr), "<graded cell>", "eval")
        values.append(eval(code, shell.user_ns))  # noqa: S307  # the learner's own names
    return tuple(values)


def _hand_out(objects: tuple) -> tuple[str | None, str | None]:
    """The graded cell's objects pickled for the per-rank sandboxes, base64 for the protocol
    line, or the reason they cannot be: ``(blob, error)``. The grader decodes the bytes and
    never loads them. They travel on the protocol pipe because this process's folder is a
    private tmpfs (course.grading.sandbox) that the grader cannot see."""
    import base64

    from ddp_lab.runtime import _pickle

    try:
        data = _pickle.dumps(objects)
    except Exception as exc:  # noqa: BLE001  # e.g. an object that holds a lock
        return None, f"{type(exc).__name__}: {exc}"[:500]
    if len(data) > BLOB_LIMIT:
        return None, f"the graded objects take {len(data)} bytes pickled, more than {BLOB_LIMIT}"
    return base64.b64encode(data).decode("ascii"), None


def run(job: dict, proto_in: Any, proto_out: Any) -> None:
    """Run the cells in order; at each graded cell, answer the grader until it says go on."""
    from IPython.core.interactiveshell import InteractiveShell

    def send(msg: dict) -> None:
        proto_out.write(json.dumps(msg) + "\n")
        proto_out.flush()

    shell = InteractiveShell.instance()
    # A cell past its time is reported as soon as IPython has it, without formatting its
    # traceback first (nobody reads it; its CPU would count in the stalled stretch that
    # execute.run_verdict judges starvation on).
    shell.set_custom_exc((CellTimeout,), lambda *args, **kwargs: None)
    shell.run_cell(f"import ddp_lab as dl\ndl.setup({job.get('lang', 'en')!r})", silent=True)
    signal.signal(signal.SIGALRM, _on_alarm)
    errors: list[str] = []
    for index, cell in enumerate(job["cells"]):
        send({"cell": index})  # progress for ``ddp-lab check``
        if cell.get("grade_id"):
            try:
                kept: Any = _keep(cell, shell)
                msg: dict[str, Any] = {"graded": cell["grade_id"]}
                blob, unpicklable = _hand_out(kept)
                msg.update({"blob": blob} if unpicklable is None else {"blob_error": unpicklable})
                send(msg)
            except Exception as exc:  # noqa: BLE001  # e.g. the learner's function is undefined
                kept = None
                send({"graded": cell["grade_id"], "error": f"{type(exc).__name__}: {exc}"[:500]})
            serve(cell["grade_id"], kept, proto_in, proto_out)
            continue
        signal.setitimer(signal.ITIMER_REAL, float(job.get("cell_timeout", 300)))
        try:
            result = shell.run_cell(cell["source"], store_history=True)
        except CellTimeout:
            send({"timeout": index})
            return
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(result.error_in_exec, CellTimeout):
            send({"timeout": index})
            return
        err = result.error_before_exec or result.error_in_exec
        if err is not None:
            errors.append(f"cell {index + 1}: {type(err).__name__}: {err}"[:300])
    send({"done": True, "errors": errors[-5:]})


def serve(grade_id: str, objects: tuple | None, proto_in: Any, proto_out: Any) -> None:
    """Answer probe requests for ``grade_id`` until the grader sends ``continue``."""
    from ddp_lab.course.grading import wire
    from ddp_lab.course.grading.learner import LearnerError, LocalLearner, resolve_probe

    for line in proto_in:
        reply: dict[str, Any]
        try:
            req = json.loads(line)
            if req.get("op") == "continue":
                return
            if objects is None or req.get("grade_id") != grade_id:
                raise LearnerError("NameError", "the graded cell's objects are not defined")
            probe = resolve_probe(req["probe"])
            data = wire.loads(req["data"])
            learner = LocalLearner(objects)
            timeout = float(req.get("timeout", 60))
            signal.setitimer(signal.ITIMER_REAL, timeout + 5)
            try:
                if req["op"] == "spawn":
                    out = learner.spawn(probe, *data, nprocs=int(req["nprocs"]), timeout=timeout)
                else:
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
    run(job, proto_in, proto_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
