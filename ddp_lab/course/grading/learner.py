"""How a checker reaches the learner's code: through a handle that returns data only.

A checker never holds the learner's objects. It asks a handle to run a *probe* (a small
module-level function of the checker's module that calls the learner's code on given inputs
and returns what came out) and receives plain data (``course.grading.wire``): tensors, numbers,
lists. Oracles and comparisons stay with the checker.

- ``LocalLearner``: in the learner's own kernel (``dl.grade`` in a notebook, self-study). The
  probe runs right there; results still cross the wire codec, so a checker sees exactly what
  it would see from a sandbox.
- ``RemoteLearner``: in the grader (``ddp-lab grade``/``check``). A per-rank probe
  (``ranks``: rank r receives only ``inputs[r]``) runs in fresh sandboxes, one per rank
  (``course.grading.rankhost``), on the learner's objects as the runner handed them out; other probes
  (``call``, ``spawn``: every rank sees all the data) run in the sandboxed runner process that
  executed the submission (``course.grading.runner``); requests and replies are JSON lines over a pipe;
  the grader's process never runs learner code and never unpickles anything from it.

A checker converted to ``ranks`` is the trustworthy kind: nothing in the learner's processes
holds another rank's input, the seed or the checker's frames.

``refuse`` turns off oracle functions an exercise must not call, inside the learner's process,
for the duration of the learner's call (aliases included: the function object itself is
changed, not a module attribute); ``course.grading.guard``'s audit hook refuses, meanwhile,
the roads to a fresh copy of them (a re-import, another Python, ``ctypes``). In a graded rank
(``refuse_for_life``) neither is ever lifted and the originals are not kept; ``LocalLearner``'s
refusal lives in the learner's own kernel, so it is a hint for feedback, not a proof.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import IO, Any

from ddp_lab.course.grading import guard, wire
from ddp_lab.course.grading.guard import Refused, RefusedFile  # noqa: F401  # their home: the hook raises them
from ddp_lab.i18n import _t

# A terminal's colour codes, which some errors carry (torch.load's "Weights only load failed"
# prints part of its message in bold): shown literally in a feedback file, they are noise.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class LearnerError(Exception):
    """The learner's code raised (or the runner could not run it).

    ``type_name`` "TimeoutError": the learner's ranks ran past the time limit (a hang).
    """

    def __init__(self, type_name: str, message: str, traceback: str = "") -> None:
        # An exception's class name is the learner's to choose (newlines and all): only a
        # dotted identifier of it is kept, so it can never write a line of its own.
        type_name = ".".join(re.findall(r"\w+", str(type_name)))[:80] or "Exception"
        message = _ANSI.sub("", message)
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.traceback = type_name, message, traceback

    @property
    def not_implemented(self) -> bool:
        return self.type_name == "NotImplementedError"

    @property
    def timed_out(self) -> bool:
        return self.type_name == "TimeoutError"


class RunnerGone(Exception):
    """The learner's process died or stopped answering (timeout, crash, memory)."""


def probe_name(probe: Callable) -> str:
    """``module:function`` of a probe; probes live at the top of a checker module."""
    name = f"{probe.__module__}:{probe.__qualname__}"
    if not probe.__module__.startswith("ddp_lab.") or "." in probe.__qualname__:
        raise ValueError(f"a probe must be a module-level function of ddp_lab: {name}")
    return name


def resolve_probe(name: str) -> Callable:
    """The probe function named by ``probe_name``."""
    module, _, qualname = name.partition(":")
    if not module.startswith("ddp_lab.course.grading.checks.") or not qualname.isidentifier():
        raise ValueError(f"not a probe: {name}")
    return getattr(importlib.import_module(module), qualname)


def error_of(exc: BaseException) -> LearnerError:
    """A LearnerError for an exception of the learner's code (ranks' failures unwrapped)."""
    from ddp_lab.runtime.launcher import DistributedError, DistributedTimeoutError

    if isinstance(exc, DistributedTimeoutError):  # a hang: the ranks were stopped
        return LearnerError("TimeoutError", _first_line(exc))
    if isinstance(exc, DistributedError) and exc.failures:
        first = next((f for f in exc.failures if f.exception is not None), exc.failures[0])
        inner = first.exception
        if inner is not None:
            return LearnerError(type(inner).__name__, _first_line(inner), first.traceback)
        # no exception object (an exit code, a signal, an exception the parent cannot load)
        reason = first.reason.splitlines()[0] if first.reason else ""
        return LearnerError("RankFailed", reason, first.traceback)
    if isinstance(exc, LearnerError):
        return exc
    return LearnerError(type(exc).__name__, _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc)).strip().splitlines()
    return text[0] if text else ""


class LocalLearner:
    """Probes run in this process (and its ranks) on the learner's objects."""

    # The ranks' traffic is observed only when grading (``RemoteLearner``): here the ranks
    # are the learner's own processes on the host's network.
    traffic = None
    unobserved = "self-study"
    # Nor the shared folder or reply times (``RemoteLearner``): ``ranks``' ``share`` is ignored.
    shared = None
    answered = None

    def __init__(self, objects: tuple) -> None:
        self.objects = objects

    def call(self, probe: Callable, *data: Any, timeout: float = 60) -> Any:
        try:
            out = probe(self.objects, *data)
        except Exception as exc:  # noqa: BLE001  # the learner's code raised
            raise error_of(exc) from None
        return _as_data(out)

    def spawn(self, probe: Callable, *data: Any, nprocs: int, timeout: float = 60) -> list:
        from ddp_lab.runtime.launcher import spawn

        try:
            out = spawn(
                probe,
                args=(self.objects, *data),
                nprocs=nprocs,
                backend="gloo",
                quiet=True,
                timeout=timeout,
            )
        except Exception as exc:  # noqa: BLE001
            raise error_of(exc) from None
        return _as_data(out)

    def ranks(
        self,
        probe: Callable,
        inputs: list,
        timeout: float = 60,
        fresh: bool = False,
        share: str | None = None,
    ) -> list:
        """``probe(rank, objects, inputs[rank])`` on ``len(inputs)`` gloo ranks (new processes
        at every call, so ``fresh`` changes nothing here; the ranks share this machine's
        ``/tmp``, so ``share`` does neither)."""
        from ddp_lab.runtime.launcher import spawn

        try:
            out = spawn(
                _own_input,
                args=(probe, self.objects, inputs),
                nprocs=len(inputs),
                backend="gloo",
                quiet=True,
                timeout=timeout,
            )
        except Exception as exc:  # noqa: BLE001
            raise error_of(exc) from None
        return _as_data(out)


def _own_input(rank: int, probe: Callable, objects: tuple, inputs: list) -> Any:
    with refusing(probe):
        return probe(rank, objects, inputs[rank])


def _as_data(value: Any) -> Any:
    try:
        return wire.loads(wire.dumps(value))
    except wire.WireError as exc:
        raise LearnerError("WireError", str(exc)) from None


class RemoteLearner:
    """In the grader: probes that need the learner's process run in the sandboxed runner that
    executed the submission (``course.grading.runner``, ``call`` and ``spawn``); per-rank probes
    (``ranks``) run in fresh sandboxes of their own, one per rank (``course.grading.rankhost``), on the
    blob of the learner's objects that the runner handed out at the graded cell.

    ``blob``: the objects, pickled by the runner (never loaded here), or the error's text if the
    runner could not pickle them. ``rank_pool``: ``course.grading.rankhost.RankPool``, passed in by the
    verdict process (rankhost uses this module's errors, so this module does not import it).
    """

    def __init__(
        self,
        grade_id: str,
        send: IO[bytes],
        receive: wire.LineReader,
        on_timeout: Callable,
        blob: bytes | str | None = None,
        lang: str = "en",
        job: int = 0,
        rank_pool: Callable[[bytes, str, int], Any] | None = None,
    ) -> None:
        self.grade_id, self._send, self._receive = grade_id, send, receive
        self._on_timeout = on_timeout
        self.blob, self.lang, self.job = blob, lang, job
        self._rank_pool = rank_pool
        self._pool: Any = None
        # After ``ranks``: the bytes the ranks sent each other, observed by the grader
        # (``course.traffic.Traffic``), or None and the reason in ``unobserved``.
        self.traffic: Any = None
        self.unobserved = ""
        # After ``ranks`` with ``share``: the shared folder's listing and when each rank's reply
        # arrived, both taken by the grader (``RankPool.shared``, ``answered``), or None.
        self.shared: Any = None
        self.answered: Any = None

    def _ask(self, op: str, probe: Callable, data: tuple, nprocs: int, timeout: float) -> Any:
        request = {
            "op": op,
            "grade_id": self.grade_id,
            "probe": probe_name(probe),
            "nprocs": nprocs,
            "timeout": timeout,
            "data": wire.dumps(list(data)),
        }
        try:
            self._send.write(json.dumps(request).encode() + b"\n")
            self._send.flush()
        except (BrokenPipeError, OSError):
            raise RunnerGone("the learner's process is gone") from None
        line = self._read_line(timeout + 30)
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: a line nested past the parser
            raise RunnerGone("the learner's process answered garbage") from None
        if not isinstance(reply, dict):
            raise RunnerGone("the learner's process answered garbage")
        if "error" in reply:
            e = reply["error"] if isinstance(reply["error"], dict) else {}
            raise LearnerError(str(e.get("type", "Error"))[:100], str(e.get("message", ""))[:500])
        try:
            return wire.loads(reply.get("ok", "null"))
        except wire.WireError as exc:
            raise LearnerError("WireError", str(exc)) from None

    def _read_line(self, timeout: float) -> bytes:
        try:
            line = self._receive.readline(timeout)
        except EOFError:
            raise RunnerGone("the learner's process is gone") from None
        except wire.LineTooLong:
            self._on_timeout()
            raise RunnerGone("flood") from None
        if line is None:
            self._on_timeout()
            raise RunnerGone("timeout")
        return line

    def call(self, probe: Callable, *data: Any, timeout: float = 60) -> Any:
        return self._ask("call", probe, data, 1, timeout)

    def spawn(self, probe: Callable, *data: Any, nprocs: int, timeout: float = 60) -> list:
        return self._ask("spawn", probe, data, nprocs, timeout)

    def ranks(
        self,
        probe: Callable,
        inputs: list,
        timeout: float = 60,
        fresh: bool = False,
        share: str | None = None,
    ) -> list:
        """``probe(rank, objects, inputs[rank])`` on ``len(inputs)`` sandboxed ranks. The ranks
        of one exercise serve its cases one after the other; ``fresh``: in new sandboxes and
        processes (nothing of an earlier call survives in them, e.g. a resume after a stop);
        ``share``: ``/tmp/<share>`` is one folder, written by rank 0 only (``RankPool.run``)."""
        if fresh:
            self.close()
        if not isinstance(self.blob, bytes):
            raise LearnerError("PicklingError", str(self.blob or "no objects")[:500])
        if self._rank_pool is None:
            raise RuntimeError("per-rank probes need rank_pool (course.grading.rankhost.RankPool)")
        if self._pool is None:
            self._pool = self._rank_pool(self.blob, self.lang, self.job)
        self.traffic, self.unobserved, self.shared, self.answered = None, "", None, None
        more = {"share": share} if share is not None else {}
        out = self._pool.run(probe_name(probe), inputs, timeout, **more)
        self.traffic = getattr(self._pool, "traffic", None)
        self.unobserved = str(getattr(self._pool, "unobserved", "") or "")
        if share is not None:
            self.shared = getattr(self._pool, "shared", None)
            self.answered = getattr(self._pool, "answered", None)
        return out

    def close(self) -> None:
        """Kill the ranks' sandboxes of this exercise."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


_ACTIVE: list[tuple[list[str], str]] = []  # (refused names, what to use instead)


def _refused_call() -> None:
    names, allowed = _ACTIVE[-1] if _ACTIVE else (["?"], "-")
    raise Refused(
        _t(
            "this exercise asks you to write it yourself: calling {name} is not "
            "allowed here (use {allowed}).",
            name=" / ".join(names),
            allowed=allowed,
        )
    )


def _refusing_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _refused_call()


_STUBS: dict[int, types.CodeType] = {}  # nfree -> its one stub code: a sealed rank knows them


def stub_codes(most: int = 16) -> tuple[types.CodeType, ...]:
    """The stubs for 0 to ``most`` free variables: a sealed rank's only new code (``guard.seal``)."""
    return tuple(_stub_code(n) for n in range(most + 1))


def _stub_code(nfree: int) -> types.CodeType:
    """Code that calls ``_refused_call``, with ``nfree`` free variables (a function's code can
    only be replaced by code with as many free variables as its closure has cells)."""
    names = [f"_free{i}" for i in range(nfree)]
    src = "def outer():\n"
    src += "".join(f"    {n} = None\n" for n in names)
    src += "    def stub(*args, **kwargs):\n"
    if names:
        src += f"        ({', '.join(names)},)\n"
    src += "        import ddp_lab.course.grading.learner as _learner\n"
    src += "        _learner._refused_call()\n"
    src += "    return stub\n"
    namespace: dict[str, Any] = {}
    exec(src, namespace)  # noqa: S102  # our own fixed source
    return _STUBS.setdefault(nfree, namespace["outer"]().__code__)


def _refuse_function(target: types.FunctionType, saved: list) -> None:
    for attr in ("__code__", "__defaults__", "__kwdefaults__"):
        saved.append((target, attr, getattr(target, attr), True))
    target.__code__ = _stub_code(len(target.__code__.co_freevars))
    target.__defaults__ = target.__kwdefaults__ = None


def _swap(targets: dict[str, Any], saved: list) -> None:
    """Swap the code of ``targets`` for ``_refused_call``'s, noting the originals in ``saved``."""
    for name, target in targets.items():
        if isinstance(target, type):
            had = "__init__" in target.__dict__
            saved.append((target, "__init__", target.__dict__.get("__init__"), had))
            target.__init__ = _refusing_init  # type: ignore[misc]
            # Every method refuses too: an instance made without ``__init__``
            # (``object.__new__(cls)``, its attributes set by hand) gets nothing from it.
            for value in list(vars(target).values()):
                if isinstance(value, staticmethod | classmethod):
                    value = value.__func__
                elif isinstance(value, property):
                    value = value.fget
                if isinstance(value, types.FunctionType) and value is not _refusing_init:
                    _refuse_function(value, saved)
        elif isinstance(target, types.FunctionType):
            _refuse_function(target, saved)
        else:
            raise TypeError(f"cannot refuse {name}")


def _modules_of(targets: dict[str, Any]) -> list[types.ModuleType]:
    """The modules that define ``targets``: a fresh copy of one would hold them unrefused."""
    names = {getattr(t, "__module__", None) for t in targets.values()}
    return [sys.modules[n] for n in sorted(n for n in names if n in sys.modules)]


@contextlib.contextmanager
def refuse(targets: dict[str, Any], allowed: str = "-") -> Iterator[None]:
    """Make each callable in ``targets`` (display name -> function or class) raise ``Refused``.

    A function's code object is swapped, so every alias the learner made of it (``from
    torch.distributed import all_reduce as ar``) refuses too; a class refuses construction,
    and each of its own methods refuses (an instance made with ``object.__new__`` too).
    Meanwhile ``course.grading.guard`` refuses a fresh copy of their modules, another
    program and ``ctypes``. Restored on exit, except in a sealed rank (``guard.seal``)."""
    saved: list[tuple[Any, str, Any, bool]] = []
    _ACTIVE.append((sorted(targets), allowed))
    refusal = None
    try:
        _swap(targets, saved)
        if targets:
            refusal = guard.push(sorted(targets), allowed, _modules_of(targets))
        yield
    finally:
        if refusal is not None:
            guard.pop(refusal)
        _ACTIVE.pop()
        # A sealed rank keeps what it refused: the seal cannot tell an original from a forgery.
        for obj, attr, value, had in [] if guard.sealed() else reversed(saved):
            if had:
                setattr(obj, attr, value)
            else:
                delattr(obj, attr)


def refuse_for_life(targets: dict[str, Any], allowed: str = "-") -> None:
    """``refuse`` for the rest of this process (a graded rank): the originals are dropped, so
    nothing left in the process can bring them back, and the guard's refusal is locked."""
    _ACTIVE.append((sorted(targets), allowed))
    _swap(targets, [])
    if targets:
        guard.push(sorted(targets), allowed, _modules_of(targets), locked=True)


@contextlib.contextmanager
def refusing(probe: Callable) -> Iterator[None]:
    """``refuse`` what ``probe`` declares in its ``refuses`` attribute (a function that returns
    ``(targets, allowed)``: torch's own ready-made answer to the exercise, e.g. its
    ``DistributedDataParallel`` for a DDP written from scratch), or nothing. A graded rank
    (``course.grading.rankserve``) enters it before the learner's objects are unpickled and
    keeps it for the rank's life (``refuse_for_life_of``); ``LocalLearner`` around each call."""
    declared = getattr(probe, "refuses", None)
    if declared is None:
        yield
        return
    targets, allowed = declared()
    with refuse(targets, allowed):
        yield


def refuse_for_life_of(probe: Callable) -> None:
    """``refuse_for_life`` what ``probe`` declares in its ``refuses`` attribute, or nothing."""
    declared = getattr(probe, "refuses", None)
    if declared is not None:
        refuse_for_life(*declared())
