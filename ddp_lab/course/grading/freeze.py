"""What a graded rank's modules and classes held when it was sealed, and whether they still do.

``guard.seal`` refuses another ``__code__`` or ``__defaults__`` for a function of ddp_lab or
torch once the rank is about to load the learner's objects. Setting a module's global or a
class's attribute raises no audit event (CPython 3.11), so the learner's code could still
replace what a probe finds by name: ``ddp_lab.comm_debug.watch_c10d`` swapped for a watcher
that sees nothing got a blocking ring 5/5 in 05.ring, ``checks.probes._own_apply`` swapped got
a wrong 03.gather 3/3, and ``checks.ch07._watching`` wrapped forged 07.bucketed's record
(review 10). So the rank notes, right before the seal, every function, class, module, code
object and tuple that the modules of ddp_lab and torch (and ``builtins``, ``json``,
``pickle``) hold, and the methods and properties of their classes; after each probe it
compares (``changed``), and a rank where something was replaced answers that instead of the
probe's result and ends.

What this does not see: a replacement undone before the probe returns (the probes bind what
they call at import, as defaults the seal keeps: ``checks.probes``), a mutable object changed
in place (a list or a dict a module holds), and what the learner's own modules hold. Values
that are data (numbers, strings, lists, dicts) are not compared: torch updates some as it runs
(``distributed_c10d._group_count``).
"""

from __future__ import annotations

import os
import sys
import types

PACKAGES = ("ddp_lab", "torch")
ALSO = ("builtins", "json", "pickle")  # what the rank's own loop and the probes call
# Besides callables: the values whose replacement changes what a probe does.
_KEPT = (types.ModuleType, types.CodeType, tuple, frozenset, property, staticmethod, classmethod)
_HEAP = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class whose attributes Python code can set
_MISSING = object()
# Classes whose attributes torch itself sets as it imports more of itself: each artifact type
# that registers (``CacheArtifactFactory.register``, ``torch/compiler/_cache.py``) gives
# ``CacheInfo`` a property. Nothing the grader calls. Torch's Python also adds methods to
# its C++ classes when a module loads (``torch.distributed.tensor`` gives
# ``torch._C._distributed.Placement`` its ``__eq__``): additions to those are not compared.
_SKIPPED = frozenset({"torch.compiler._cache.CacheInfo"})


def _kept(value: object) -> bool:
    # ``type(value)``, not ``isinstance``: no attribute of the value is read (some of torch's
    # deprecated objects warn when theirs are)
    return callable(value) or type(value) in _KEPT


def take(packages: tuple[str, ...] = PACKAGES, also: tuple[str, ...] = ALSO) -> tuple:
    """The snapshot, for ``changed``: ``torch_wrappers()`` and torch's folder; ``(get, owner, name, value)`` for
    each kept entry of each loaded module of ``packages`` and ``also``, of each class they
    define, and of the keyword defaults of their functions (``get``: the bound ``get`` of the
    live namespace); and ``(namespace, owner, names, shadows)`` for each of those modules and
    classes, whose later names are additions (a class's new method hides its base's:
    ``torch.Tensor.detach = f`` adds to ``torch.Tensor``; a module's new global hides a
    builtin of that name for its functions). Tuples only: the learner's code cannot add to it
    or change it in place."""
    import builtins

    prefixes = tuple(f"{p}." for p in packages)
    entries: list[tuple] = []
    spaces: list[tuple] = []
    classes: set[int] = set()
    shadowed = frozenset(vars(builtins))
    for name, module in list(sys.modules.items()):
        if module is None or not (name in packages or name in also or name.startswith(prefixes)):
            continue
        namespace = vars(module)
        get = namespace.get
        if name != "builtins":
            spaces.append((namespace, name, frozenset(namespace), shadowed))
        for key, value in list(namespace.items()):
            if _kept(value):
                entries.append((get, name, key, value))
            if issubclass(type(value), type) and id(value) not in classes:
                classes.add(id(value))
                owner = str(value.__dict__.get("__module__", ""))
                where = f"{owner}.{value.__qualname__}"
                mine = owner in packages or owner.startswith(prefixes)
                if mine and value.__flags__ & _HEAP and where not in _SKIPPED:
                    mapping = vars(value)
                    entries += [(mapping.get, where, k, v) for k, v in mapping.items() if _kept(v)]
                    if not owner.startswith("torch._C"):  # see _SKIPPED: C++ classes
                        spaces.append((mapping, where, frozenset(mapping), None))
    # A function's keyword defaults are a dict that code can change in place (no audit event,
    # unlike setting ``__kwdefaults__``): those of the packages' functions are noted too.
    for _get, _owner, _key, value in list(entries):
        kw = getattr(value, "__kwdefaults__", None) if type(value) is types.FunctionType else None
        if kw and str(value.__module__).startswith(packages):
            where = f"{value.__module__}.{value.__qualname__}()"
            entries += [(kw.get, where, k, v) for k, v in kw.items()]
    import torch

    folder = os.path.join(os.path.dirname(torch.__file__), "")
    return torch_wrappers(), folder, tuple(entries), tuple(spaces)


def torch_wrappers() -> tuple[types.CodeType, ...]:
    """The code of the wrappers torch itself puts around a function already in place, each
    calling the function it wraps (held in its closure):

    - ``torch._disable_dynamo``'s: importing ``torch._dynamo`` (lazily, the first time
      something needs it) wraps ``torch.manual_seed`` (``torch/_dynamo/__init__.py``);
    - ``Optimizer.profile_hook_step``'s: the first optimizer of a class wraps the class's
      ``step`` (``Optimizer._patch_step_function``, ``torch/optim/optimizer.py``)."""
    import torch

    codes = []
    for make in (
        getattr(torch, "_disable_dynamo", None),
        getattr(torch.optim.Optimizer, "profile_hook_step", None),
    ):
        inner = make(_noop) if make is not None else None
        if type(inner) is types.FunctionType:
            codes.append(inner.__code__)
    return tuple(codes)


def _noop() -> None:
    return None


def _torch_made(
    now: object,
    wrappers: tuple,
    folder: str,
    _type: type = type,
    _function: type = types.FunctionType,
) -> bool:
    """Whether ``now`` is one of torch's wrappers (``torch_wrappers``) around a function of
    torch's own files: what torch puts in place as it runs, calling what was there."""
    if _type(now) is not _function:
        return False
    for code in wrappers:
        if now.__code__ is code:
            for cell in now.__closure__ or ():
                inner = cell.cell_contents
                if _type(inner) is _function and inner.__code__.co_filename.startswith(folder):
                    return True
    return False


def changed(
    snapshot: tuple,
    allowed: tuple = (),
    _missing: object = _MISSING,
    _len: object = len,
    _type: type = type,
    _kept_types: tuple = _KEPT,
    _torch_made: object = _torch_made,
    callable: object = callable,  # noqa: A002  # bound: the builtin could be replaced
) -> list[str]:
    """``owner.name`` of each entry of ``snapshot`` that holds another object now (or none),
    and of each name added where it hides another, at most 5. Not a change: a value in
    ``allowed`` (the grader's own refusing stubs, set in a sealed rank by
    ``learner.refuse``), or torch's own wrapper around a function of torch (``_torch_made``).
    Only the snapshot's bound ``get``s, the interpreter's own operations and what the
    defaults bind run here: a replaced builtin or global changes nothing of this function,
    whose defaults the seal keeps (positional ones: a tuple; a function's ``__kwdefaults__``
    is a dict that can be changed in place, which ``take`` notes too)."""
    found: list[str] = []
    wrappers, folder, entries, spaces = snapshot
    for namespace, owner, names, shadows in spaces:
        for key in namespace:
            if key in names or (shadows is not None and key not in shadows):
                continue
            value = namespace[key]
            if callable(value) or _type(value) in _kept_types:
                if not _torch_made(value, wrappers, folder):
                    found.append(f"{owner}.{key}")
    for get, owner, key, value in entries:
        now = get(key, _missing)
        if now is value or _torch_made(now, wrappers, folder):
            continue
        for stub in allowed:
            if now is stub:
                break
        else:
            found.append(f"{owner}.{key}")
    return found[:5] if _len(found) > 5 else found
