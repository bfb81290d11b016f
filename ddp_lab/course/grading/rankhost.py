"""One rank of a graded exercise: the learner's objects, only this rank's input, a sandbox each.

The verdict process (``course.grading.verdict``) never unpickles what the learner's process made. At a
graded cell the runner hands the learner's objects out as an opaque blob (cloudpickle); for an
exercise converted to per-rank inputs the checker calls ``learner.ranks(probe, inputs)``, which
runs ``RankPool`` here, in the verdict process:

1. starts a *network holder*: a bubblewrap sandbox with a network namespace of its own (only a
   loopback) that runs nothing; it exists so that the exercise's ranks can share that network
   and nothing else;
2. starts each rank (``python -m ddp_lab.course.grading.rankserve``) in a sandbox of its own
   (``course.grading.sandbox.wrap``: its own PID, mount, IPC and UTS namespaces, its own writable folder
   and ``/tmp``), entered into the holder's network with ``nsenter``; its view of the package
   is a rank's view (``course.grading.view``): the reference implementations of the
   exercises, the checkers' oracles and the grading machinery (``HIDDEN``: each file, its
   cached bytecode, any other copy) are modules that raise ImportError;
3. writes rank r's request on rank r's stdin: the probe's name, its rank, the world size, the
   port, and **only rank r's input** (``course.grading.wire`` data: never the seed, never another rank's
   data, never the checker's code);
4. reads one reply per rank with bounded reads (``wire.LineReader``), kills every sandbox, and
   returns the replies as data; the first error (or a hang, or a rank that died) becomes a
   ``LearnerError``.

In the rank (``rankserve``), the learner's code runs only after the request is read: the blob
is loaded after ``init_process_group``, so that an import of a hidden module fails there, as
the learner's error. A result that needs the other ranks' inputs (an all-reduce) is then proof
that the ranks communicated. What a rank reports about *how* it communicated (the ring's sends and batches) is
its own account: the checkers keep it as a hint for feedback, not as proof. What the ranks
sent each other is observed here instead, from outside them: around each case ``run`` reads
the kernel's counters of the holder's network (``course.traffic``) and leaves the bytes per
rank pair in ``traffic`` (None where they cannot be read, and why in ``unobserved``).

For a probe that calls the learner's code once per input (``per_call``: 05.ring's, and
10.fsdp_reduce's and 10.sharded_optimizer's byte probes), the ranks run in lockstep with this
process (``rankserve``'s ``steps``): once every rank has joined the case's group, and before any of the learner's code runs, the counters are read and the
group's connections noted (``traffic.group_of``: one new connection per pair of ranks); then
each call's bytes are read after every rank has finished that call and before any starts the
next. ``traffic`` is then a list, one ``Traffic`` per call, counting on the group's
connections only (what else moved between the ranks is ``outside``). When the ranks say
``joined`` or ``done`` is theirs to say, and only that: the bytes are the kernel's, and a
rank that says it too early or too late only puts its own bytes in the wrong window.

Without a sandbox (see ``course.grading.sandbox.available``) the ranks run as plain processes on the
host's loopback, each still with only its own input, and the package is not hidden.
"""

from __future__ import annotations

import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from ddp_lab.course.grading import ranknet, view, wire
from ddp_lab.course.grading.learner import RunnerGone
from ddp_lab.course.grading.ranknet import (
    ended_why,
    join_network,
    kill_group,
    remove_folder,
    start_holder,
)
from ddp_lab.course.grading.rankserve import REQUEST_LIMIT, per_call_of, protection_of
from ddp_lab.i18n import _t

# The package's files a rank may not import (``course.grading.view``): the reference
# implementations of the exercises whole, the checkers' oracles, the concept checks' key and
# the grading machinery.
HIDDEN = view.RANK_HIDDEN
STARTUP_S = 300.0  # a rank's sandbox, Python and torch starting (the grader's time, not theirs)


# --- in the verdict process -----------------------------------------------------------------


class SandboxFailed(RunnerGone):
    """The grader could not start the ranks' sandboxes (the machine's fault, not the code's)."""


class _SetupFailed(Exception):
    """A rank could not join the case's process group (no learner code had run in it)."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(kind, text)
        self.kind, self.text = kind, text


class RankPool:
    """The sandboxed ranks of one exercise, started as its cases need them and reused by the
    next case (torch is imported once per rank, not once per case); a failed case kills them
    all, and the next case starts fresh ones, and so does a case whose probe declares another
    protection than the one they ran with (``rankserve.protection``). Rank r of every case is
    the same sandbox, and receives only rank r's inputs."""

    def __init__(self, blob: bytes, lang: str = "en", job: int = 0) -> None:
        from ddp_lab.course.grading import sandbox

        self.blob, self.lang, self.job = blob, lang, job
        self.sandboxed = sandbox.available()
        self.procs: list[subprocess.Popen] = []
        self.readers: list[wire.LineReader] = []
        # Each rank's token, the first line it reads: every reply of the rank's own loop
        # carries it (``rankserve.main``); a line without it was written by other code in the
        # rank's process, the learner's.
        self.tokens: list[str] = []
        self.holder: subprocess.Popen | None = None
        self.holder_pid = 0
        self.base: Path | None = None
        self.view: list[str] | None = (
            None  # the rank's view's bwrap arguments (course.grading.view)
        )
        self.ports: set[int] = set()
        self.protected: tuple | None = None  # the protection the running ranks entered
        # What the last ``run`` moved between the ranks, read by the grader from the ranks'
        # network namespace (``course.traffic``), or None with the reason in ``unobserved``.
        self.traffic: Any = None
        self.unobserved = ""
        # After ``run``: the share's listing (``ranknet.list_share``) or None, and the wall
        # clock when each rank's reply reached this process.
        self.shared: dict | None = None
        self.answered: list[float] = []
        self._arrived: dict[int, float] = {}

    def _start(self, n: int, share: tuple[str, Path] | None = None) -> None:
        """Rank sandboxes up to ``n``, each ready (Python and torch imported) before it gets
        anything: the time they take is the grader's, not the learner's code's."""
        from ddp_lab.course.grading import sandbox

        if self.base is None:
            self.base = Path(tempfile.mkdtemp(prefix="ddp-lab-ranks-"))
            self.base.chmod(0o755)
            # A pool dropped without close() (an exception in its owner, the interpreter's
            # exit) still removes its folder; close() does it at once.
            self._remove = weakref.finalize(self, remove_folder, self.base)
            if self.sandboxed:
                self.holder, self.holder_pid = start_holder(self.base)
            else:
                sandbox.warn_unsandboxed(self.lang)
        if self.sandboxed and self.view is None:
            self.view = view.args(self.base / "view", self.lang, rank=True)
        masks = self.view or []
        env = {"DDP_LAB_LANG": self.lang, "MPLBACKEND": "agg", "OMP_NUM_THREADS": "1"}
        new = []
        for rank in range(len(self.procs), n):
            folder = self.base / f"rank{rank}"
            folder.mkdir()
            (folder / "blob.pkl").write_bytes(self.blob)
            argv = [sys.executable, "-m", "ddp_lab.course.grading.rankserve"]
            cmd, run_env = sandbox.wrap(argv, folder, job=self.job, env=env)
            if self.sandboxed:
                cmd = join_network(cmd, self.holder_pid, masks)
            if share is not None:  # rank 0 writes the shared folder, the others only read it
                bind = ["--bind" if rank == 0 else "--ro-bind", str(share[1]), f"/tmp/{share[0]}"]
                cmd = view.insert(cmd, bind)
            proc = subprocess.Popen(
                cmd,
                env=run_env,
                cwd=folder,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            assert proc.stdout is not None and proc.stdin is not None
            self.procs.append(proc)
            self.readers.append(wire.LineReader(proc.stdout.fileno(), REQUEST_LIMIT))
            self.tokens.append(secrets.token_hex(16))
            try:
                proc.stdin.write(json.dumps({"token": self.tokens[-1]}).encode() + b"\n")
                proc.stdin.flush()
            except OSError:
                pass  # it died: its missing "ready" says so
            new.append(rank)
        if new:
            ready = self._collect(new, STARTUP_S, "ready")
            if len(ready) != len(new):  # pragma: no cover  # _collect raises first
                raise SandboxFailed("ranks did not start")

    def _port(self) -> int:
        if not self.sandboxed:
            from ddp_lab.runtime.launcher import free_port

            return free_port()
        while True:  # a network of the exercise's own: every port is free but those used
            port = random.SystemRandom().randrange(20000, 60000)
            if port not in self.ports:
                self.ports.add(port)
                return port

    def run(self, probe: str, inputs: list, timeout: float, share: str | None = None) -> list:
        """``probe`` on ranks ``0..len(inputs)-1``; rank r gets only ``inputs[r]``.

        ``share``: a folder name; on fresh ranks, ``/tmp/<share>`` is then one host folder that
        rank 0 may write and the others only read. Once all have answered, the ranks are killed
        (no code of theirs runs after that) and the grader lists the folder (``shared``).

        A case whose process group could not be set up (before any of the learner's code ran)
        runs once more on fresh ranks: gloo's connection set-up fails now and then on a busy
        machine ("connectFullMesh failed ... Connection closed by peer"; pytorch/gloo#413 added
        retries for such failures), and that is not the learner's to lose points for.

        Ranks that ran a probe of another protection are not reused: fresh ones start."""
        wanted = protection_of(probe)
        if self.procs and wanted != self.protected:
            self.close()
        self.protected = wanted
        try:
            return self._run(probe, inputs, timeout, share)
        except _SetupFailed:
            pass  # _run closed the ranks: the second try starts fresh ones
        try:
            return self._run(probe, inputs, timeout, share)
        except _SetupFailed as again:
            from ddp_lab.course.grading.learner import LearnerError

            raise LearnerError(again.kind, again.text) from None

    def _run(self, probe: str, inputs: list, timeout: float, share: str | None = None) -> list:
        n = len(inputs)
        self.traffic, self.unobserved, self.shared, self._arrived = None, "", None, {}
        shared = None
        if share is not None:
            self.close()  # ranks started with the folder in their view
            if not self.sandboxed:
                self.unobserved = "no-sandbox"
            else:
                shared = (share, ranknet.make_share(share, self.job))
        try:
            self._start(n, shared)
            port = self._port()
            before = self._snapshot()
            steps = before is not None and per_call_of(probe, inputs)
            for rank in range(n):
                request = {
                    "rank": rank,
                    "world_size": n,
                    "port": port,
                    "probe": probe,
                    "timeout": timeout,
                    "lang": self.lang,
                    "steps": steps,
                    "data": wire.dumps(inputs[rank]),
                }
                stdin = self.procs[rank].stdin
                assert stdin is not None
                try:
                    stdin.write(json.dumps(request).encode() + b"\n")
                    stdin.flush()
                except OSError:
                    pass  # it died: its missing answer says so below
            if steps:
                return self._run_steps(before, port, n, len(inputs[0]), timeout)
            replies = self._collect(list(range(n)), timeout + 10, "ok")
            self.answered = [self._arrived[r] for r in range(n)]
            if before is not None:
                self._observe(before, port, n)
            if shared is not None:
                self.shared = self._look(shared[1])
            return [replies[r] for r in range(n)]
        except BaseException:
            self.close()
            raise
        finally:
            if shared is not None:
                remove_folder(shared[1])

    def _look(self, folder: Path) -> dict | None:
        """Kill the ranks, wait until nothing in their sandboxes runs, list ``folder``."""
        inits = [ranknet.sandbox_init(proc.pid) for proc in self.procs]
        self.close()
        if not all(i is not None and ranknet.gone(i) for i in inits):
            self.unobserved = "unreadable"
            return None
        return ranknet.list_share(folder)

    def _run_steps(self, before: Any, port: int, n: int, calls: int, timeout: float) -> list:
        """The ranks in lockstep: the group's connections noted before the learner's code
        runs, then each call's bytes on them (see the module's docstring)."""
        from ddp_lab.course.grading import traffic

        ranks = list(range(n))
        until = time.monotonic() + timeout + 10
        self._collect(ranks, timeout + 10, "joined")  # set-up errors: _SetupFailed
        roots = {proc.pid: rank for rank, proc in enumerate(self.procs[:n])}
        shot = self._snapshot()
        group = None
        if shot is not None:
            try:
                group = traffic.group_of(before, shot, roots, port, n)
            except traffic.GroupUnclear as exc:  # not the learner's: no code of theirs ran yet
                raise _SetupFailed("GroupUnclear", str(exc)[:500]) from None
        seen: list | None = [] if group is not None else None
        for _ in range(calls):
            self._go(ranks)
            self._collect(ranks, max(until - time.monotonic(), 0.0), "done", timeout + 10)
            after = self._snapshot() if seen is not None else None
            if seen is not None and after is not None:
                seen.append(traffic.difference(shot, after, roots, port, group))
                shot = after
            else:
                seen = None  # unreadable: ``unobserved`` says why
        self._go(ranks)
        replies = self._collect(ranks, max(until - time.monotonic(), 0.0), "ok", timeout + 10)
        if seen:  # what moved after the last call (before the ranks answered) is its too
            after = self._snapshot()
            if after is None:
                seen = None  # unreadable: ``unobserved`` says why
            else:
                seen[-1] = traffic.combined(
                    seen[-1], traffic.difference(shot, after, roots, port, group)
                )
        self.traffic = seen
        return [replies[r] for r in range(n)]

    def _go(self, ranks: list[int]) -> None:
        for rank in ranks:
            stdin = self.procs[rank].stdin
            assert stdin is not None
            try:
                stdin.write(b"go\n")
                stdin.flush()
            except OSError:
                pass  # it died: its missing answer says so

    def _snapshot(self) -> Any:
        """The ranks' namespace's counters (``course.traffic``), or None (and why) where they
        cannot be read: no sandbox (the ranks share the host's network), no ``ss``/``nsenter``."""
        from ddp_lab.course.grading import traffic

        if not self.sandboxed:
            self.unobserved = "no-sandbox"
            return None
        if traffic.tools() is None:
            self.unobserved = "no-tools"
            return None
        try:
            return traffic.snapshot(self.holder_pid)
        except (traffic.Unreadable, OSError, subprocess.SubprocessError, ValueError, IndexError):
            # The ranks' doing (sockets by the thousand) or the machine's: the checker fails
            # the case rather than judge the way from the ranks' own report.
            self.unobserved = "unreadable"
            return None

    def _observe(self, before: Any, port: int, n: int) -> None:
        from ddp_lab.course.grading import traffic

        after = self._snapshot()
        if after is None:
            return
        roots = {proc.pid: rank for rank, proc in enumerate(self.procs[:n])}
        self.traffic = traffic.difference(before, after, roots, port)

    def _collect(
        self, ranks: list[int], patience: float, key: str, shown: float | None = None
    ) -> dict[int, Any]:
        """One ``key`` reply from each of ``ranks``, read with bounded reads; the first error,
        a rank's death or the end of ``patience`` raises ``LearnerError`` (saying ``shown``
        seconds, the whole patience, where ``patience`` is what is left of it)."""
        import select

        from ddp_lab.course.grading.learner import LearnerError

        replies: dict[int, Any] = {}
        until = time.monotonic() + patience
        while len(replies) < len(ranks):
            pending = [r for r in ranks if r not in replies]
            for rank in pending:
                reader = self.readers[rank]
                try:
                    line = reader.take()
                except wire.LineTooLong:
                    flood = _t(
                        "rank {rank} wrote more than {limit} bytes without a line end on the "
                        "grader's pipe",
                        rank=rank,
                        limit=reader.limit,
                    )
                    raise LearnerError("WireError", flood) from None
                if line is None:
                    if reader.eof:
                        raise LearnerError("RankFailed", ended_why(self.procs[rank], rank))
                    continue
                try:
                    reply = json.loads(line)
                except (ValueError, RecursionError):  # nested past the parser: not ours either
                    continue  # not the protocol's: ignore
                if not isinstance(reply, dict):
                    continue
                if reply.get("token") != self.tokens[rank]:
                    raise LearnerError(
                        "Refused",
                        _t(
                            "rank {rank}: a line on its pipe to the grader was not the rank's "
                            "own reply (code in the rank's process wrote it)",
                            rank=rank,
                        ),
                    )
                if "error" in reply:
                    e = reply["error"] if isinstance(reply["error"], dict) else {}
                    kind, text = str(e.get("type", "Error"))[:100], str(e.get("message", ""))
                    if reply.get("setup") is True:  # a rank says so: at worst one more run
                        raise _SetupFailed(kind, text[:500])
                    raise LearnerError(kind, text[:500])
                if key in reply:
                    self._arrived[rank] = time.time()  # when the grader had it, not the rank
                    try:
                        replies[rank] = wire.loads(str(reply[key]))
                    except wire.WireError as exc:
                        raise LearnerError("WireError", str(exc)) from None
            if len(replies) == len(ranks):
                break
            left = until - time.monotonic()
            if left <= 0:
                if key == "ready":
                    raise SandboxFailed(f"the grading sandboxes did not start in {patience:.0f} s")
                raise LearnerError(
                    "TimeoutError",
                    _t(
                        "the ranks did not answer within {seconds:.0f} s",
                        seconds=patience if shown is None else shown,
                    ),
                )
            waiting = [self.readers[r] for r in ranks if r not in replies]
            ready, _, _ = select.select(waiting, [], [], min(left, 1.0))
            for reader in ready:
                reader.fill()
        return replies

    def close(self) -> None:
        for proc in self.procs:
            kill_group(proc)
        if self.holder is not None:
            kill_group(self.holder)
        if self.base is not None:
            self._remove()
        self.procs, self.readers, self.tokens, self.holder, self.base = [], [], [], None, None
        self.view = None
