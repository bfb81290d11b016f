"""Preemption under Slurm: a warning signal, a checkpoint, a requeue, a resumed job.

On the local Slurm cluster (``ddp_lab.cluster.slurm``: two hosts, 2 CPUs each) one job runs
chapter 08's training program on 2 nodes x 1 worker straight through; a second, identical job
is warned mid-run with SIGUSR1, the signal Slurm sends ``sig_time`` seconds before the time
limit when the script asks for it (``#SBATCH --signal=USR1@60``). ``scancel --signal=USR1``
sends the same signal to the job's steps now, standing in for the time limit coming. torchrun
passes it on to its workers (``--signals-to-handle`` lists SIGUSR1), every rank finishes its
step, a checkpoint is written, and the batch script requeues its own job
(``scontrol requeue``, allowed by ``--requeue``). Slurm starts the script again from the top
with the same job id; the program resumes from the checkpoint, and ends with the same SHA-256
as the job that nothing interrupted.

:func:`run` does it for real (root, ``slurm-wlm``, ``munge``) and returns a :class:`Record`;
where a cluster cannot be built, :class:`Runs` shows the stored record of a real run
(``python -m ddp_lab.labs.preemption record`` wrote ``preemption_run.json`` next to this file).
"""

from __future__ import annotations

import datetime
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp_lab.cluster import hosts, lab_reason, load_record, slurm, store_record

RECORD = Path(__file__).with_name("preemption_run.json")
TRAIN = "--epochs 3 --threads 1 --step-sleep 0.1 --checkpoint-every 5 --preempt-signal USR1"
SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=10
#SBATCH --signal=USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={folder}/%x-%j.out
echo "batch script starts: SLURM_RESTART_COUNT=${{SLURM_RESTART_COUNT:-0}}"
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((20000 + SLURM_JOB_ID % 20000))
srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes="$SLURM_NNODES" \\
  --nproc-per-node=1 --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \\
  --rdzv-backend=c10d --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID" \\
  -m ddp_lab.tools.train {train} --checkpoint-dir {checkpoints}
if [ -e {checkpoints}/preempted ]; then
  echo "checkpoint written after step $(cat {checkpoints}/preempted): requeue"
  scontrol requeue "$SLURM_JOB_ID"
fi
"""
# The lines of a job's output the chapter reads
KEEP = (
    r"^batch script starts|^world size|^resumed from|arrived: stopped|requeue|^done: test"
    r"|sha256|Received .* death signal|exitcode"
)


@dataclass
class Record:
    """Both jobs: their scripts, states, kept output lines, what this module did and when."""

    straight: dict = field(default_factory=dict)  # job id, state, output
    preempted: dict = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    script: str = ""
    netns: list[str] = field(default_factory=list)

    def digests(self) -> tuple[str | None, str | None]:
        def last(out: str) -> str | None:
            found = re.findall(r"sha256 ([0-9a-f]{64})", out)
            return found[-1] if found else None

        return last(self.straight.get("output", "")), last(self.preempted.get("output", ""))

    def show(self, which: str) -> None:
        job = getattr(self, which)
        print(f"job {job['id']} ({which}): {job['state']}")
        for line in job["output"].splitlines():
            if re.search(KEEP, line):
                print("    " + line[:200])


def script(name: str, folder: str | Path, checkpoints: str | Path) -> str:
    """The sbatch script of a preemptible training job."""
    return SCRIPT.format(name=name, folder=folder, checkpoints=checkpoints, train=TRAIN)


def run(timeout: float = 400.0) -> Record:
    """Both jobs on a fresh two-node Slurm cluster, the second warned mid-run (needs root)."""
    reason = slurm.unavailable_reason()
    if reason:
        raise hosts.HostsUnavailable(reason)
    rec = Record()
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ddp-lab-preempt-"))

    def note(text: str) -> None:
        rec.events.append(f"{time.monotonic() - t0:6.1f} s  {text}")

    try:
        with slurm.cluster(2) as c:
            assert c.hosts is not None
            rec.netns = [c.hosts.switch] + [h.netns for h in c.hosts.hosts]
            rec.script = script("preempted", "FOLDER", "CHECKPOINTS")
            straight = c.submit(script("straight", c.folder, work / "straight"))
            job = c.submit(script("preempted", c.folder, work / "preempted"))
            note(f"submitted job {straight.id} (straight) and job {job.id} (to be preempted)")
            c.wait(straight, timeout=timeout / 2)
            note(f"job {straight.id} ended: {straight.state}")
            deadline = time.monotonic() + timeout / 2
            while time.monotonic() < deadline:  # a checkpoint: the job trains
                if list((work / "preempted").glob("step-*.pt")):
                    break
                time.sleep(0.2)
            done = c.run(["scancel", "--signal=USR1", str(job.id)])
            note(
                f"scancel --signal=USR1 {job.id}: exit code {done.returncode} {done.stderr.strip()}"
            )
            while time.monotonic() < deadline:  # requeued: pending until its EligibleTime
                shown = c.run(["scontrol", "show", "job", str(job.id)]).stdout
                if "Restarts=1" in shown and "JobState=PENDING" in shown:
                    when = re.findall(r"(SubmitTime=\S+|EligibleTime=\S+|Reason=\S+)", shown)
                    note(f"job {job.id} requeued, pending: {' '.join(when)}")
                    # Not "now": slurmd refuses a credential made in the second its previous
                    # run's was revoked (ctime <= revoked, in seconds: src/slurmd/slurmd/
                    # cred_context.c), and the job then fails with "Job credential revoked".
                    c.run(["scontrol", "update", f"JobId={job.id}", "StartTime=now+2"])
                    note(f"scontrol update JobId={job.id} StartTime=now+2")
                    break
                time.sleep(0.5)
            out = c.folder / f"{job.name}-{job.id}.out"
            while time.monotonic() < deadline:  # until the second run has started and ended
                shown = c.run(["scontrol", "show", "job", str(job.id)]).stdout
                second = out.exists() and "SLURM_RESTART_COUNT=1" in out.read_text()
                if second and re.search(r"JobState=(COMPLETED|FAILED|CANCEL|TIMEOUT)", shown):
                    break
                time.sleep(0.5)
            c.wait(job, timeout=10.0)
            note(f"job {job.id} left the queue: {job.state}")
            for name, j in (("straight", straight), ("preempted", job)):
                keep = "\n".join(j.lines(KEEP + r"|Error|error"))
                setattr(rec, name, {"id": j.id, "state": j.state, "output": keep})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rec


class Runs:
    """The run in the background on a fresh cluster, or the stored run."""

    def __init__(self) -> None:
        self.reason = lab_reason(slurm.unavailable_reason())
        if self.reason:
            stored = load_record(RECORD, self.reason, slurm=True)
            self._run: Future | Record = Record(**stored["run"])
            return
        pool = ThreadPoolExecutor(max_workers=1)
        self._run = pool.submit(run)
        pool.shutdown(wait=False)

    @property
    def run(self) -> Record:
        return self._run.result() if isinstance(self._run, Future) else self._run


def shorten(line: str) -> str:
    """An output line without this machine's folders and the logger's date and pid."""
    line = re.sub(r"/tmp/ddp-lab-preempt-\w+/", "/tmp/ddp-lab-preempt-…/", line)
    return re.sub(r"^[IWE]\d{4} [\d:.]+ \d+ \S*/torch/distributed/", "torch/distributed/", line)


def record(path: Path = RECORD) -> dict:
    """Run it for real and store what the chapter shows (needs root and Slurm)."""
    import torch

    rec = run()
    for job in (rec.straight, rec.preempted):
        job["output"] = "\n".join(shorten(line) for line in job["output"].splitlines())
    data = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "command": "python -m ddp_lab.labs.preemption record", "run": asdict(rec)}  # fmt: skip
    store_record(path, data)
    return data


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        record()
    else:
        r = run()
        print("\n".join(r.events))
        r.show("straight")
        r.show("preempted")
        print(r.digests())
