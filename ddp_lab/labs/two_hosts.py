"""Chapter 08's training program on two hosts (``ddp_lab.hosts``), and how it fails.

Each scenario builds its own two hosts, starts one ``torchrun`` per host (one worker each)
running ``python -m ddp_lab.tools.train``, and keeps what each node printed. The working runs
(static and c10d rendezvous) and the failure gallery (gloo on the loopback, ``MASTER_ADDR``
set to ``localhost``, a firewall, a node that joins too late, mismatched ``--nnodes``) are all
real runs with short timeouts. Where hosts cannot be built (not root), :class:`Gallery`
shows the stored outputs of a real run instead: ``python -m ddp_lab.labs.two_hosts record``
wrote them to ``two_hosts_run.json`` next to this file, with the date and the command.

Teaching version: on a real cluster each ``torchrun`` is typed on its own machine (or
started by a scheduler); here one process starts both and stops them.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp_lab.cluster import hosts, lab_reason, load_record, store_record

RECORD = Path(__file__).with_name("two_hosts_run.json")
TRAIN_ARGS = ("--epochs", "2", "--threads", "1")
TIMEOUT = 10  # seconds: every rendezvous and store timeout of the failure gallery
# The line each scenario is about: the chapter prints it, the tests check it.
EXPECT = {
    "look": r".",
    "one_host": r"done: test accuracy",
    "static": r"done: test accuracy",
    "c10d": r"done: test accuracy",
    "loopback": r"Gloo connectFullMesh failed .*Connection refused, remote=\[127\.0\.1\.1\]",
    "c10d_no_host": r"^torch.distributed.DistNetworkError|RendezvousConnectionError: The conn",
    "localhost": r"DistStoreError: Timed out after|timed out after \d+ms while trying to connect to \(lo",
    "firewall": r"DistStoreError: Timed out after|^torch.distributed.DistNetworkError: The client",
    "late_node": r"RendezvousTimeoutError$|^torch.distributed.DistNetworkError: The client",
    # host0 times out; host1 loses the store, which lived in host0's agent
    "nnodes": r"Rendezvous(Timeout|Closed)Error$|RendezvousConnectionError: The conn",
    "nnodes_silent": r"^world size|done: test accuracy",
}


@dataclass
class NodeRun:
    """What one node's torchrun did."""

    host: str
    command: list[str]
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    stopped: bool = False  # still running when the other node had failed: we stopped it

    def lines(self, pattern: str = "") -> list[str]:
        out = (self.stdout + "\n" + self.stderr).splitlines()
        return [line.strip() for line in out if line.strip() and re.search(pattern, line)]

    def accuracy(self) -> float | None:
        found = self.lines(r"done: test accuracy")
        return float(re.findall(r"accuracy ([\d.]+)%", found[-1])[0]) if found else None


@dataclass
class Scenario:
    name: str
    nodes: list[NodeRun] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)  # the namespaces it ran in (now gone)

    def key_lines(self) -> list[str]:
        return [line for n in self.nodes for line in n.lines(EXPECT[self.name])]

    def show(self, limit: int = 3) -> None:
        """Each node's command, exit and the lines the scenario is about."""
        for node in self.nodes:
            cmd = " ".join("python" if a == sys.executable else a for a in node.command)
            state = "stopped" if node.stopped else f"exit code {node.returncode}"
            print(f"[{node.host}]$ {cmd}\n  -> {state} after {node.seconds:.1f} s")
            for line in node.lines(EXPECT[self.name])[:limit]:
                print("    " + line[:400])


def torchrun(
    node_rank: int | None,
    port: int,
    *,
    nnodes: int = 2,
    nproc: int = 1,
    master_addr: str = "10.77.0.1",
    rdzv: str = "static",
    conf: str = "",
) -> list[str]:
    """The torchrun command line of one node: static (``--node-rank``) or c10d rendezvous."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
           f"--nproc-per-node={nproc}", "--max-restarts=0"]  # fmt: skip
    if rdzv == "static":
        cmd += [f"--node-rank={node_rank}", f"--master-addr={master_addr}",
                f"--master-port={port}"]  # fmt: skip
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{port}", "--rdzv-id=job"]
    if conf:
        cmd.append(f"--rdzv-conf={conf}")
    return [*cmd, "-m", "ddp_lab.tools.train", *TRAIN_ARGS]


def launch(
    c: hosts.Cluster,
    commands: list[list[str] | None],
    env: dict[str, str] | None = None,
    delays: tuple[float, ...] = (0.0, 0.0),
    late: bool = False,
    timeout: float = 120.0,
    grace: float = 15.0,
) -> list[NodeRun]:
    """Start ``commands[i]`` on host ``i`` after ``delays[i]`` s (``late``: host 1 only once
    host 0 has ended); when one node fails, stop the others after ``grace`` s (nothing else
    would: a static job just waits)."""
    root = str(Path(__file__).resolve().parents[2])
    full_env = {"PYTHONPATH": root, "OMP_NUM_THREADS": "1", **(env or {})}
    started = time.monotonic()
    procs: dict[int, subprocess.Popen] = {}
    ended: dict[int, float] = {}
    stopped: set[int] = set()
    failed_at = None
    while True:
        now = time.monotonic() - started
        for i, cmd in enumerate(commands):
            if late and i == 1 and 0 not in ended:
                continue
            if cmd and i not in procs and now >= delays[i]:
                procs[i] = c.start(i, cmd, full_env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)  # fmt: skip
        for i, p in procs.items():
            if i not in ended and p.poll() is not None:
                ended[i] = now
                if p.returncode and failed_at is None and not (late and i == 0):
                    failed_at = now
        waiting = [i for i, cmd in enumerate(commands) if cmd and i not in ended]
        overdue = failed_at is not None and now > failed_at + grace
        if not waiting or now > timeout or overdue:
            break
        time.sleep(0.2)
    for i in waiting:
        stopped.add(i)
        hosts.kill_in(c[i].netns)
    runs = []
    for i, p in sorted(procs.items()):
        out = p.communicate()[0]
        runs.append(NodeRun(c[i].hostname, list(commands[i] or []), p.returncode,
                            ended.get(i, time.monotonic() - started) - delays[i], out, "",
                            i in stopped))  # fmt: skip
    return runs


def _fix(env: dict[str, str] | None = None) -> dict[str, str]:
    return {"GLOO_SOCKET_IFNAME": "eth0", **(env or {})}


def _run(name: str) -> Scenario:
    etc = "cluster" if name in ("c10d", "late_node", "nnodes", "nnodes_silent") else "debian"
    with hosts.cluster(2, etc_hosts=etc) as c:
        used = [c.switch] + [h.netns for h in c.hosts]
        port = c.free_port(0)
        short = f"timeout={TIMEOUT},join_timeout={TIMEOUT},read_timeout={TIMEOUT}"
        two = [torchrun(i, port) for i in (0, 1)]
        if name == "look":
            doctor = ("from ddp_lab import doctor as d; import os; "
                      "f = d.gather_network(d.Facts(env=dict(os.environ))); "
                      "print('ddp-lab doctor:', d.gloo_interface(f)[1])")  # fmt: skip
            script = f'hostname; ip -br -4 addr show; cat /etc/hosts; "$0" -c "{doctor}"'
            look = [["sh", "-c", script, sys.executable]] * 2
            nodes = launch(c, look)  # type: ignore[arg-type]
        elif name == "one_host":
            one = torchrun(0, port, nnodes=1, nproc=2, master_addr="127.0.0.1")
            nodes = launch(c, [one, None], _fix())
        elif name in ("static", "etc_hosts"):
            nodes = launch(c, two, _fix() if name == "static" else {})
        elif name == "c10d":  # /etc/hosts lists both hosts: no GLOO_SOCKET_IFNAME needed
            nodes = launch(c, [torchrun(None, port, rdzv="c10d", master_addr="host0")] * 2)
        elif name == "c10d_no_host":  # Debian's /etc/hosts: no agent sees 10.77.0.1 as its own
            nodes = launch(c, [torchrun(None, port, rdzv="c10d", conf=short)] * 2, _fix())
        elif name == "loopback":
            nodes = launch(c, two)
        elif name == "localhost":
            nodes = launch(c, [torchrun(0, port, conf=short),
                               torchrun(1, port, master_addr="localhost", conf=short)], _fix())  # fmt: skip
        elif name == "firewall":
            rule = f"add rule inet f input tcp dport {port} drop"
            script = f"nft add table inet f; nft add chain inet f input '{{ type filter hook input priority 0; }}'; nft {rule}"  # noqa: E501
            c.run(0, ["sh", "-c", script])
            nodes = launch(c, [torchrun(i, port, conf=short) for i in (0, 1)], _fix())
        elif name == "late_node":
            cmds = [torchrun(None, port, rdzv="c10d", master_addr="host0", conf=short)] * 2
            nodes = launch(c, cmds, late=True)
        elif name in ("nnodes", "nnodes_silent"):
            # Each agent applies its own --nnodes when it joins (_add_to_participants in
            # torch/distributed/elastic/rendezvous/dynamic_rendezvous.py): the one that joins
            # second decides. host1 (--nnodes=3) second: the round never completes. host0
            # (--nnodes=2) second: it completes the round at 2 nodes. The delay sets the order,
            # and the first node hosts the store (so the second cannot join before it).
            silent = name == "nnodes_silent"
            conf = f"timeout={TIMEOUT},join_timeout=60" if silent else short
            first = "host1" if silent else "host0"
            two_nodes = torchrun(None, port, rdzv="c10d", master_addr=first, conf=conf)
            three = torchrun(None, port, nnodes=3, rdzv="c10d", master_addr=first, conf=conf)
            delays = (5.0, 0.0) if silent else (0.0, 5.0)
            nodes = launch(c, [two_nodes, three], delays=delays)
        else:
            raise KeyError(name)
    return Scenario(name, nodes, used)


def run_scenario(name: str) -> Scenario:
    """Run one scenario for real, on two fresh hosts (removed afterwards)."""
    return _run(name)


class Gallery:
    """Every scenario, started in the background (two at a time), or the stored run."""

    def __init__(self, names: tuple[str, ...] = tuple(EXPECT), workers: int = 2) -> None:
        self.reason = lab_reason(hosts.unavailable_reason())
        self.runs: dict[str, Future | Scenario] = {}
        if self.reason:
            stored = load_record(RECORD, self.reason)
            for name, nodes in stored["scenarios"].items():
                self.runs[name] = Scenario(name, [NodeRun(**n) for n in nodes])
            return
        self.pool = ThreadPoolExecutor(max_workers=workers)
        stored = {}
        if "firewall" in names and not shutil.which("nft"):  # Debian: apt-get install nftables
            stored = json.loads(RECORD.read_text())["scenarios"]
            print("nft not found: the firewall scenario shows its stored run")
        for name in names:
            if name in stored:
                self.runs[name] = Scenario(name, [NodeRun(**n) for n in stored[name]])
            else:
                self.runs[name] = self.pool.submit(run_scenario, name)

    def __getitem__(self, name: str) -> Scenario:
        run = self.runs[name]
        return run.result() if isinstance(run, Future) else run

    @property
    def netns(self) -> list[str]:
        """Every namespace the runs used (all removed by now)."""
        return [n for name in self.runs for n in self[name].netns]

    def show(self, name: str, limit: int = 3) -> None:
        """Print what scenario ``name`` did (waiting for it). It returns nothing, so that a cell
        ending with it shows only these lines, not the scenario's whole logs as its result;
        ``gallery[name]`` is the scenario."""
        self[name].show(limit)


def record(path: Path = RECORD, names: tuple[str, ...] = tuple(EXPECT)) -> dict:
    """Run every scenario for real and store what the chapter shows (needs root)."""
    g = Gallery(names)
    if g.reason:
        raise hosts.HostsUnavailable(g.reason)
    import torch

    data: dict = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                  "command": "python -m ddp_lab.labs.two_hosts record", "scenarios": {}}  # fmt: skip
    for name in names:
        scenario = g[name]
        for node in scenario.nodes:  # keep the lines worth reading, not whole logs
            node.stdout = "\n".join(node.lines(EXPECT[name] + r"|Error|error|accuracy")[:40])
        data["scenarios"][name] = [asdict(n) for n in scenario.nodes]
    store_record(path, data)
    return data


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        record(names=tuple(argv[1:]) or tuple(EXPECT))
    else:
        for name in argv or EXPECT:
            run_scenario(name).show(limit=20)


if __name__ == "__main__":
    main()
