"""Persistent ranks: N rank processes that keep their variables from one notebook cell to the next.

``dl.spawn`` and ``%%ddp`` start fresh ranks for every call, so nothing survives a cell.
Here the ranks stay: ``dl.start(2)`` launches them and initialises the process group
once, and each rank keeps its own namespace (with ``rank``, ``world_size``, ``device``,
``torch`` and ``dist`` predefined). Then:

- ``%%ranks [--ranks 0,1] [--timeout S] [--stream] [--trace run.json]`` runs a cell on
  every rank (or some); names the cell uses that the ranks lack come from the notebook, as
  with ``%%ddp``; ``--trace`` writes one Chrome trace of that cell on all its ranks;
- ``dl.pull("expr")`` evaluates an expression on every rank and returns the values as a
  list in rank order (tensors detached and on the CPU); ``dl.push(name=value)`` sends
  notebook values to the ranks;
- ``dl.status()`` shows each rank's pid, device and what it runs; ``dl.stop()`` ends the
  ranks, and so do the end of the kernel and a kernel restart.

Output appears per rank in rank order, exactly as with ``dl.spawn``. An exception on some
ranks shows each rank's traceback and keeps the group; a timeout, a dead rank or an
interrupt the ranks cannot honour restarts the group, and says that its variables are lost.
"""

from __future__ import annotations

import ast
import atexit
import os
import unicodedata
from typing import Any

import cloudpickle

from ddp_lab.i18n import _t
from ddp_lab.runtime import _pickle, _trace, _workdirs, launcher
from ddp_lab.runtime._cell import SKIP, used_names
from ddp_lab.runtime._rank_group import RANK_NAMES, RankGroup, errors
from ddp_lab.runtime.launcher import DistributedError

_group: RankGroup | None = None


def current() -> RankGroup:
    """The running group, or a RuntimeError that says how to start one."""
    if _group is None or _group.zygote is None:  # never started, stopped, or failed to restart
        raise RuntimeError(
            _t(
                "No persistent ranks are running: start them with dl.start(2) (or %ranks "
                "start -n 2)."
            )
        )
    return _group


def start(nprocs: int = 2, backend: str = "auto", timeout: float | None = -1) -> None:
    """Start ``nprocs`` persistent ranks with the process group initialised.

    Args:
        backend: "gloo", "nccl", "mpi" or "auto" (nccl when every rank can have a GPU).
        timeout: the default seconds a ``%%ranks`` cell may run before the ranks' stacks
            are shown and the group is restarted; -1 means the launcher's default
            (``dl.set_timeout``), and then a deadlock (every rank of the cell waiting in
            communication, see ``_hang``) is reported after a few seconds already; None
            means no limit.
    """
    global _group
    nprocs = launcher.check_nprocs(nprocs)
    limit = launcher.DEFAULT_TIMEOUT if timeout == -1 else launcher._check_timeout(timeout)
    backend = launcher.resolve_backend(backend, nprocs)
    if _group is not None:
        old = _group.nprocs
        _stop_quietly()
        print(
            _t(
                "The previous group of {nprocs} ranks was stopped (its variables are gone).",
                nprocs=old,
            )
        )
    # Said before the wait, not after it: each rank imports torch and joins the group, which
    # takes seconds (more on a busy laptop), and a cell that prints nothing for that long
    # looks stuck.
    print(
        _t(
            "Starting {nprocs} persistent ranks ({backend} backend): each imports torch and "
            "joins the process group, which takes a few seconds ...",
            nprocs=nprocs,
            backend=backend,
        ),
        flush=True,
    )
    _group = RankGroup(nprocs, backend, limit, watch=timeout == -1)
    print(
        _t(
            "Ready. Run cells on them with %%ranks; dl.pull / dl.push move values; "
            "dl.status() shows them; dl.stop() ends them."
        )
    )


def _stop_quietly() -> None:
    global _group
    group, _group = _group, None
    if group is not None:
        group.stop()


def stop() -> None:
    """End every rank: no process, port or file of the group is left behind."""
    if _group is not None:
        nprocs = _group.nprocs
        _stop_quietly()
        print(_t("Stopped the {nprocs} ranks; nothing of them is left running.", nprocs=nprocs))


atexit.register(_stop_quietly)


def run_cell(
    source: str,
    user_ns: dict[str, Any] | None = None,
    ranks: Any = None,
    timeout: float | None = -1,
    stream: bool = False,
    filename: str | None = None,
    trace: str | os.PathLike | None = None,
) -> None:
    """What ``%%ranks`` does: run ``source`` in the namespace of each selected rank.

    ``trace``: a file name ("run.json"): this cell alone runs under ``torch.profiler`` on
    each selected rank, and one Chrome trace of those ranks is written there, as for
    ``dl.spawn(..., trace=...)`` (also when the cell fails on some ranks). The profiler is
    started before the cell and stopped after it on every rank; the next cell is not traced.
    """
    group = current()
    filename = filename or f"<ranks cell {group.cells + 1}>"
    targets = group.check_ranks(ranks)
    target = None if trace is None else _trace.check_target(trace)
    code = compile(ast.parse(source, filename), filename, "exec")  # syntax errors stay here
    known = set.intersection(*(group.defined[r] for r in targets))
    wanted = used_names(code) - SKIP - RANK_NAMES - known
    user_ns = user_ns or {}
    names = {k: launcher.dumps_named(k, user_ns[k]) for k in sorted(wanted) if k in user_ns}
    msg = {
        "op": "exec",
        "source": source,
        "filename": filename,
        "names": names,
        "linecache": group.new_lines(),
        "cell_names": launcher.cell_names(),
    }
    # The cell's lines, for the ranks' tracebacks (IPython's cache has them already).
    msg["linecache"][filename] = (len(source), None, source.splitlines(True), filename)
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    what = first if len(first) <= 40 else first[:37] + "..."
    group.cells += 1
    if target is None:
        replies = group.request(targets, msg, what, timeout, stream)
    else:
        replies = _traced_request(group, targets, msg, what, timeout, stream, target)
    failed = errors(replies)
    if failed:
        summary = _t(
            "{count} of {nranks} ranks raised an exception in this cell (first: rank "
            "{first}). The group is still running and keeps its variables.",
            count=len(failed),
            nranks=len(targets),
            first=failed[0].rank,
        )
        raise DistributedError(summary, failed)


def _traced_request(
    group: RankGroup,
    targets: list[int],
    msg: dict,
    what: str,
    timeout: float | None,
    stream: bool,
    target: str,
) -> dict[int, dict]:
    """``group.request`` with the cell traced on ``targets``; the ranks' traces merged."""
    folder = _workdirs.make("trace_")
    # Each cell counts its ranks under its own store key (start_together).
    msg["trace"] = {"folder": folder, "key": f"ddp_lab_cell_{group.cells}", "count": len(targets)}
    try:
        try:
            replies = group.request(targets, msg, what, timeout, stream)
        except BaseException:
            try:  # what the ranks that finished recorded (a restarted group wrote nothing)
                _trace.collect(folder, group.nprocs, target, targets)
            except Exception:  # noqa: BLE001, S110  # the cell's own error matters more
                pass
            raise
        for r in targets:
            reason = replies[r].get("trace_error")
            if reason:
                print(_t("Rank {rank} could not trace this cell: {reason}", rank=r, reason=reason))
        if not _trace.collect(folder, group.nprocs, target, targets):
            raise RuntimeError(_t("No rank wrote a trace; {path} was not written.", path=target))
    finally:
        _workdirs.remove(folder)
    return replies


def pull(expr: str, ranks: Any = None, timeout: float | None = -1) -> list[Any]:
    """Evaluate ``expr`` (a name such as "x" or an expression such as "model.weight.grad")
    on each rank and return the values in rank order; tensors come back on the CPU."""
    group = current()
    targets = group.check_ranks(ranks)
    compile(expr, "<pull>", "eval")  # a syntax error is the notebook's, not the ranks'
    replies = group.request(targets, {"op": "pull", "expr": expr}, f"pull {expr}", timeout)
    failed = errors(replies)
    if failed:
        summary = _t(
            "{count} of {nranks} ranks could not evaluate {expr!r}.",
            expr=expr,
            count=len(failed),
            nranks=len(targets),
        )
        raise DistributedError(summary, failed)
    return [cloudpickle.loads(replies[r]["value"]) for r in targets]


def push(values: dict[str, Any] | None = None, /, ranks: Any = None, **kwargs: Any) -> None:
    """Set names on each rank: ``dl.push(lr=0.1)``, or ``dl.push({"x": x}, ranks=[1])``."""
    group = current()
    targets = group.check_ranks(ranks)
    values = {**(values or {}), **kwargs}
    for name, value in values.items():
        if not name.isidentifier():
            raise ValueError(_t("{name!r} cannot be a variable name on the ranks.", name=name))
        launcher.dumps_named(name, value)
    blob = _pickle.dumps(values)
    replies = group.request(targets, {"op": "push", "values": blob}, "push " + ", ".join(values))
    failed = errors(replies)
    if failed:
        raise DistributedError(
            _t(
                "{count} of {nranks} ranks could not receive the values.",
                count=len(failed),
                nranks=len(targets),
            ),
            failed,
        )


class GroupStatus:
    """What ``dl.status()`` returns: a table that prints itself; ``rows`` for code."""

    def __init__(self, group: RankGroup | None) -> None:
        self.rows = group.rows() if group is not None else []
        self.header = (
            _t(
                "{nprocs} persistent ranks, {backend} backend, {cells} cells run",
                nprocs=group.nprocs,
                backend=group.backend,
                cells=group.cells,
            )
            if group is not None
            else _t(
                "No persistent ranks are running: start them with dl.start(2) (or %ranks "
                "start -n 2)."
            )
        )

    def __repr__(self) -> str:
        if not self.rows:
            return self.header
        table = [_t("rank|pid|alive|device|running").split("|")]
        for rank, pid, up, device, running, last in self.rows:
            doing = running or (_t("idle (last: {last})", last=last) if last else _t("idle"))
            yes_no = _t("yes") if up else _t("no")
            table.append([str(rank), str(pid), yes_no, device, doing])
        widths = [max(_width(row[i]) for row in table) for i in range(4)]
        lines = [
            "".join(c + " " * (w - _width(c) + 2) for c, w in zip(row[:4], widths, strict=True))
            + row[4]
            for row in table
        ]
        return "\n".join([self.header, *(line.rstrip() for line in lines)])


def _width(text: str) -> int:
    # Chinese characters take two columns in a terminal or a notebook's output.
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def status() -> GroupStatus:
    """Which ranks are alive, their pid, device, and what each one is running."""
    return GroupStatus(_group)
