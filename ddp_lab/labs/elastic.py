"""Elastic membership on two local hosts: a host leaves a running job, and comes back.

Both hosts (``ddp_lab.cluster.hosts``) run ``torchrun --nnodes=1:2`` with the c10d rendezvous
hosted by host0's agent; the program is chapter 08's ``python -m ddp_lab.tools.train`` with step
checkpoints (chapter 11) in a folder both hosts see, as a shared file system would give them.
Mid-run host1 is taken away, in one of two ways:

- ``"agent"``: every process on host1 is killed (its agent and its worker), as when the
  machine dies. host0's worker fails on its next collective (the peer's sockets are closed).
- ``"link"``: host1's network link goes down (``ip link set eth0 down``), its processes live
  on. Nothing is closed: host0's worker waits in its collective until the process group's
  timeout (``--timeout``) turns the wait into an error.

Either way host0's agent sees a failed worker group, spends one of its ``--max-restarts``,
stops its workers and joins the next rendezvous round; with ``min_nodes=1`` the round
completes without host1, the workers start again with world size 1 and resume from the last
checkpoint. Then host1 comes back (a fresh ``torchrun`` on it, or its link up again); its agent
joins the wait list, host0's agent sees a node waiting and restarts its workers without
spending a restart, and the job ends with world size 2.

:func:`run` does it for real (root, ``ip netns``) and returns a :class:`Record`; where hosts
cannot be built, :func:`show` prints the stored record of a real run
(``python -m ddp_lab.labs.elastic record`` wrote ``elastic_run.json`` next to this file).

Teaching version: one process starts both agents and plays the failures; on a real cluster
each ``torchrun`` runs on its own machine and the failures are not asked for.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp_lab.cluster import hosts, lab_reason, load_record, store_record
from ddp_lab.i18n import _t

RECORD = Path(__file__).with_name("elastic_run.json")
REJOIN_S = 40  # after the link is back: how long host1's own agent gets to rejoin
SCENARIOS = ("agent", "link")
# Rendezvous settings (dynamic_rendezvous.py's create_handler reads them from --rdzv-conf):
# wait 3 s for more nodes once min_nodes have joined (last_call_timeout, default 30 s); a node
# whose heartbeat is 3 x 2 s old is dead (keep_alive_interval 5, keep_alive_max_attempt 3).
RDZV_CONF = "last_call_timeout=3,keep_alive_interval=2,keep_alive_max_attempt=3,join_timeout=120"
TRAIN = ("--epochs", "8", "--batch-size", "32", "--threads", "1", "--checkpoint-every", "4",
         "--step-sleep", "0.1", "--timeout", "8")  # fmt: skip
# The lines the chapter reads: the program's own, and the agents' (logger.info, LOGLEVEL=INFO).
KEEP = (
    r"^world size|^resumed from|^the checkpoint was written|^done: test|sha256"
    r"|attempts left|new nodes from|has joined round|Stopping worker group"
    r"|restart_count=|group_world_size=|Closing the rendezvous|RendezvousConnectionError:"
    r"|^\[rank\d\]: \w*Error|failed to send a keep-alive|worker group successfully finished|exitcode|RendezvousTimeoutError"
)


@dataclass
class Line:
    t: float  # seconds since the start of the run
    host: str  # host0, host1, or "lab" for what this module did
    text: str


@dataclass
class Record:
    """One run: what was done and when, what each agent and worker printed."""

    scenario: str
    command: list[str]
    lines: list[Line] = field(default_factory=list)
    returncodes: dict[str, int | None] = field(default_factory=dict)
    netns: list[str] = field(default_factory=list)  # the namespaces it used (all gone now)

    def worlds(self) -> list[tuple[float, int, int, float]]:
        """Every start of the workers: (time, world size, global batch, lr)."""
        out = []
        for line in self.lines:
            m = re.match(r"world size (\d+), \d+ per rank = global batch (\d+), lr ([\d.e-]+)",
                         line.text)  # fmt: skip
            if m:
                out.append((line.t, int(m[1]), int(m[2]), float(m[3])))
        return out

    def restart_counts(self) -> list[tuple[float, str, int]]:
        """Each agent's ``restart_count`` at each rendezvous: (time, host, count)."""
        return [(ln.t, ln.host, int(ln.text.rsplit("=", 1)[1]))
                for ln in self.grep(r"restart_count=\d+$")]  # fmt: skip

    def grep(self, pattern: str, host: str | None = None) -> list[Line]:
        return [ln for ln in self.lines if re.search(pattern, ln.text)
                and (host is None or ln.host == host)]  # fmt: skip

    def show(self, pattern: str = KEEP) -> None:
        """The timeline: time, host, line (the logger's date and pid left out)."""
        for ln in self.lines:
            if ln.host == "lab" or re.search(pattern, ln.text):
                print(f"{ln.t:6.1f} s  {ln.host:5}  {short(ln.text)[:200]}")


def short(text: str) -> str:
    """A log line without the logger's level, date and pid, nor this machine's folders."""
    text = re.sub(r"^[IWE]\d{4} [\d:.]+ \d+ \S*/torch/distributed/", "torch/distributed/", text)
    text = re.sub(r"/tmp/ddp-lab-elastic-\w+/", "/tmp/ddp-lab-elastic-…/", text)
    text = re.sub(r"/\S*/bin/python[\d.]*", "python", text)
    return re.sub(r"/\S*/(site-packages|ddp_lab)/", r"\1/", text)


def torchrun(port: int, checkpoint_dir: str, max_restarts: int = 3) -> list[str]:
    """One node's command: 1 to 2 nodes, c10d rendezvous on host0, one worker."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2",
            "--nproc-per-node=1", f"--max-restarts={max_restarts}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=host0:{port}", "--rdzv-id=elastic", f"--rdzv-conf={RDZV_CONF}",
            "-m", "ddp_lab.tools.train", *TRAIN, "--checkpoint-dir", checkpoint_dir]  # fmt: skip


class _Node:
    """One torchrun on one host; a thread stamps each output line as it comes."""

    def __init__(self, c: hosts.Cluster, i: int, cmd: list[str], env: dict[str, str],
                 rec: Record, t0: float, lock: threading.Lock) -> None:  # fmt: skip
        host = c[i].hostname
        self.name = f"{host} #{1 + sum(k.startswith(host) for k in rec.returncodes)}"
        self.rec = rec
        rec.returncodes[self.name] = None
        self.proc = c.start(i, cmd, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)  # fmt: skip
        self.thread = threading.Thread(target=self._read, args=(t0, lock, host), daemon=True)
        self.thread.start()

    def _read(self, t0: float, lock: threading.Lock, host: str) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            with lock:
                self.rec.lines.append(Line(round(time.monotonic() - t0, 1), host, text.rstrip()))

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        self.thread.join(timeout=5)
        self.rec.returncodes[self.name] = self.proc.poll()


def run(scenario: str = "agent", timeout: float = 240.0) -> Record:
    """Run the job on two fresh hosts, take host1 away mid-run, bring it back (needs root)."""
    if scenario not in SCENARIOS:
        raise ValueError(_t("Unknown scenario {name!r}: choose one of {choices}.",
                            name=scenario, choices=", ".join(SCENARIOS)))  # fmt: skip
    reason = hosts.unavailable_reason()
    if reason:
        raise hosts.HostsUnavailable(reason)
    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": root, "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="ddp-lab-elastic-"))
    lock = threading.Lock()
    try:
        with hosts.cluster(2, etc_hosts="cluster") as c:
            port = c.free_port(0)
            cmd = torchrun(port, str(folder / "ckpt"))
            rec = Record(scenario, cmd, netns=[c.switch] + [h.netns for h in c.hosts])
            t0 = time.monotonic()
            deadline = t0 + timeout

            def note(text: str) -> None:
                with lock:
                    rec.lines.append(Line(round(time.monotonic() - t0, 1), "lab", text))

            def until(
                pattern: str, count: int = 1, within: float = timeout, host: str = ""
            ) -> bool:
                end = min(deadline, time.monotonic() + within)
                while time.monotonic() < end:
                    with lock:
                        found = [ln for ln in rec.lines
                                 if re.search(pattern, ln.text) and ln.host.startswith(host)]  # fmt: skip
                        if len(found) >= count:
                            return True
                    time.sleep(0.1)
                return False

            nodes = [_Node(c, 0, cmd, env, rec, t0, lock), _Node(c, 1, cmd, env, rec, t0, lock)]
            note("both agents started")
            until(r"^world size 2")
            until(r"^world size|^resumed", 1)
            time.sleep(3.0)  # a few steps and checkpoints at world size 2
            if scenario == "agent":
                note("host1 dies: SIGKILL to every process on it (its agent and its worker)")
                hosts.kill_in(c[1].netns)
            else:
                note("host1's link goes down (ip link set eth0 down); its processes live on")
                subprocess.run(["ip", "-n", c[1].netns, "link", "set", "eth0", "down"], check=True)
            until(r"^world size 1")
            time.sleep(3.0)  # a few steps at world size 1
            if scenario == "link":
                note("host1's link up again")
                subprocess.run(["ip", "-n", c[1].netns, "link", "set", "eth0", "up"], check=True)
                # Back: host1's agent reaches the store again. While the link was down it sat in
                # a store call (its loop asks how many nodes wait, api.py `_invoke_run`); the call
                # returns when TCP retransmits, and its next look finds the worker that timed out:
                # "Worker group FAILED", after which it rejoins on its own within a round. Not the
                # program's "world size 2": on a busy machine the restarted workers can take 20 s
                # and more to start, and host1 would be killed after it had rejoined (seen at load
                # 12: host0's worker then failed a second time).
                if not until(r"Worker group FAILED", within=REJOIN_S, host="host1"):
                    note(f"host1 is not back {REJOIN_S} s later: we kill what is left on it "
                         "and start a fresh torchrun there, as an operator would")  # fmt: skip
                    hosts.kill_in(c[1].netns)
                    nodes[1].wait(10)
                    nodes.append(_Node(c, 1, cmd, env, rec, t0, lock))
            else:
                note("host1 back: a fresh torchrun on it")
                nodes.append(_Node(c, 1, cmd, env, rec, t0, lock))
            for node in nodes:
                node.wait(max(1.0, deadline - time.monotonic()))
            note("every agent ended" if all(n.proc.poll() is not None for n in nodes)
                 else "timed out: stopping what is left")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rec


class Runs:
    """Both scenarios, run one after the other in the background, or the stored runs."""

    def __init__(self, names: tuple[str, ...] = SCENARIOS) -> None:
        self.reason = lab_reason(hosts.unavailable_reason())
        self.runs: dict[str, Future | Record] = {}
        if self.reason:
            stored = load_record(RECORD, self.reason)
            for name in names:
                self.runs[name] = from_dict(stored["runs"][name])
            return
        pool = ThreadPoolExecutor(max_workers=1)  # one at a time: each run is timed
        for name in names:
            self.runs[name] = pool.submit(run, name)
        pool.shutdown(wait=False)

    def __getitem__(self, name: str) -> Record:
        got = self.runs[name]
        return got.result() if isinstance(got, Future) else got


def from_dict(data: dict) -> Record:
    """A :class:`Record` from its stored form."""
    lines = [Line(**ln) for ln in data["lines"]]
    return Record(**{**data, "lines": lines})


def record(path: Path = RECORD) -> dict:
    """Run both scenarios for real and store their timelines (needs root)."""
    import torch

    data: dict = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                  "command": "python -m ddp_lab.labs.elastic record", "runs": {}}  # fmt: skip
    for name in SCENARIOS:
        rec = run(name)
        rec.lines = [Line(ln.t, ln.host, short(ln.text)) for ln in rec.lines
                     if ln.host == "lab" or re.search(KEEP, ln.text)]  # fmt: skip
        rec.command = [short(a) for a in rec.command]
        data["runs"][name] = asdict(rec)
    store_record(path, data)
    return data


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record()
    else:
        for name in sys.argv[1:] or SCENARIOS:
            r = run(name)
            r.show(pattern=r".")
            print(r.returncodes)
