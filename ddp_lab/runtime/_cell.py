"""Which names of the notebook a cell uses: what ``%%ddp`` and ``%%ranks`` send to the ranks."""

from __future__ import annotations

import types

# IPython's own names, never worth sending to a rank.
SKIP = {"In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh"}


def used_names(code: types.CodeType) -> set[str]:
    """All global names a code object (and the code nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= used_names(const)
    return names
