"""cloudpickle that keeps each function's file name, so rank tracebacks name the cell.

cloudpickle 3.1.3 started writing every pickled code object's ``co_filename`` as
``"<dynamic-code>"`` (``_code_reduce`` in cloudpickle/cloudpickle.py: it makes payloads
deterministic). The launcher's tracebacks and warnings then lose the cell and its source
line: ``<dynamic-code>:2`` instead of ``Cell, line 2`` with the line under it. This pickler
puts the real file name back; with older cloudpickle it changes nothing.
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from typing import Any

import cloudpickle

_DYNAMIC = "<dynamic-code>"
_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_reduce_keeping_filename(code: types.CodeType) -> tuple:
    make, args = _code_reduce(code)
    return make, tuple(code.co_filename if a == _DYNAMIC else a for a in args)


class Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap(
        {types.CodeType: _code_reduce_keeping_filename}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    """``cloudpickle.dumps`` with the real ``co_filename`` of every function."""
    with io.BytesIO() as f:
        Pickler(f, protocol=protocol).dump(obj)
        return f.getvalue()
