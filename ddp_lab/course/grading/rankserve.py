"""One rank of a graded exercise, in its sandbox: the rank's side of ``rankhost.RankPool``.

Started by ``RankPool`` as ``python -m ddp_lab.course.grading.rankserve`` in a sandbox of its
own, with a rank's view of the package (``course.grading.view``: no reference implementation,
no oracle, no concept key, no grading machinery). It imports torch, says ``ready``, then
serves one request per case from its stdin: the probe's name, its rank, the world size, the
port and only this rank's input (``course.grading.wire`` data). It joins the case's gloo group, locks
the collectives a hand-written-collective exercise may not use (``checks.lockdown``), seals the
process (``guard.seal``: no function of ddp_lab or torch gets another code or other defaults),
and only then loads the learner's objects (the blob the runner handed out) and runs the probe,
found in the table built before ``ready`` (``probe_table``), not by a module attribute the
learner's code could have replaced; the reply is data, or the error. The verdict process kills
it after the exercise.

A request with ``steps`` (the grader counts the ranks' bytes, ``course.grading.traffic``, and the
probe runs the learner's code once per input: ``per_call``) runs in lockstep with the grader:
the rank says ``joined`` once its group is set up and waits for ``go`` before any of the
learner's code runs (the grader then notes the group's connections, from outside), and after
each call of the learner's code it says ``done`` and waits for ``go`` again (the grader then
counts what that call moved). What the rank says is only *when* to look: the counts are the
kernel's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from ddp_lab.course.grading import freeze, wire

REQUEST_LIMIT = wire.MAX_BYTES + 4096  # one request line, read by the rank
STARTUP_S = 600  # the grader's token comes first, as the rank starts (``rankhost.STARTUP_S``)
_REFUSING: set = set()  # the refusals this rank entered, never left (``_serve``)


def protection(probe: Callable) -> tuple:
    """What a rank enters before ``probe`` runs any of the learner's code, for the rank's life:
    the lock (``collectives_allowed``) and the refusals (``refuses``), as a key to compare.

    ``RankPool`` reuses ranks only for a probe of the same key: the learner's code that ran in
    them under another key (unlocked, say) could have left behind what undoes a protection
    entered later in the same process (``lockdown.lock`` replaced, a thread waiting), and what
    a rank entered it keeps (a lock no later probe could lift)."""
    allowed = getattr(probe, "collectives_allowed", None)
    refuses = getattr(probe, "refuses", None)
    return (
        None if allowed is None else tuple(sorted(allowed)),
        None if refuses is None else f"{refuses.__module__}:{refuses.__qualname__}",
    )


# --- in the verdict process (RankPool): a probe, by name ---


def per_call_of(probe: str, inputs: list) -> bool:
    """Whether ``probe`` calls the learner's code once per input (``per_call``), and every
    rank has the same number of inputs."""
    from ddp_lab.course.grading.learner import resolve_probe

    try:
        found = resolve_probe(probe)
    except (ImportError, AttributeError, ValueError):
        return False
    if getattr(found, "per_call", False) is not True:
        return False
    return all(isinstance(x, list) for x in inputs) and len({len(x) for x in inputs}) == 1


def protection_of(probe: str) -> tuple:
    """``rankserve.protection`` of ``probe`` (a key of its own where it cannot be found)."""
    from ddp_lab.course.grading.learner import resolve_probe

    try:
        return protection(resolve_probe(probe))
    except (ImportError, AttributeError, ValueError):
        return ("?", probe)


def probe_table() -> tuple:
    """Every probe this rank could be asked for, as ``(name, function)`` pairs: the functions
    defined at the top of each checker module the rank can import (``course.grading.view``
    hides some). Built once, before the rank says ``ready`` and so before any of the learner's
    objects is loaded: the learner's code that replaces a module attribute later
    (``checks.probes.probe_gather_forward = fake``, review 9) changes nothing the rank calls by
    name. A tuple, not a dict: nothing in the process can add to it."""
    import importlib
    import pkgutil
    import types

    from ddp_lab.course.grading import checks

    pairs = []
    for info in sorted(pkgutil.iter_modules(checks.__path__), key=lambda m: m.name):
        name = f"{checks.__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001  # hidden in a rank (ImportError), or not importable here
            continue
        for attr, value in sorted(vars(module).items()):
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                pairs.append((f"{name}:{attr}", value))
    return tuple(pairs)


def _probe_of(table: tuple, name: str) -> Callable:
    """The probe named ``name`` in ``table`` (``probe_table``); ValueError if it has none."""
    for known, function in table:
        if known == name:
            return function
    raise ValueError(f"not a probe: {name}")


def _serve(
    request: dict,
    send: Callable[[dict], None],
    reader: wire.LineReader,
    table: tuple,
    frozen: tuple = (),
    encode: Callable = wire.dumps,
    changed: Callable = freeze.changed,
) -> tuple[dict, tuple]:
    """Run the probe on this rank's input; the reply (data or the error), and ``frozen``: the
    snapshot of the rank's modules (``course.grading.freeze``), taken at the seal and kept by
    ``main`` (a local of its frame, out of the learner's reach). With ``steps``, in lockstep
    with the grader (``send`` a step, wait for its ``go`` on ``reader``). ``encode``: the
    rank's ``wire.encoder``, made before any learner code ran. ``changed`` is bound here, as a
    default the seal keeps: a module attribute could be replaced."""
    import datetime
    import pickle

    import torch.distributed as dist

    from ddp_lab import i18n
    from ddp_lab.course.grading import guard
    from ddp_lab.course.grading.learner import _refusing_init as refusing_init
    from ddp_lab.course.grading.learner import error_of, refuse_for_life_of, stub_codes

    rank, world_size = int(request["rank"]), int(request["world_size"])
    i18n.set_language(str(request.get("lang", "en")))
    data = wire.loads(request["data"])
    probe = _probe_of(table, str(request["probe"]))
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(int(request["port"])),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    try:
        if dist.is_initialized():  # the previous case's group: every rank has answered it
            dist.destroy_process_group()
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world_size,
            # Past the verdict's patience: a hang is then the verdict's TimeoutError (killed
            # ranks), not a gloo error in whichever rank gave up first.
            timeout=datetime.timedelta(seconds=float(request.get("timeout", 60)) + 30),
        )
    except Exception as exc:  # noqa: BLE001  # the grader's set-up, not the learner's code
        return {
            "error": {"type": type(exc).__name__, "message": str(exc)[:500]},
            "setup": True,
        }, frozen
    try:
        allowed = getattr(probe, "collectives_allowed", None)
        if allowed is not None:  # a hand-written-collective exercise: lock the others first
            from ddp_lab.course.grading.checks import lockdown

            lockdown.lock(allowed)
        refuses = protection(probe)[1]
        if refuses not in _REFUSING:
            # torch's own answer to the exercise (its DDP, ZeRO optimizer, bf16 hook), the
            # checker's oracle: off before any learner code runs (the blob's unpickling
            # included), for the rank's life (a graded rank serves one exercise, whose
            # checker may use several probes: each declared refusal, once; ``RankPool``
            # reuses a rank only for the same one). The originals are dropped and the
            # guard's audit hook (course.grading.guard) locked: no code in this process can
            # lift it or load a fresh copy of what it refuses.
            _REFUSING.add(refuses)
            refuse_for_life_of(probe)
        # From here to the rank's end, no function of ddp_lab or torch (the probe just
        # resolved included) gets another code or other defaults: the blob's unpickling
        # runs the learner's code in this process (review 9: a ``__reduce__`` swapped the
        # probe's ``__code__`` for one that reported an untouched input).
        if not frozen:  # the first case: what the modules hold now, before any learner code
            frozen = freeze.take()
        guard.seal(stubs=stub_codes())
    except Exception as exc:  # noqa: BLE001  # the grader's set-up, not the learner's code
        return {
            "error": {"type": type(exc).__name__, "message": str(exc)[:500]},
            "setup": True,
        }, frozen
    stubs = (refusing_init,)  # what the grader's own refusal sets in a sealed rank
    steps = request.get("steps") is True and isinstance(data, list)
    if steps:
        send({"joined": "null"})
        _wait_go(reader)
    try:
        # The learner's code first runs here (a hidden module's import fails here).
        objects = pickle.loads(Path("blob.pkl").read_bytes())  # noqa: S301  # in the sandbox
        if not steps:
            result = probe(rank, objects, data)
            moved = changed(frozen, stubs)
            return (_replaced(moved), frozen) if moved else ({"ok": encode(result)}, frozen)
        out = []
        for k, item in enumerate(data):  # one call of the learner's code per step
            out.extend(probe(rank, objects, [item]))
            moved = changed(frozen, stubs)
            if moved:
                return _replaced(moved), frozen
            send({"done": encode(k)})
            _wait_go(reader)
        return {"ok": encode(out)}, frozen
    except Exception as exc:  # noqa: BLE001  # the learner's code raised
        err = error_of(exc)
        return {"error": {"type": err.type_name, "message": err.message[:500]}}, frozen


def _replaced(names: list[str]) -> dict:
    """The reply of a rank whose modules no longer hold what they held at the seal: the
    learner's error, and the rank ends after sending it (``main``)."""
    from ddp_lab.i18n import _t

    message = _t(
        "your code replaced {names} in the grading process; a graded rank's modules must "
        "stay as they were.",
        names=", ".join(names),
    )
    return {"error": {"type": "Refused", "message": message[:500]}, "replaced": True}


def _wait_go(reader: wire.LineReader) -> None:
    """Wait for the grader's ``go``; end the rank if the grader is gone."""
    while True:
        try:
            line = reader.readline(3600)
        except EOFError:
            os._exit(0)
        if line is None:
            os._exit(0)
        if line.strip() == b"go":
            return


def main() -> int:
    from ddp_lab.runtime._process import set_parent_death_signal
    from ddp_lab.runtime._rank import keep_process_groups

    set_parent_death_signal(signal.SIGKILL)
    reader = wire.LineReader(0, REQUEST_LIMIT)
    proto_out = os.dup(1)
    log = os.open("output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", closefd=False)
    import torch.distributed  # noqa: F401  # before "ready": the import is the grader's time

    import ddp_lab  # noqa: F401

    keep_process_groups()  # gloo groups are dropped without destructors (see _rank)
    table = probe_table()  # before "ready", before any blob: the grader's time
    # The grader's first line: this rank's token, which each reply carries. The pipe to the
    # grader is a descriptor of this process, which the learner's code can write to (the
    # token tells the grader's reader which lines are the rank's); the token is a local of
    # this frame and a default of ``send``, out of reach without frames (``scan`` flags those).
    first = reader.readline(STARTUP_S)
    if first is None:
        return 1
    token = str(json.loads(first)["token"])
    # What the loop calls is bound here, before any learner code: their modules' attributes
    # could be replaced later, for a moment even (a finalizer, a thread: put back before
    # ``course.grading.freeze`` looks), the defaults of a function defined in the package
    # cannot (``guard.seal``), and neither can what ``wire.encoder`` binds.
    encode = wire.encoder()

    def send(
        reply: dict,
        out: int = proto_out,
        encode: Callable = encode,
        write: Callable = os.write,
        view: Callable = memoryview,
        token: str = token,
    ) -> None:
        reply["token"] = token
        data = view(encode(reply).encode() + b"\n")
        while data:
            data = data[write(out, data) :]

    serve, parse, leave, frozen = _serve, json.loads, os._exit, ()
    send({"ready": "null"})
    # Serve requests until the verdict kills us (rank 0 hosts the store of each case).
    while True:
        try:
            line = reader.readline(3600)
        except EOFError:
            break
        if line is None:
            break
        reply, frozen = serve(parse(line), send, reader, table, frozen, encode)
        send(reply)
        if "replaced" in reply:  # the learner's code changed the rank's modules: serve no more
            break
    leave(0)


if __name__ == "__main__":
    sys.exit(main())
