"""The part of a refusal that learner code cannot take off: a PEP 578 audit hook.

``learner.refuse`` swaps the code of torch's ready-made answer (its ``DistributedSampler``,
``DistributedDataParallel``, ...) so that calling it raises ``Refused``. The swap changes the
objects already imported; a *fresh* copy of their module is not swapped. While a refusal is
active, the hook added here (once per process, ``sys.addaudithook``: Python code cannot remove
an audit hook) refuses the roads to a fresh copy:

- running the refused module's code again: an ``exec`` of a code object, or a ``compile``, whose
  file is that module's (a re-import after ``sys.modules`` lost it, ``importlib``'s
  ``spec_from_file_location`` + ``exec_module``, ``runpy``), and the ``import`` event of it;
- reading its source or cached bytecode (``open``: the text copied and run under another name),
  matched by inode, so a link to the file is the file, and opening their folders (a folder's
  descriptor would open them by a name relative to it); raised as ``RefusedFile``, a
  ``PermissionError``, so ``linecache`` and ``traceback`` only show no source line (``open``
  and ``os.open`` give the hook the path they use, ``__fspath__`` already applied);
- another Python, where nothing is refused: ``subprocess``, ``os.system``, ``os.exec*``,
  ``os.posix_spawn*``, a sub-interpreter. ``multiprocessing`` starts its ``spawn`` and
  ``forkserver`` processes with ``_posixsubprocess.fork_exec``, which raises no audit event
  (Python 3.11): every reference to it is replaced by ``_fork_exec``, which raises one, and a
  fresh import of ``_posixsubprocess`` is refused. A fork keeps the hook and its refusal;
- editing the interpreter's memory, or finding the original code the swap keeps: ``ctypes``,
  a file of ``/proc`` opened for writing (``/proc/self/mem``) and ``gc.get_objects`` /
  ``get_referrers`` / ``get_referents``;
- in a locked refusal only: a socket of any family but IP (``INET``), a channel between
  ranks that the grader's byte count would not see.

A graded rank also seals its process (``seal``) before the learner's objects load, for its life:
no function of ddp_lab or torch may get another ``__code__``, ``__defaults__`` or
``__kwdefaults__`` (the probe the rank resolved included; review 9 swapped it as the blob
loaded). Setting a class's attribute raises no audit event (CPython 3.11): not covered.

``checks.lockdown.lock`` pushes a refusal of its own, locked, for a hand-written-collective
rank (no module of its own to protect: the lock's registration lives in C++, which ``ctypes``,
a ``/proc`` write or another program could reach).

torch itself uses ``ctypes`` in one place a graded exercise reaches: on a CUDA build,
``torch.cuda.device_count()`` asks NVML through ``ctypes`` on every call until CUDA is
initialised (``torch/cuda/__init__.py``: ``device_count``, ``_raw_device_count_nvml``), and
``torch.random.fork_rng``, ``torch.cuda.get_rng_state_all``, the course's device rule
(``runtime/device.visible_gpus``) and a learner's own device choice count GPUs. ``push``
counts them first and stores the count where ``device_count`` reads it
(``_settle_gpu_count``); a CPU build of torch, as in CI, never takes that road.

What the hook decides with is immune to module attributes: its state and everything it calls
are its own default arguments (an immutable tuple of refusals; builtins bound at install).
Setting the hook's or ``_fork_exec``'s ``__defaults__`` / ``__code__`` raises an audit event
that the hook checks: a change that drops a refusal made for a rank's life (``locked``), or
anything but the state, is refused. Outside a refusal the hook returns after that one check
(about 0.45 us an audit event, against 0.03 us with no hook).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Iterable
from pathlib import Path

from ddp_lab.i18n import _t


class Refused(RuntimeError):
    """The learner's code called a function that this exercise asks them to write."""


class RefusedFile(PermissionError, Refused):
    """A refused module's file opened: a ``PermissionError``, so ``linecache`` and
    ``traceback`` show no source line instead of failing."""


# Events that start another program (or interpreter), where no refusal exists.
PROGRAMS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "cpython.PyInterpreterState_New",
        "ddp_lab.fork_exec",  # raised by ``_fork_exec``
    }
)
# Events that read objects the learner never needs (the refused originals among them).
MEMORY = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
# The socket families a locked rank may open (``socket.__new__``'s family): the grader counts
# IP bytes from outside (``traffic.py``). An abstract unix socket (or a socketpair, or a
# socket around an inherited descriptor, family -1) is a channel between ranks that no
# counter sees, so a locked refusal refuses every other family (review 8: a ring's bytes sent
# as filler while the data went through ``AF_UNIX``, 05.ring 5/5, 10.fsdp_reduce 2/2).
INET = frozenset({2, 10})  # AF_INET, AF_INET6 (Linux)

# The attributes of a function whose change raises an audit event (funcobject.c); a sealed
# process refuses them on the functions of the sealed packages (``seal``).
SEALED_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})

_LOCK = threading.Lock()
_HELD: list = []  # the real ``_posixsubprocess.fork_exec``; emptied for good by a locked refusal
_SETTLED: list = []  # the refusal that stored torch's GPU count (``_settle_gpu_count``), if any


def _fork_exec(*args: object) -> object:
    """``_posixsubprocess.fork_exec`` with an audit event, so a refusal can refuse it."""
    sys.audit("ddp_lab.fork_exec")
    return _HELD[0](*args)


def _message(kind: str, state: tuple, detail: str) -> str:
    if kind == "sealed":
        return _t(
            "changing {what} of a function of ddp_lab or torch is not allowed while grading.",
            what=detail,
        )
    if kind == "memory":
        return _t("opening {what} (a process's memory) is not allowed while grading.", what=detail)
    if kind == "hook" or not state:
        return _t(
            "this exercise asks you to write it yourself: the refusal's audit hook cannot be changed."
        )
    names, allowed = state[-1][0], state[-1][1]
    name = " / ".join(names)
    if kind == "fresh":
        return _t(
            "this exercise asks you to write it yourself: loading {module} again is not "
            "allowed while {name} is refused (use {allowed}).",
            module=detail,
            name=name,
            allowed=allowed,
        )
    if kind == "program":
        return _t(
            "this exercise asks you to write it yourself: starting another program is not "
            "allowed while {name} is refused (use {allowed}).",
            name=name,
            allowed=allowed,
        )
    return _t(
        "this exercise asks you to write it yourself: {what} is not allowed while {name} is "
        "refused (use {allowed}).",
        what=detail,
        name=name,
        allowed=allowed,
    )


def _audit(
    event: str, args: tuple, state: tuple = (), me: object = None, kit: tuple = (), seal: tuple = ()
) -> None:
    """The audit hook. ``state``: the active refusals, innermost last, each ``(names, allowed,
    module names, {(st_dev, st_ino)}, locked, ((st_dev, st_ino), module name) pairs)``;
    ``me``: this function; ``kit``: ``(_message, Refused, RefusedFile, os.stat, type, tuple,
    PROGRAMS, MEMORY, getattr, _fork_exec, /proc's st_dev, INET, str)``; ``seal``: empty, or
    (``seal``) ``(module names, module prefixes, source folders, str.startswith,
    SEALED_ATTRS, the refusal's stub codes)``. No global
    name is read here: a learner can rebind those."""
    if event == "object.__setattr__" or event == "object.__delattr__":
        if args[0] is not me and (not kit or args[0] is not kit[9]):
            if seal and args[1] in seal[4]:
                # a function's __code__ / __defaults__ / __kwdefaults__ (funcobject.c)
                module = kit[8](args[0], "__module__", None)
                file = kit[8](kit[8](args[0], "__code__", None), "co_filename", None)
                if (
                    kit[4](module) is kit[12] and (module in seal[0] or seal[3](module, seal[1]))
                ) or (kit[4](file) is kit[12] and seal[3](file, seal[2])):
                    # What only makes it refuse stays allowed (the grader's own ``refuse``
                    # in a probe): a stub's code made before the seal, no defaults.
                    if args[1] == "__code__":
                        for stub in seal[5]:
                            if args[2] is stub:
                                return
                    elif event == "object.__delattr__" or args[2] is None:
                        return
                    raise kit[1](kit[0]("sealed", state, args[1]))
            return
        ok = (
            event == "object.__setattr__"
            and args[0] is me
            and args[1] == "__defaults__"
            and kit[4](args[2]) is kit[5]
        )
        if ok:
            try:
                new_state, new_me, new_kit, new_seal = args[2]
            except BaseException:  # noqa: BLE001  # not our shape: refused below
                new_state, new_me, new_kit, new_seal = (), None, None, None
            ok = new_me is me and new_kit is kit and kit[4](new_state) is kit[5]
            ok = ok and kit[4](new_seal) is kit[5] and (not seal or new_seal is seal)
            for old in state:  # a refusal made for a rank's life stays
                if ok and old[4]:
                    ok = False
                    for new in new_state:
                        if new is old:
                            ok = True
        if not ok:
            raise kit[1](kit[0]("hook", state, ""))
        return
    if not state:
        if seal and event == "open":
            # A sealed rank with no refusal: its memory holds the rank's token all the same.
            try:
                st = kit[3](args[0])
            except BaseException:  # noqa: BLE001  # not a file here: nothing refused
                return
            if st.st_dev == kit[10] and (args[2] & 3 or st.st_mode & 511 == 384):
                raise kit[2](kit[0]("memory", state, args[0]))
        return
    if event == "import":
        for g in state:
            if args[0] in g[2]:
                raise kit[1](kit[0]("fresh", state, args[0]))
        if args[0] == "_posixsubprocess":
            raise kit[1](kit[0]("program", state, ""))
        return
    if event == "exec" or event == "compile" or event == "open":
        if event == "exec":  # (code object,)
            path = kit[8](args[0], "co_filename", None)
        elif event == "compile":  # (source, filename)
            path = args[1]
        else:  # open: (path or fd, mode, flags)
            path = args[0]
        if path is None:
            return
        try:
            st = kit[3](path)
        except BaseException:  # noqa: BLE001  # "<string>", a closed fd: not a refused file
            return
        key = (st.st_dev, st.st_ino)
        if event == "open" and st.st_dev == kit[10] and (args[2] & 3 or st.st_mode & 511 == 384):
            # /proc/self/mem opened for writing edits the interpreter's memory, like ctypes;
            # read, it holds what the process keeps from its own Python code (a graded rank's
            # token: ``rankserve``). A process's ``mem`` is its only /proc file of mode 0600.
            raise kit[2](kit[0]("other", state, "/proc"))
        for g in state:
            if key in g[3]:
                module = "?"
                for k, name in g[5]:
                    if k == key:
                        module = name
                error = kit[2] if event == "open" else kit[1]
                raise error(kit[0]("fresh", state, module))
        return
    if event == "socket.__new__" and args[1] not in kit[11]:  # (self, family, type, proto)
        for g in state:
            if g[4]:
                raise kit[1](kit[0]("other", state, "socket(family=" + kit[12](args[1]) + ")"))
        return
    if event in kit[6]:
        raise kit[1](kit[0]("program", state, ""))
    if event in kit[7] or event.startswith("ctypes."):
        raise kit[1](kit[0]("other", state, event))


def _files(module: types.ModuleType) -> list[tuple[int, int]]:
    """The inodes of ``module``'s source, of its folders and of its cached bytecode files."""
    file = getattr(module, "__file__", None)
    if not file:
        return []
    path = Path(file)
    # Its folders too: a folder's descriptor opens the file by a relative name
    # (``os.open(name, dir_fd=...)``), which the hook cannot tell from a file of that name here.
    paths = [path, path.parent, path.parent / "__pycache__"]
    paths += path.parent.glob(f"__pycache__/{path.stem}.*.pyc")
    keys = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        keys.append((st.st_dev, st.st_ino))
    return keys


def _install() -> None:
    """Add the hook once per process, and route every ``fork_exec`` through ``_fork_exec``."""
    if _audit.__defaults__ and _audit.__defaults__[1] is _audit:
        return
    import _posixsubprocess

    real = _posixsubprocess.fork_exec
    if real is not _fork_exec:
        _HELD[:] = [real]
        # ``subprocess`` keeps its own name for it (``_fork_exec``), and so may others.
        for module in list(sys.modules.values()):
            names = getattr(module, "__dict__", None)
            if isinstance(names, dict):
                for name, value in list(names.items()):
                    if value is real:
                        names[name] = _fork_exec
    try:
        proc = os.stat("/proc").st_dev
    except OSError:
        proc = -1
    kit = (_message, Refused, RefusedFile, os.stat, type, tuple, PROGRAMS, MEMORY, getattr)
    _audit.__defaults__ = ((), _audit, (*kit, _fork_exec, proc, INET, str), ())
    sys.addaudithook(_audit)


def _settle_gpu_count() -> bool:
    """Count the GPUs now, before a refusal, and keep the count where torch reads it first.

    Until CUDA is initialised, torch's ``device_count`` asks NVML through ``ctypes`` on every
    call and keeps nothing (the number may change with ``CUDA_VISIBLE_DEVICES`` until then), so
    under a refusal the hook would refuse torch's own count. The count taken here goes into
    ``torch.cuda._cached_device_count``, which ``device_count`` returns when it is set. Returns
    whether it was stored here (``pop`` of the refusal clears it again if CUDA is still not
    initialised, so that a later ``CUDA_VISIBLE_DEVICES`` counts as torch intends).
    """
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or getattr(cuda, "_cached_device_count", 0) is not None:
        return False  # no torch, torch keeps the count already, or another torch than ours
    if not cuda._is_compiled():
        return False  # a CPU build: device_count() is 0 without NVML
    count = cuda.device_count()
    if cuda._cached_device_count is not None:
        return False  # CUDA was initialised: torch keeps the count itself
    cuda._cached_device_count = count
    return True


def _unsettle_gpu_count() -> None:
    """Undo ``_settle_gpu_count``, unless CUDA was initialised meanwhile (torch then keeps the
    same count itself)."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and not getattr(cuda, "_initialized", True):
        cuda._cached_device_count = None


def push(
    names: Iterable[str], allowed: str, modules: Iterable[types.ModuleType], locked: bool = False
) -> tuple:
    """Start refusing fresh copies of ``modules``, other programs and ``ctypes`` in this
    process; ``locked``: for the process's life (``pop`` of it is refused, the real
    ``fork_exec`` is dropped). Returns the refusal, for ``pop``."""
    import linecache

    modules = [m for m in modules if m is not None]
    files = [(key, m.__name__) for m in modules for key in _files(m)]
    for m in modules:  # source lines read before the refusal would be a copy of it
        linecache.cache.pop(getattr(m, "__file__", None) or "", None)
    refusal = (
        tuple(names),
        allowed,
        frozenset(m.__name__ for m in modules),
        frozenset(key for key, _ in files),
        bool(locked),
        tuple(files),
    )
    with _LOCK:
        _install()
        if _settle_gpu_count():
            _SETTLED[:] = [refusal]
        state, me, kit, seal = _audit.__defaults__
        _audit.__defaults__ = ((*state, refusal), me, kit, seal)
        if locked:
            _HELD.clear()
    return refusal


def pop(refusal: tuple) -> None:
    """End ``refusal`` (raises ``Refused`` if it was made for the process's life)."""
    with _LOCK:
        state, me, kit, seal = _audit.__defaults__
        _audit.__defaults__ = (tuple(g for g in state if g is not refusal), me, kit, seal)
        if _SETTLED and _SETTLED[0] is refusal:
            _SETTLED.clear()
            _unsettle_gpu_count()


def seal(packages: Iterable[str] = ("ddp_lab", "torch"), stubs: Iterable[object] = ()) -> None:
    """For the process's life, refuse changing the ``__code__``, ``__defaults__`` or
    ``__kwdefaults__`` of a function of ``packages`` (a graded rank, before the learner's
    objects are loaded: their code could otherwise swap the code of the very probe the rank
    resolved, or of a torch function a probe checks with; review 9).

    A function counts as the packages' when its ``__module__`` names one of them or a module
    in them, or when its code comes from a file in their folders (a ``__module__`` is set
    freely, a code object's file is not). Functions defined later (a lazy import) are
    covered too; the attributes of *types* raise no audit event (CPython 3.11) and are not
    covered. What only makes a function refuse stays allowed: its code replaced by one of
    ``stubs`` (``learner.stub_codes``, made before the seal), its defaults set to None or
    removed; the grader's own ``learner.refuse`` in a probe does that, and restores nothing in
    a sealed process (``sealed``). Idempotent; the first seal stays."""
    import importlib

    packages = tuple(packages)
    folders = []
    for name in packages:
        module = importlib.import_module(name)
        for folder in getattr(module, "__path__", ()):
            folders.append(os.path.join(folder, ""))
            folders.append(os.path.join(os.path.realpath(folder), ""))
    with _LOCK:
        _install()
        state, me, kit, before = _audit.__defaults__
        if before:
            return
        prefixes = tuple(f"{p}." for p in packages)
        new = (
            frozenset(packages),
            prefixes,
            tuple(folders),
            str.startswith,
            SEALED_ATTRS,
            tuple(stubs),
        )
        _audit.__defaults__ = (state, me, kit, new)


def sealed() -> bool:
    """Whether this process is sealed (``seal``)."""
    defaults = _audit.__defaults__
    return bool(defaults and defaults[1] is _audit and defaults[3])
