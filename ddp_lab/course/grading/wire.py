"""Data, never code: how the learner's process hands results to the grader.

The grader must not unpickle anything the learner's process produced (a pickle can run
code when it is loaded). Results cross as JSON of a few plain kinds, checked on the way in:
None, bool, int, float (also nan/inf), str, list, tuple, dict with str keys, and tensors
(dtype, shape and the raw bytes in base64). Anything else is refused with a clear error, so
a learner's object can never reach the grader's comparisons (no ``__eq__`` of theirs runs).

How it differs from ``torch.save``/pickle: no classes, no references, no code; sizes and
depth are bounded so that a result cannot exhaust the grader's memory.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

MAX_BYTES = 64 * 2**20  # one encoded message
BLOB_LIMIT = 48 * 2**20  # pickled graded objects: base64 makes them MAX_BYTES, one line
MAX_DEPTH = 32
_DTYPE_NAMES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
)


@functools.cache
def dtypes() -> dict[str, Any]:
    """The tensor dtypes that cross, by name. torch is imported here, at the first tensor,
    not with this module: the grader's verdict process imports it before it starts the
    learner's sandbox, and torch's import (seconds) would delay that start."""
    import torch

    return {name: getattr(torch, name) for name in _DTYPE_NAMES}


class WireError(ValueError):
    """A value that cannot cross, or a message that is not a valid encoding."""


def encoder() -> Callable[[Any], str]:
    """``dumps`` with everything it calls bound now, in its closure.

    A graded rank (``rankserve``) builds its encoder before any of the learner's code runs,
    and encodes its replies with it: the learner's code may have left something behind that
    runs later (a finalizer, a thread) and replaces a module attribute for a moment, put back
    before ``course.grading.freeze`` looks. ``dumps`` looked up ``base64.b64encode``,
    ``json.dumps`` (and the ``json.encoder`` functions it calls), builtins and the tensors'
    methods when it ran; an encoder made here calls the C functions it was given (``binascii``,
    ``_json``'s encoder, ``torch._C.TensorBase``'s methods, immutable types) and nothing that
    code can rebind. Tensors of a subclass are read as plain tensors (no ``__torch_function__``
    of theirs runs)."""
    import binascii
    import json.encoder

    isfinite, b2a, length, kind, inside = math.isfinite, binascii.b2a_base64, len, type, isinstance
    as_repr, as_list, error = repr, list, WireError

    def refuse_nan(value: Any) -> Any:
        raise error(f"a {kind(value).__name__} cannot be sent")

    # json.dumps(..., separators=(",", ":"), allow_nan=False), as the C encoder it builds
    write = json.encoder.c_make_encoder(
        None,
        refuse_nan,
        json.encoder.c_encode_basestring_ascii,
        None,
        ":",
        ",",
        False,
        False,
        False,
    )
    torch = sys.modules.get("torch")  # no tensor can exist before torch is imported
    if torch is not None:
        base = vars(torch._C.TensorBase)
        tensor, strided, plain = torch.Tensor, torch.strided, torch._C.DisableTorchFunctionSubclass
        detach, to_dense, cpu, contiguous = (
            base[n] for n in ("detach", "to_dense", "cpu", "contiguous")
        )
        reshape, view, numpy, numel = (base[n] for n in ("reshape", "view", "numpy", "numel"))
        layout, dtype, shape = (base[n].__get__ for n in ("layout", "dtype", "shape"))
        names, uint8 = {v: k for k, v in dtypes().items()}, torch.uint8
    else:
        tensor = ()  # isinstance(x, ()) is False

    def enc(obj: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise error("nested too deeply")
        # Exact types only: a subclass of int or str could carry methods of the learner's.
        t = kind(obj)
        if obj is None or t is bool or t is int or t is str:
            return obj
        if t is float:
            return obj if isfinite(obj) else {"__float__": as_repr(obj)}
        if t is list:
            return [enc(x, depth + 1) for x in obj]
        if t is tuple:
            return {"__tuple__": [enc(x, depth + 1) for x in obj]}
        if t is dict:
            for k in obj:
                if kind(k) is not str:
                    raise error("dict keys must be str")
                if k.startswith("__") and k.endswith("__"):
                    raise error("dict keys may not look like __name__")
            return {k: enc(v, depth + 1) for k, v in obj.items()}
        if inside(obj, tensor):
            with plain():
                t = detach(obj)
                if layout(t) != strided:
                    t = to_dense(t)
                name = names.get(dtype(t))
                if name is None:
                    raise error(f"tensor dtype {as_repr(dtype(t))[6:]} cannot be sent")  # "torch.x"
                t = contiguous(cpu(t))
                raw = numpy(view(reshape(t, (-1,)), uint8)).tobytes() if numel(t) else b""
                size = as_list(shape(t))
            return {
                "__tensor__": {
                    "dtype": name,
                    "shape": size,
                    "data": b2a(raw, newline=False).decode(),
                }
            }
        raise error(f"a {t.__name__} cannot be sent (only data: numbers, str, tensors)")

    def dumps(obj: Any) -> str:
        text = "".join(write(enc(obj, 0), 0))
        if length(text) > MAX_BYTES:
            raise error(f"result too large ({length(text)} bytes)")
        return text

    return dumps


def dumps(obj: Any) -> str:
    """Encode plain data (see the module docstring) as one line of JSON."""
    return encoder()(obj)


def _dec(obj: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError("nested too deeply")
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is list:
        return [_dec(x, depth + 1) for x in obj]
    if type(obj) is not dict:
        raise WireError(f"unexpected {type(obj).__name__}")
    if "__float__" in obj:
        value = float(obj["__float__"])
        if math.isfinite(value):
            raise WireError("finite float in a __float__ box")
        return value
    if "__tuple__" in obj:
        return tuple(_dec(x, depth + 1) for x in obj["__tuple__"])
    if "__tensor__" in obj:
        spec = obj["__tensor__"]
        import torch

        dtype = dtypes().get(spec.get("dtype"))
        shape = spec.get("shape")
        if dtype is None or type(shape) is not list or not all(type(s) is int for s in shape):
            raise WireError("bad tensor header")
        if any(s < 0 for s in shape):
            raise WireError("bad tensor shape")
        raw = base64.b64decode(spec.get("data", ""), validate=True)
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(raw) != numel * itemsize:
            raise WireError("tensor data does not match its shape")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
        return flat.reshape(shape).clone()
    return {k: _dec(v, depth + 1) for k, v in obj.items()}


def loads(text: str | bytes) -> Any:
    """Decode what ``dumps`` wrote; refuse anything else."""
    if len(text) > MAX_BYTES:
        raise WireError("message too large")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    return _dec(raw, 0)


class LineTooLong(WireError):
    """A protocol line past its byte limit (the sender is killed by the caller)."""


class LineReader:
    """Protocol lines from a pipe, read into a buffer of our own, each at most ``limit`` bytes.

    ``file.readline()`` would keep reading a line that never ends (a flood without a newline
    grows the reader's memory without bound); this reads at most 64 KiB at a time and raises
    ``LineTooLong`` as soon as the line in progress passes ``limit``.
    """

    def __init__(self, fd: int, limit: int = MAX_BYTES + 4096) -> None:
        self.fd, self.limit = fd, limit
        self.buf = bytearray()
        self.eof = False

    def fileno(self) -> int:
        return self.fd

    def take(self) -> bytes | None:
        """A whole line already in the buffer (without its newline), or None."""
        end = self.buf.find(b"\n")
        if end < 0:
            if len(self.buf) > self.limit:
                raise LineTooLong(f"a protocol line longer than {self.limit} bytes")
            return None
        if end > self.limit:
            raise LineTooLong(f"a protocol line longer than {self.limit} bytes")
        line = bytes(self.buf[:end])
        del self.buf[: end + 1]
        return line

    def fill(self) -> None:
        """One read from the pipe (call it when ``select`` says it is readable)."""
        chunk = os.read(self.fd, 1 << 16)
        if chunk:
            self.buf += chunk
        else:
            self.eof = True

    def readline(self, timeout: float) -> bytes | None:
        """The next line; None if ``timeout`` seconds passed; EOFError when the pipe ended."""
        import select
        import time

        until = time.monotonic() + timeout
        while True:
            line = self.take()
            if line is not None:
                return line
            if self.eof:
                raise EOFError("the pipe ended")
            left = until - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                self.fill()
