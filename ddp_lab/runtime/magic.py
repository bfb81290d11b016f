"""The ``%%ddp`` and ``%%ranks`` cell magics.

``%%ddp`` runs a cell's body on N fresh ranks with the process group ready. On every rank
the body sees ``rank``, ``world_size``, ``device``, ``torch`` and ``dist``, plus every
notebook name it uses (functions, classes, tensors, numbers from earlier cells), sent by
value with cloudpickle. Output, errors, timeouts and cleanup are those of
``ddp_lab.spawn``.

``%%ranks`` runs it on the persistent ranks of ``dl.start`` instead (see
``ddp_lab.runtime.persistent``), where variables survive from cell to cell; the line magic
``%ranks start -n N | stop | status`` drives the group.
"""

from __future__ import annotations

import ast
from typing import Any

from ddp_lab.i18n import _t, pair
from ddp_lab.runtime import _trace, _workdirs, launcher
from ddp_lab.runtime._cell import SKIP as _SKIP
from ddp_lab.runtime._cell import used_names


class CellJob:
    """Runs a cell body in a fresh namespace on one rank."""

    def __init__(
        self,
        source: str,
        filename: str,
        namespace: dict[str, Any],
        nprocs: int,
        backend: str,
        trace_dir: str | None = None,
    ) -> None:
        self.source, self.filename, self.namespace = source, filename, namespace
        self.nprocs, self.backend, self.trace_dir = nprocs, backend, trace_dir

    def __call__(self, rank: int) -> Any:
        import torch
        import torch.distributed as dist

        from ddp_lab.runtime._rank import init_group

        device = init_group(rank, self.nprocs, self.backend)
        ns = {"__name__": "__main__", "torch": torch, "dist": dist}
        ns.update(self.namespace)
        ns.update(rank=rank, world_size=self.nprocs, device=device)
        code = compile(self.source, self.filename, "exec")
        if self.trace_dir is None:
            exec(code, ns)  # noqa: S102
        else:
            with _trace.Profiled(rank, self.trace_dir):
                exec(code, ns)  # noqa: S102
        return None


def run_cell(
    source: str,
    user_ns: dict[str, Any],
    nprocs: int = 2,
    backend: str = "auto",
    timeout: float | None = -1,
    stream: bool = False,
    filename: str = "<ddp cell>",
    trace: str | None = None,
) -> None:
    """What ``%%ddp`` does, callable without IPython (used by the tests).

    ``trace``: write one Chrome trace of all ranks to this file (see ``spawn``).
    """
    nprocs = launcher.check_nprocs(nprocs)
    limit = launcher.DEFAULT_TIMEOUT if timeout == -1 else launcher._check_timeout(timeout)
    backend = launcher.resolve_backend(backend, nprocs)
    code = compile(ast.parse(source, filename), filename, "exec")
    wanted = used_names(code) - _SKIP - {"rank", "world_size", "device"}
    namespace = {k: user_ns[k] for k in wanted if k in user_ns}
    for name, value in namespace.items():
        launcher.dumps_named(name, value)  # before any process starts: name what cannot go
    if trace is None:
        job = CellJob(source, filename, namespace, nprocs, backend)
        payload = launcher.dumps_job(job, run_cell, ())
        launcher.run_payload(payload, nprocs, limit, stream, watch=timeout == -1)
        return
    target = _trace.check_target(trace)
    folder = _workdirs.make("trace_")
    try:
        job = CellJob(source, filename, namespace, nprocs, backend, folder)
        payload = launcher.dumps_job(job, run_cell, ())
        launcher.traced(
            folder,
            nprocs,
            target,
            launcher.run_payload,
            payload,
            nprocs,
            limit,
            stream,
            watch=timeout == -1,
        )
    finally:
        _workdirs.remove(folder)


def register(ipython: Any) -> None:
    """Register ``%%ddp`` with an IPython shell."""
    from IPython.core import magic_arguments

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("-n", "--nprocs", type=int, default=2, help="number of ranks")
    @magic_arguments.argument("--backend", default="auto", help="gloo, nccl, mpi or auto")
    @magic_arguments.argument("--timeout", type=float, default=-1, help="seconds")
    @magic_arguments.argument("--stream", action="store_true", help="print lines as they come")
    @magic_arguments.argument(
        "--trace",
        default=None,
        help=" / ".join(pair("write one Chrome trace of all ranks to this file (run.json)")),
    )
    def ddp(line: str, cell: str) -> None:
        """%%ddp -n N [--backend gloo|nccl|auto] [--timeout S] [--stream] [--trace F]: N ranks."""
        args = magic_arguments.parse_argstring(ddp, line)
        # Cached under this cell's number, so that a hang report says "Cell In[N], line L".
        # IPython cached the whole cell under it just before running it: the highest number
        # (``execution_count`` is that number or, in newer IPython, one more).
        compiler = getattr(ipython, "compile", None)
        numbers = getattr(compiler, "_filename_map", {}).values()
        number = max((n for n in numbers if isinstance(n, int)), default=0)
        filename = compiler.cache(cell, number) if compiler is not None else "<ddp cell>"
        try:
            run_cell(
                cell,
                ipython.user_ns,
                args.nprocs,
                args.backend,
                None if args.timeout == 0 else args.timeout,
                args.stream,
                filename,
                args.trace,
            )
        except launcher.DistributedError as exc:
            from ddp_lab.course import unsolved

            # An exercise's demo on its stub: say so, and let Run All go on to the graded cell.
            # The first rank to fail decides: the others may have been stopped after it.
            first = exc.failures[0].exception if exc.failures else None
            if first is None or not unsolved.is_stub(first):
                raise
            print(unsolved.note())

    ipython.register_magic_function(ddp, magic_kind="cell", magic_name="ddp")
    register_ranks(ipython)


def parse_ranks(text: str | None) -> list[int] | None:
    """'0,2' or '1-3' or '0,2-3' -> a list of ranks; None or '' -> None (every rank)."""
    if not text:
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(
            _t(
                "ranks must be rank numbers from 0 to {last} (e.g. [0, 1]), got {value!r}.",
                value=text,
                last="N-1",
            )
        ) from None
    return out


def register_ranks(ipython: Any) -> None:
    """Register ``%%ranks`` (run a cell on the persistent ranks) and ``%ranks start|stop|status``."""
    from IPython.core import magic_arguments

    from ddp_lab.runtime import persistent

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("action", nargs="?", default="", help="start, stop or status")
    @magic_arguments.argument("-n", "--nprocs", type=int, default=2, help="ranks to start")
    @magic_arguments.argument("--backend", default="auto", help="gloo, nccl, mpi or auto")
    @magic_arguments.argument("-r", "--ranks", default="", help="e.g. 0,1 or 1-3 (default: all)")
    @magic_arguments.argument("--timeout", type=float, default=-1, help="seconds (0: none)")
    @magic_arguments.argument("--stream", action="store_true", help="print lines as they come")
    @magic_arguments.argument(
        "--trace",
        default=None,
        help=" / ".join(pair("trace this cell: one Chrome trace of its ranks in this file")),
    )
    def ranks(line: str, cell: str | None = None) -> Any:
        """%%ranks [-r 0,1] [--timeout S] [--stream] [--trace F]: run the cell on the ranks.

        %ranks start -n N [--backend B] [--timeout S] | %ranks stop | %ranks status
        """
        args = magic_arguments.parse_argstring(ranks, line)
        timeout = None if args.timeout == 0 else args.timeout
        if cell is None:
            if args.action == "start":
                return persistent.start(args.nprocs, args.backend, timeout)
            if args.action == "stop":
                return persistent.stop()
            return persistent.status()
        filename = ipython.compile.cache(cell) if hasattr(ipython, "compile") else None
        persistent.run_cell(
            cell,
            ipython.user_ns,
            parse_ranks(args.ranks),
            timeout,
            args.stream,
            filename,
            trace=args.trace,
        )
        return None

    ipython.register_magic_function(ranks, magic_kind="line_cell", magic_name="ranks")
