"""ddp_lab.cluster.slurm and slurm_jobs: Slurm on local hosts, chapter 09's jobs, nothing left behind.

The cluster tests need root and Debian's slurm-wlm and munge (test.sh installs them as root,
as in CI); elsewhere they skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import private_tmp

from ddp_lab.cluster import hosts, slurm
from ddp_lab.course import cli
from ddp_lab.i18n import pair
from ddp_lab.labs import slurm_jobs

ROOT = Path(__file__).resolve().parents[2]
REASON = slurm.unavailable_reason() if hasattr(os, "geteuid") else "not Linux"
needs_slurm = pytest.mark.skipif(bool(REASON), reason=f"cannot build Slurm here: {REASON}")


def left_behind(folder: Path, netns: list[str]) -> list[str]:
    """Namespaces, the folder and daemons of one cluster that still exist."""
    found = [n for n in hosts.namespaces() if n in netns]
    found += [str(folder)] if folder.exists() else []
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    found += [ln for ln in ps.splitlines() if str(folder) in ln and not ln.startswith("Z")]
    return found


def explain(job: slurm.Job, lines: int = 60) -> str:
    """A failed assertion's message: the job's state and the end of its output."""
    tail = "\n".join(job.output.splitlines()[-lines:])
    return f"job {job.id} ({job.name}) {job.state}, last lines of its output:\n{tail}"


def test_missing_slurm_says_so_in_both_languages(monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which
    # Every other tool there (faked where this machine lacks it too): the reason names slurmd.
    monkeypatch.setattr(
        shutil, "which", lambda t: None if t == "slurmd" else real(t) or f"/usr/bin/{t}"
    )
    en, zh = pair(
        "A Slurm cluster needs the `{tool}` command (Debian: apt-get install {package}).",
        tool="slurmd",
        package="slurm-wlm",
    )
    assert slurm.unavailable_reason() in (en, zh)
    assert "apt-get install slurm-wlm" in en and "apt-get install slurm-wlm" in zh
    c = slurm.Cluster(2)
    with pytest.raises(hosts.HostsUnavailable):
        c.up()
    assert c.hosts is None  # refused before anything was built


def test_scripts_are_valid_bash_and_unknown_names_are_refused(tmp_path: Path) -> None:
    for name in slurm.SCRIPTS:
        text = slurm.script(name, tmp_path)
        (tmp_path / f"{name}.sbatch").write_text(text)
        assert subprocess.run(["bash", "-n", str(tmp_path / f"{name}.sbatch")]).returncode == 0
        assert f"--job-name={name}" in text and "--nodes=2" in text
    right = slurm.script("ddp08")
    assert "--ntasks-per-node=1" in right and 'torchrun --nnodes="$SLURM_NNODES"' in right
    assert "SLURM_JOB_NODELIST" in right
    with pytest.raises(ValueError, match="ddp08"):
        slurm.script("ddp8")


def test_stored_run_shows_every_job(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(slurm, "unavailable_reason", lambda: "not root.")
    jobs = slurm_jobs.Jobs()
    stored = json.loads(slurm_jobs.RECORD.read_text())
    assert stored["date"] in capsys.readouterr().out
    for name in slurm.SCRIPTS:
        job = jobs.show(name)
        assert job.lines(slurm_jobs.EXPECT[name]), name
    assert jobs.left() == []


@needs_slurm
def test_jobs_train_like_one_host_show_each_mistake_and_leave_nothing() -> None:
    run = slurm_jobs.run_all()
    folder = slurm.STATE_DIR / run.netns[1].split("-")[1]
    assert not left_behind(folder, run.netns)
    assert run.squeue.count(" PD ") + run.squeue.count(" R ") == len(slurm.SCRIPTS)
    jobs = run.jobs
    # the right script: 2 nodes x 2 workers, the accuracy of the same 4 ranks on one host
    assert jobs["ddp08"].state == "COMPLETED", explain(jobs["ddp08"])
    assert jobs["ddp08"].lines(r"^world size 4,"), explain(jobs["ddp08"])
    one_host = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
         "-m", "ddp_lab.tools.train", "--epochs", "2", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": private_tmp()},
    )  # fmt: skip
    accuracy = re.compile(r"done: test accuracy ([\d.]+)%")
    assert accuracy.findall(one_host.stdout) == accuracy.findall(jobs["ddp08"].output) != []
    # a task per GPU and torchrun per task: 8 ranks, two of them per (host, LOCAL_RANK)
    recs = jobs["n_by_n"].records()
    assert len(recs) == 8 and {r["group_size"] for r in recs} == {8}, explain(jobs["n_by_n"])
    seats = [(r["host"], r["LOCAL_RANK"]) for r in recs]
    assert all(seats.count(s) == 2 for s in seats)
    # a task per GPU, --nnodes=$SLURM_NNODES: 4 ranks train, 2 agents are left out, job fails
    assert jobs["extra_agents"].state == "FAILED", explain(jobs["extra_agents"])
    assert [r["group_size"] for r in jobs["extra_agents"].records()] == [4] * 4
    # no torchrun: four lone trainings of world size 1
    assert len(jobs["no_torchrun"].lines(r"^world size 1,")) == 4, explain(jobs["no_torchrun"])
    assert len(jobs["no_torchrun"].lines(r"^done: test accuracy")) == 4
    for job in jobs.values():
        assert re.search(rf"^{job.id}\s.*{job.state}", run.sacct, re.M), job
    assert "accounting storage is disabled" in run.sacct_db


@needs_slurm
def test_killed_owner_leaves_nothing_after_down() -> None:
    code = (
        "from ddp_lab.cluster import slurm; import time\n"
        "c = slurm.Cluster(2).up()\n"
        "print(c.folder, *[h.netns for h in c.hosts.hosts], c.hosts.switch, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    folder, *netns = owner.stdout.readline().split()  # type: ignore[union-attr]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert left_behind(Path(folder), netns)  # the daemons outlive their owner...
    slurm.down()
    deadline = time.monotonic() + 10
    while left_behind(Path(folder), netns) and time.monotonic() < deadline:
        time.sleep(0.2)  # killed daemons disappear once reaped
    assert not left_behind(Path(folder), netns)  # ...until `down` removes them


@needs_slurm
def test_cli_up_status_down(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["slurm", "up", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"debug\*\s+up.*2\s+idle host\[0-1\]", out), out
    folder = Path(re.search(r"SLURM_CONF=(\S+)/slurm.conf", out).group(1))  # type: ignore[union-attr]
    assert cli.main(["slurm", "status"]) == 0
    assert "host0=idle host1=idle" in capsys.readouterr().out
    tag = folder.name
    netns = hosts.namespaces(tag)
    assert cli.main(["slurm", "down"]) == 0
    assert str(folder) in capsys.readouterr().out
    deadline = time.monotonic() + 10
    while left_behind(folder, netns) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left_behind(folder, netns)
