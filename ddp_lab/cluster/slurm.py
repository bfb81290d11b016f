"""A one-machine Slurm cluster whose nodes are ``ddp_lab.cluster.hosts``, and jobs to run on it.

Chapter 09 submits chapter 08's training program with ``sbatch`` the way a university or lab
cluster runs it: one ``srun`` task per node, each task a ``torchrun`` that starts the node's
workers, the rendezvous endpoint taken from ``SLURM_JOB_NODELIST``. The nodes are the network
namespaces of :mod:`ddp_lab.cluster.hosts` (``host0``, ``host1``, with ``/etc/hosts`` listing both):
``slurmctld`` runs on host0, one ``slurmd`` on every host, and one ``munged`` signs their
messages (a real cluster runs ``munged`` on every node with the same key; here the hosts share
one filesystem, so they share one daemon's socket). The daemons listen on Slurm's default
ports (6817, 6818): inside the cluster's own namespaces, where no other program can hold them.

    with cluster(2) as c:
        job = c.submit(script("ddp08"))
        print(c.wait(job).output)

The command line does the same: ``ddp-lab slurm up`` / ``status`` / ``down``. Teardown kills
the daemons and the jobs with the hosts and removes the cluster's folder. Needs root, iproute2
and Debian's ``slurm-wlm`` and ``munge``. Teaching version: a real cluster's admins write the
configuration once, with cgroups, accounting (slurmdbd) and a shared home directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ddp_lab.cluster import hosts
from ddp_lab.i18n import _t

STATE_DIR = Path("/run/ddp-lab/slurm")  # one folder per cluster, named by its hosts' tag
TOOLS = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm",
         "munged": "munge"}  # fmt: skip
CPUS = 2  # per node; SlurmdParameters=config_overrides: the same on every machine


def unavailable_reason() -> str | None:
    """Why a Slurm cluster cannot be built here, in the current language; None if it can."""
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            return _t(
                "A Slurm cluster needs the `{tool}` command (Debian: apt-get install {package}).",
                tool=tool,
                package=package,
            )
    return hosts.unavailable_reason()


# --- job scripts ------------------------------------------------------------------------

# --time=5 (minutes): each job takes about 30 s on an idle 2-core machine; with a 2-minute limit a
# loaded one (load average 13, a website build beside other runs) ended extra_agents as TIMEOUT
# before its ranks had printed. The partition's MaxTime is 10 (slurm.conf below).
_HEAD = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node={tasks}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time=5
#SBATCH --output={folder}/%x-%j.out
"""
# The first node of the allocation hosts the rendezvous; the port is derived from the job id,
# so two jobs that share a node do not collide on it.
_ENDPOINT = """head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((20000 + SLURM_JOB_ID % 20000))
"""
# srun --cpus-per-task again: from Slurm 22.05 (Debian 12's) srun does not inherit sbatch's.
_TORCHRUN = """srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes={nnodes} --nproc-per-node=2 \\
  --rdzv-backend=c10d --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID" \\
  {program}
"""
_TRAIN = "-m ddp_lab.tools.train --epochs 2 --threads 1"
SCRIPTS = {
    # right: one task per node, torchrun starts the node's 2 workers ("GPUs") -> 4 ranks
    "ddp08": (1, '"$SLURM_NNODES"', _TRAIN),
    # one task per GPU *and* torchrun per task: 4 agents x 2 workers -> 8 ranks
    "n_by_n": (2, '"$SLURM_NTASKS"', "-m ddp_lab.cluster.slurm where"),
    # one task per GPU, --nnodes=$SLURM_NNODES: 4 agents for a 2-node rendezvous
    "extra_agents": (2, '"$SLURM_NNODES"', "-m ddp_lab.cluster.slurm where"),
    # one task per GPU and no torchrun: nobody sets RANK/WORLD_SIZE
    "no_torchrun": (2, "", "srun python " + _TRAIN),
}


def script(name: str, folder: str | Path = "/tmp") -> str:
    """The sbatch script ``name`` (see :data:`SCRIPTS`), writing its output to ``folder``."""
    if name not in SCRIPTS:
        raise ValueError(
            _t(
                "Unknown job script {name!r}: choose one of {choices}.",
                name=name,
                choices=", ".join(SCRIPTS),
            )
        )
    tasks, nnodes, program = SCRIPTS[name]
    text = _HEAD.format(name=name, tasks=tasks, cpus=CPUS // tasks, folder=folder)
    if not nnodes:
        return text + program + "\n"
    return text + _ENDPOINT + _TORCHRUN.format(nnodes=nnodes, program=program)


def where() -> None:
    """A job's worker: join the group, print host, ranks and Slurm's ids as one line."""
    import socket

    import torch.distributed as dist

    dist.init_process_group("gloo")
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID")
    rec = {"host": socket.gethostname(), **{k: os.environ.get(k) for k in keys},
           "group_size": dist.get_world_size()}  # fmt: skip
    os.write(1, ("@rank " + json.dumps(rec) + "\n").encode())  # one write: no interleaving
    # No rank leaves before every rank has joined: a rank that exits closes its gloo connections,
    # and a slower peer still connecting inside init_process_group then fails with "Gloo
    # connectFullMesh failed ... Connection closed by peer" (seen under load in the n_by_n job;
    # ddp_lab/runtime/_rank.py's finish_together says why).
    dist.barrier()
    dist.destroy_process_group()


# --- the cluster ------------------------------------------------------------------------


@dataclass
class Job:
    """One submitted job: its id, script, and (once it ended) state and output."""

    id: int
    name: str
    script: str
    state: str = "PENDING"
    output: str = ""

    def records(self) -> list[dict]:
        """The ``@rank`` lines of :func:`where`, sorted by host and rank."""
        out = [json.loads(ln[6:]) for ln in self.output.splitlines() if ln.startswith("@rank ")]
        return sorted(out, key=lambda r: (r["host"], int(r["RANK"] or 0)))

    def lines(self, pattern: str) -> list[str]:
        return [ln.strip() for ln in self.output.splitlines() if re.search(pattern, ln)]


@dataclass
class Cluster:
    """Slurm on N hosts: build with :func:`cluster` (or ``up``), remove with ``down``."""

    n: int = 2
    hosts: hosts.Cluster | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        assert self.hosts is not None
        return STATE_DIR / self.hosts.tag

    @property
    def env(self) -> dict[str, str]:
        """What a login shell on host0 would have: Slurm's config, this Python, ddp_lab."""
        bin_dir = str(Path(sys.executable).parent)
        root = str(Path(__file__).resolve().parents[2])
        return {"SLURM_CONF": str(self.folder / "slurm.conf"), "OMP_NUM_THREADS": "1",
                "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                "PYTHONPATH": root}  # fmt: skip

    def up(self, timeout: float = 30.0) -> Cluster:
        """Build the hosts, write key and configuration, start munged, slurmctld, slurmds."""
        reason = unavailable_reason()
        if reason:
            raise hosts.HostsUnavailable(reason)
        self.hosts = hosts.Cluster(self.n, etc_hosts="cluster")
        try:
            self.hosts.up()
            self._configure()
            sock = str(self.folder / "munge.sock")
            self._daemon(0, "munged", ["munged", "-F", "--force", f"--socket={sock}",
                                       f"--key-file={self.folder / 'munge.key'}",
                                       f"--pid-file={self.folder / 'munged.pid'}",
                                       f"--seed-file={self.folder / 'munged.seed'}",
                                       f"--origin={self.hosts[0].addr}"])  # fmt: skip
            conf = str(self.folder / "slurm.conf")
            self._daemon(0, "slurmctld", ["slurmctld", "-D", "-f", conf])
            for i in range(self.n):
                (self.folder / f"spool-host{i}").mkdir()
                self._daemon(i, f"slurmd-host{i}", ["slurmd", "-D", "-f", conf])
            self._wait_idle(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def _configure(self) -> None:
        self.folder.mkdir(parents=True, mode=0o755)
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))  # the secret every node's munged shares
        key.chmod(0o400)
        f = self.folder
        nodes = "\n".join(f"NodeName={h.hostname} NodeAddr={h.addr} CPUs={CPUS} State=UNKNOWN"
                          for h in self.hosts or [])  # fmt: skip
        (f / "slurm.conf").write_text(f"""\
ClusterName=ddplab
SlurmctldHost=host0({self.hosts[0].addr if self.hosts else ""})
AuthType=auth/munge
AuthInfo=socket={f}/munge.sock
SlurmUser=root
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool-%n
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd-%n.pid
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/filetxt
JobCompLoc={f}/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
""")
        # cgroup v1 is what this machine mounts; proctrack/linuxproc needs none of it
        (f / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _daemon(self, i: int, name: str, argv: list[str]) -> None:
        assert self.hosts is not None
        with open(self.folder / f"{name}.out", "wb") as log:
            self.procs.append(self.hosts.start(i, argv, self.env, stdout=log,
                                               stderr=subprocess.STDOUT))  # fmt: skip

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=10).stdout.split()
            if len(states) == self.n and all(s == "idle" for s in states):
                return
            time.sleep(0.5)
        logs = [line for p in sorted(self.folder.glob("*.out")) for line in
                p.read_text(errors="replace").splitlines()[-3:]]  # fmt: skip
        raise RuntimeError(
            _t(
                "The Slurm daemons did not come up within {seconds} s. Their last log "
                "lines:\n{logs}",
                seconds=timeout,
                logs="\n".join(logs),
            )
        )

    def run(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a command on host0, the login node (``squeue``, ``sinfo``, ``sacct``...)."""
        assert self.hosts is not None
        return self.hosts.run(0, argv, self.env, timeout=timeout)

    def submit(self, text: str) -> Job:
        """``sbatch`` the script ``text`` from host0; the job id comes back at once."""
        name = re.search(r"--job-name=(\S+)", text)
        path = self.folder / f"{name.group(1) if name else 'job'}.sbatch"
        path.write_text(text)
        done = self.run(["sbatch", "--parsable", str(path)])
        if done.returncode:
            raise RuntimeError(done.stderr.strip())
        return Job(int(done.stdout.split(";")[0]), path.stem, text)

    def wait(self, job: Job, timeout: float = 180.0) -> Job:
        """Wait until ``job`` has left the queue; fill in its final state and output."""
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-j", str(job.id)]).stdout.strip():
            if time.monotonic() > deadline:
                self.run(["scancel", str(job.id)])
                break
            time.sleep(0.5)
        for line in self.completions():
            if line.get("JobId") == str(job.id):
                job.state = line.get("JobState", "?")
        out = self.folder / f"{job.name}-{job.id}.out"
        job.output = out.read_text(errors="replace") if out.exists() else ""
        return job

    def completions(self) -> list[dict[str, str]]:
        """The job completion log (what ``sacct -c`` reads), one dict per ended job."""
        path = self.folder / "jobcomp.txt"
        text = path.read_text() if path.exists() else ""
        return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                for line in text.splitlines()]  # fmt: skip

    def down(self) -> None:
        """Kill daemons and jobs with the hosts; remove the cluster's folder."""
        if self.hosts is not None:
            folder = self.folder
            self.hosts.down()
            shutil.rmtree(folder, ignore_errors=True)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.procs.clear()


def status() -> list[str]:
    """One line per Slurm cluster on this machine: its folder and its nodes' states."""
    lines, clusters = [], hosts.clusters()
    for folder in sorted(STATE_DIR.iterdir()) if STATE_DIR.is_dir() else []:
        state = clusters.get(folder.name)
        if not state or not state.get("hosts"):
            lines.append(f"{folder}: orphan (removed by `ddp-lab slurm down`)")
            continue
        login = hosts.Host(**state["hosts"][0])
        sinfo = ["env", f"SLURM_CONF={folder / 'slurm.conf'}", "sinfo", "-h", "-N", "-o", "%N=%T"]
        done = subprocess.run(login.command(sinfo), capture_output=True, text=True, timeout=30)
        lines.append(f"{folder}: login node {login.netns}; " + " ".join(done.stdout.split()))
    return lines


def down(all_clusters: bool = False) -> list[str]:
    """Remove what killed runs (or ``slurm up``) left: their hosts and their folders."""
    gone = hosts.down(all_clusters=all_clusters)
    tags = set(hosts.clusters())
    for folder in STATE_DIR.iterdir() if STATE_DIR.is_dir() else []:
        if folder.name not in tags:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(str(folder))
    return gone


@contextlib.contextmanager
def cluster(n: int = 2) -> Iterator[Cluster]:
    """``with cluster(2) as c:`` Slurm on N hosts, always removed on the way out."""
    with hosts.up_until_exit(Cluster(n)) as c:  # a killed cell or test (SIGTERM) too
        yield c


if __name__ == "__main__":
    if sys.argv[1:] == ["where"]:
        where()
