"""A local cluster of "hosts": Linux network namespaces on a bridge, one call to build it.

Chapter 09 runs a two-node job where the two nodes really are apart: each host is a
network namespace with its own address (``10.77.0.1``, ``10.77.0.2``, ...), its own
interface ``eth0`` (a veth pair whose other end sits on a bridge), its own loopback, its own
``/etc/hosts`` and its own hostname (a UTS namespace per command). The bridge lives in a
namespace of its own (the "switch"), so nothing of a cluster touches this machine's network
and two clusters (two tests in parallel) never see each other, even with the same addresses.

    with cluster(2) as hosts:
        hosts.run(0, ["hostname", "-I"])

The command line does the same: ``ddp-lab hosts up 2`` / ``status`` / ``down``. Teardown kills
every process left in the namespaces and deletes them (with their links and ports); ``down``
also removes what a killed run left behind (clusters whose owner process is gone).

By default each host's ``/etc/hosts`` maps its own name to ``127.0.1.1``, as Debian's
installer writes it: that is what makes gloo pick the loopback on real machines (chapter 09).
``etc_hosts="cluster"`` lists every host with its real address instead.

Links with a bandwidth: ``cluster(2, rate_mbit=100)`` (``ddp-lab hosts up 2 --rate-mbit 100``)
shapes each host's link with ``tc``, both ways: a ``tbf`` qdisc on the host's ``eth0`` (what
it sends) and one on its port of the switch (what it receives). ``delay_ms`` adds a ``netem``
delay to what each host sends (so one way between two hosts takes ``delay_ms`` more, a round
trip twice that); kernels without netem get a clear error before anything is built. Chapter
04 measures all-reduce over such links (``ddp_lab.labs.shaped_links``).

Needs root (iproute2's ``ip netns`` mounts under /run/netns). Teaching version of what a
real cluster gives you for free; on real machines you do not build the network yourself.

The link shaping (``tc``) lives in ``cluster/shaping.py``; its names are re-exported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_lab.cluster.shaping import (
    PROBE_PREFIX,
    check_shaping,
    probe_maker,
    probe_name,
    shape,
    shaping_unavailable_reason,
    tc_commands,
)
from ddp_lab.i18n import _t

__all__ = [
    "ETC_NETNS",
    "IFNAME",
    "PREFIX",
    "PROBE_PREFIX",
    "STATE_DIR",
    "SUBNET",
    "Cluster",
    "Host",
    "HostsUnavailable",
    "ShapingUnavailable",
    "check_shaping",
    "cluster",
    "clusters",
    "down",
    "kill_in",
    "namespaces",
    "probe_maker",
    "probe_name",
    "remove",
    "shape",
    "shaping_unavailable_reason",
    "tc_commands",
    "tmpdir",
    "unavailable_reason",
    "up_until_exit",
]

PREFIX = "ddplab"  # every namespace of a cluster: ddplab-<tag>-sw, ddplab-<tag>-h0, ...
SUBNET = "10.77.0"
IFNAME = "eth0"
STATE_DIR = Path("/run/ddp-lab/hosts")  # one <tag>.json per cluster: owner pid, hosts
ETC_NETNS = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*


class HostsUnavailable(RuntimeError):
    """Namespaces cannot be created here (not root, no iproute2, a locked-down container)."""


class ShapingUnavailable(HostsUnavailable):
    """This kernel (or this ``tc``) cannot shape the links as asked: no netem for a delay."""


def unavailable_reason() -> str | None:
    """Why hosts cannot be built on this machine, in the current language; None if they can."""
    if os.geteuid() != 0:
        return _t(
            "Building hosts needs root: network namespaces are created under "
            "/run/netns by `ip netns add`. Run as root (e.g. in the CI container), "
            "or read the stored outputs of a real run that chapter 09 shows instead."
        )
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return _t(
                "Building hosts needs the `{tool}` command (Debian: apt-get install {package}).",
                tool=tool,
                package=package,
            )
    probe = probe_name()
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if done.returncode != 0:
        return _t(
            "This machine does not let us create a network namespace ({error}). A "
            "container needs CAP_SYS_ADMIN and CAP_NET_ADMIN for it.",
            error=done.stderr.strip(),
        )
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            _t(
                "`{command}` failed: {error}",
                command="ip " + " ".join(args),
                error=done.stderr.strip(),
            )
        )


@dataclass
class Host:
    """One host of a cluster: a network namespace with an address, an interface and a name."""

    index: int
    hostname: str  # host0, host1, ... (set in a UTS namespace for every command)
    netns: str  # the namespace's name, unique per cluster
    addr: str  # its address on the bridge
    ifname: str = IFNAME

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on this host: in its namespace, under its own hostname."""
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script,
                self.hostname, *argv]  # fmt: skip


@dataclass
class Cluster:
    """N hosts on one bridge. Build with :func:`cluster` (or ``up``), remove with ``down``."""

    n: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    etc_hosts: str = "debian"  # "debian": own name -> 127.0.1.1; "cluster": real addresses
    hosts: list[Host] = field(default_factory=list)
    rate_mbit: float | None = None  # each host's link, each way (tbf); None: unshaped
    delay_ms: float | None = None  # added to every packet a host sends (netem); None: none

    @property
    def switch(self) -> str:
        return f"{PREFIX}-{self.tag}-sw"

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def up(self) -> Cluster:
        """Create the switch, then each host with its veth pair, address and /etc/hosts."""
        if not (isinstance(self.n, int) and 1 <= self.n <= 200):
            raise ValueError(_t("A cluster has 1 to 200 hosts, got {n!r}.", n=self.n))
        check_shaping(self.rate_mbit, self.delay_ms)
        reason = unavailable_reason()
        if reason:
            raise HostsUnavailable(reason)
        reason = shaping_unavailable_reason(self.rate_mbit, self.delay_ms)
        if reason:
            raise ShapingUnavailable(reason)
        self._write_state()  # first: a crash from here on leaves something `down` can find
        folder = tmpdir(self.tag)
        folder.mkdir(exist_ok=True)
        folder.chmod(0o1777)  # like /tmp: a Slurm job may run as another user
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.n):
            host = Host(i, f"host{i}", f"{PREFIX}-{self.tag}-h{i}", f"{SUBNET}.{i + 1}")
            self.hosts.append(host)
            _ip("netns", "add", host.netns)
            # Both ends are created inside namespaces: this machine's own links never change.
            _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth",
                "peer", "name", IFNAME, "netns", host.netns)  # fmt: skip
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", IFNAME)
            _ip("-n", host.netns, "link", "set", IFNAME, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            if self.rate_mbit or self.delay_ms:
                shape(host.netns, IFNAME, self.rate_mbit, self.delay_ms)  # what it sends
                shape(self.switch, f"p{i}", self.rate_mbit, None)  # what it receives
        for host in self.hosts:  # once all exist: "cluster" lists every host on each
            self._write_etc_hosts(host)
        self._write_state()
        return self

    def _write_etc_hosts(self, host: Host) -> None:
        lines = ["127.0.0.1\tlocalhost"]
        if self.etc_hosts == "debian":
            lines.append(f"127.0.1.1\t{host.hostname}")  # what Debian's installer writes
        else:
            lines += [f"{h.addr}\t{h.hostname}" for h in self.hosts]
        folder = ETC_NETNS / host.netns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def set_etc_hosts(self, mode: str) -> None:
        """Rewrite every host's /etc/hosts ("debian" or "cluster"); the next command sees it."""
        self.etc_hosts = mode
        for host in self.hosts:
            self._write_etc_hosts(host)

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"tag": self.tag, "owner": os.getpid(), "owner_start": _start_time(os.getpid()),
                 "hosts": [h.__dict__ for h in self.hosts]}  # fmt: skip
        if self.rate_mbit or self.delay_ms:
            state["rate_mbit"], state["delay_ms"] = self.rate_mbit, self.delay_ms
        (STATE_DIR / f"{self.tag}.json").write_text(json.dumps(state))

    def start(self, i: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **popen: object) -> subprocess.Popen:  # fmt: skip
        """Start ``argv`` on host ``i`` (``env`` is added to this process's environment)."""
        # TMPDIR: the cluster's own, removed with it (torchrun leaves a folder of logs there)
        full_env = {**os.environ, "TMPDIR": str(tmpdir(self.tag)), **(env or {})}
        return subprocess.Popen(self.hosts[i].command(argv), env=full_env, **popen)  # type: ignore[call-overload]

    def run(self, i: int, argv: Sequence[str], env: dict[str, str] | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess:  # fmt: skip
        """Run ``argv`` on host ``i`` to the end; its output comes back as text."""
        proc = self.start(i, argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_in(self.hosts[i].netns)
            out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def free_port(self, i: int) -> int:
        """A port nobody listens on, asked of host ``i``'s own network stack."""
        code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        return int(self.run(i, [sys.executable, "-c", code], timeout=30).stdout)

    def owner_gone(self) -> None:
        """Record that no process owns this cluster any more (``hosts up`` leaves it up)."""
        path = STATE_DIR / f"{self.tag}.json"
        state = json.loads(path.read_text())
        state["owner"] = None
        path.write_text(json.dumps(state))

    def down(self) -> None:
        """Kill what runs in the hosts, delete the namespaces (links and ports go with them)."""
        remove(self.tag)
        self.hosts.clear()


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def namespaces(tag: str | None = None) -> list[str]:
    """The namespaces of one cluster (or of every cluster) that exist now.

    Without the `ip` command (no iproute2) none can have been built: an empty list, so that
    removing a cluster that never came up does not fail after ``HostsUnavailable``.
    """
    if shutil.which("ip") is None:
        return []
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    start = f"{PREFIX}-{tag}-" if tag else f"{PREFIX}-"
    return [name for name in names if name.startswith(start)]


def kill_in(netns: str) -> list[int]:
    """SIGKILL every process whose network namespace is ``netns``; return their pids."""
    pids: list[int] = []
    for _ in range(50):  # a dying parent may still fork: repeat until none is left
        done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        found = [int(p) for p in done.stdout.split() if int(p) != os.getpid()]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pids += found
        time.sleep(0.05)
    return pids


def tmpdir(tag: str) -> Path:
    """The ``TMPDIR`` of everything started on a cluster's hosts, removed with the cluster."""
    return Path(tempfile.gettempdir()) / f"{PREFIX}-{tag}-tmp"


def remove(tag: str) -> list[str]:
    """Remove one cluster: its processes, namespaces, /etc/netns files and state file."""
    gone = []
    for netns in sorted(namespaces(tag), key=lambda n: n.endswith("-sw")):  # switch last
        kill_in(netns)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        gone.append(netns)
    for folder in ETC_NETNS.glob(f"{PREFIX}-{tag}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(tmpdir(tag), ignore_errors=True)
    (STATE_DIR / f"{tag}.json").unlink(missing_ok=True)
    return gone


def clusters() -> dict[str, dict]:
    """Every cluster on this machine, from its namespaces and state files: tag -> state.

    A throw-away namespace (``shaping.probe_name``) whose process still lives is not a
    cluster: it is left out. One that a killed process left behind is listed (not alive), so
    that ``down()`` removes it."""
    found: dict[str, dict] = {}
    for name in namespaces():
        tag = name[len(PREFIX) + 1 :].rsplit("-", 1)[0]
        maker = probe_maker(name)
        if maker is not None and _start_time(maker):
            continue  # a live process's probe, for a moment
        found.setdefault(tag, {"tag": tag, "owner": None, "hosts": []})
    for path in STATE_DIR.glob("*.json") if STATE_DIR.is_dir() else []:
        with contextlib.suppress(ValueError, OSError):
            found[path.stem] = json.loads(path.read_text())
    for state in found.values():
        owner = state.get("owner")
        state["alive"] = bool(owner) and _start_time(owner) == state.get("owner_start")
    return found


def down(all_clusters: bool = False) -> list[str]:
    """Remove the clusters nobody owns any more (a killed run, ``hosts up``); or all."""
    gone: list[str] = []
    for tag, state in clusters().items():
        if all_clusters or not state["alive"]:
            gone += remove(tag)
    return gone


@contextlib.contextmanager
def cluster(
    n: int = 2,
    etc_hosts: str = "debian",
    rate_mbit: float | None = None,
    delay_ms: float | None = None,
) -> Iterator[Cluster]:
    """``with cluster(2) as hosts:`` N hosts that are always removed on the way out.

    ``rate_mbit``: each host's link carries at most this many Mbit/s each way (tbf);
    ``delay_ms``: every packet a host sends waits this long (netem, where the kernel has it).

    SIGTERM is turned into an exception while the block runs (main thread only), so that a
    killed notebook cell or test still tears the hosts down; SIGKILL cannot be caught: the
    next ``down()`` removes what it leaves.
    """
    c = Cluster(n, etc_hosts=etc_hosts, rate_mbit=rate_mbit, delay_ms=delay_ms)
    with up_until_exit(c) as c:
        yield c


@contextlib.contextmanager
def up_until_exit(c: Any) -> Iterator[Any]:
    """``c.up()`` for the block, ``c.down()`` after it, also when SIGTERM ends the block.

    Any cluster with ``up()`` and ``down()`` (these hosts, ``ddp_lab.cluster.slurm``'s cluster).
    """
    previous = None
    if _main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield c.up()
    finally:
        c.down()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
