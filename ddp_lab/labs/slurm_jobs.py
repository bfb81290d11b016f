"""Chapter 09's Slurm jobs: chapter 08's program under ``sbatch``, and the common mistakes.

:class:`Jobs` builds a two-node Slurm cluster (:mod:`ddp_lab.cluster.slurm`) in the background,
submits every script of :data:`ddp_lab.cluster.slurm.SCRIPTS` at once (they queue: each wants both
nodes), keeps what ``squeue`` showed right after the submission, waits for each job, reads
``sacct -c`` and removes the cluster. Where a cluster cannot be built (not root, no
``slurm-wlm``), it shows the stored outputs of a real run instead:
``python -m ddp_lab.labs.slurm_jobs record`` wrote them to ``slurm_run.json`` next to this file.
"""

from __future__ import annotations

import datetime
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp_lab.cluster import hosts, lab_reason, load_record, slurm, store_record

RECORD = Path(__file__).with_name("slurm_run.json")
# The lines of a job's output each scenario is about: the chapter prints them, tests check them.
EXPECT = {
    "ddp08": r"^world size|^done: test accuracy",
    "n_by_n": r"^@rank",
    "extra_agents": r"^@rank|^srun: error|RendezvousConnectionError: The connection",
    "no_torchrun": r"^world size|^done: test accuracy",
}


@dataclass
class Run:
    """What one run of every job showed: the queue, each job, the completion log."""

    squeue: str = ""
    sinfo: str = ""
    jobs: dict[str, slurm.Job] = field(default_factory=dict)
    sacct: str = ""  # `sacct -c`: the job completion log
    sacct_db: str = ""  # plain `sacct`: needs slurmdbd, which this cluster does not run
    netns: list[str] = field(default_factory=list)  # the namespaces it used (all gone now)


def run_all(names: tuple[str, ...] = tuple(slurm.SCRIPTS)) -> Run:
    """Build the cluster, submit every job, wait for each, remove the cluster."""
    out = Run()
    with slurm.cluster(2) as c:
        assert c.hosts is not None
        out.netns = [c.hosts.switch] + [h.netns for h in c.hosts.hosts]
        out.sinfo = c.run(["sinfo"]).stdout
        jobs = [c.submit(slurm.script(name, c.folder)) for name in names]
        for _ in range(40):  # until the first job runs: the others then wait for nodes
            out.squeue = c.run(["squeue"]).stdout
            if " R " in out.squeue:
                break
            time.sleep(0.25)
        for job in jobs:
            out.jobs[job.name] = c.wait(job)
        out.sacct = c.run(["sacct", "-c"]).stdout
        done = c.run(["sacct"])
        out.sacct_db = (done.stdout + done.stderr).strip()
    return out


class Jobs:
    """Every job, run in the background on a fresh cluster, or the stored run."""

    def __init__(self) -> None:
        self.reason = lab_reason(slurm.unavailable_reason())
        if self.reason:
            stored = load_record(RECORD, self.reason, slurm=True)
            jobs = {k: slurm.Job(**v) for k, v in stored["run"].pop("jobs").items()}
            self._run: Future | Run = Run(**stored["run"], jobs=jobs)
            return
        self._run = ThreadPoolExecutor(max_workers=1).submit(run_all)

    @property
    def run(self) -> Run:
        return self._run.result() if isinstance(self._run, Future) else self._run

    def show(self, name: str, limit: int = 12) -> slurm.Job:
        """The job's state and the lines of its output the chapter is about."""
        import re

        job = self.run.jobs[name]
        print(f"job {job.id} ({job.name}): {job.state}")
        for line in [ln for ln in job.output.splitlines() if re.search(EXPECT[name], ln)][:limit]:
            print("    " + line[:300])
        return job

    def left(self) -> list[str]:
        """Namespaces of the run still on this machine (none: teardown removed them)."""
        return [n for n in hosts.namespaces() if n in self.run.netns] if not self.reason else []


def record(path: Path = RECORD) -> dict:
    """Run every job for real and store what the chapter shows (needs root and Slurm)."""
    reason = slurm.unavailable_reason()
    if reason:
        raise hosts.HostsUnavailable(reason)
    import torch

    run = run_all()
    for name, job in run.jobs.items():  # the lines worth reading, not whole logs
        keep = EXPECT[name] + r"|Error|error|accuracy"
        job.output = "\n".join(job.lines(keep)[:40])
    data = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "command": "python -m ddp_lab.labs.slurm_jobs record", "run": asdict(run)}  # fmt: skip
    store_record(path, data)
    return data


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        record()
    else:
        r = run_all()
        print(r.squeue, r.sacct, sep="\n")
