"""A lesson cell that shows torch's C++ stack trace fails its test, unless it means to.

A run that works can still print a C++ error: a rank whose store connection closed under it
as rank 0 left (``runtime/_rank.finish_together``). The cell's result is right, nbval (which runs
every lesson, lax: only errors fail a cell) passes it, and the learner reads a stack of C++
frames under a cell that claims all went well. This module is a pytest plugin,

    pytest -p ddp_lab.course.nbtraces --nbval-lax notebooks

that fails such a cell once nbval ran it. torch's C++ errors carry the line ``Exception raised
from <function> at <file>:<line>`` (``c10::Error``'s message, c10/util/Exception.cpp; the
frames follow it), in whichever process printed them: the kernel, or a rank whose output the
launcher shows in the cell. A cell that shows a failing run on purpose, and may show its C++
error, says so with the tag ``shows-cpp-error`` in its chapter source.

A cell whose result is only ``None``s (``[None, None]``: what ``dl.spawn`` returns for ranks
that return nothing) fails too: the learner reads a result that says nothing. Such a cell ends
in ``;`` (docs/AUTHORING.md), which JupyterLab honours; nbval does not (it runs cells with
``store_history=False``, and IPython looks for the ``;`` in the history), so the check reads
the cell's source as ``course.nbcache`` does.
"""

from __future__ import annotations

import re

import pytest  # nbval's, a dependency of the package

from ddp_lab.course.nbcache import shows_no_result  # IPython's own reading of the ``;``

MARKER = "Exception raised from "
TAG = "shows-cpp-error"
# A list or tuple of one or more None, as IPython's pretty printer writes it.
_NONES = re.compile(r"[\[(]\s*None(\s*,\s*None)*\s*,?\s*[\])]")


def cpp_trace(outputs) -> str | None:
    """The first line of a C++ stack trace in a cell's outputs (nbval's ``test_outputs``), or None."""
    for out in outputs or ():
        texts = [out.get("text", "")]
        data = out.get("data") or {}
        texts += [data.get("text/plain", ""), data.get("text/html", "")]
        for text in texts:
            text = "".join(text) if isinstance(text, list) else str(text)
            at = text.find(MARKER)
            if at >= 0:
                return text[at:].splitlines()[0][:300]
    return None


def nothing_shown(outputs, source: str) -> str | None:
    """The result of a cell (``execute_result``) that is only ``None``s, where the learner's
    kernel shows it (the cell does not end in ``;``), or None."""
    for out in outputs or ():
        if out.get("output_type") != "execute_result":
            continue
        text = (out.get("data") or {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        if _NONES.fullmatch(text.strip()):
            return None if shows_no_result(source) else text.strip()
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    if type(item).__name__ != "IPyNbCell":
        return result
    outputs = getattr(item, "test_outputs", None)
    line = cpp_trace(outputs) if TAG not in item.cell.metadata.get("tags", []) else None
    if line is not None:
        raise AssertionError(
            f"the cell printed a C++ stack trace ({line!r}): a learner reads it under a cell "
            f"that worked. Find its cause, or tag the cell {TAG!r} in its chapter source "
            "where it shows a failing run on purpose (course/nbtraces.py)"
        )
    shown = nothing_shown(outputs, item.cell.source)
    if shown is not None:
        raise AssertionError(
            f"the cell's result is {shown!r}: a learner reads a result that says nothing. "
            "End the cell in ';' (docs/AUTHORING.md), or return something worth showing"
        )
    return result
