"""ddp_lab.labs.preemption: a Slurm job warned with SIGUSR1 checkpoints, requeues itself, resumes,
and ends with the digest of a job that nothing interrupted.

The real run needs root and Debian's slurm-wlm and munge (test.sh installs them as root, as
in CI); elsewhere it skips and says why. The stored run the chapter shows is checked everywhere.
"""

from __future__ import annotations

import json
import os

import pytest

from ddp_lab.cluster import hosts, slurm
from ddp_lab.labs import preemption

REASON = slurm.unavailable_reason() if hasattr(os, "geteuid") else "not Linux"
needs_slurm = pytest.mark.skipif(bool(REASON), reason=f"cannot build Slurm here: {REASON}")


def check(rec: preemption.Record) -> None:
    explain = "\n".join(rec.events) + "\n" + rec.preempted.get("output", "")
    assert rec.straight["state"] == rec.preempted["state"] == "COMPLETED", explain
    out = rec.preempted["output"]
    assert "SLURM_RESTART_COUNT=0" in out and "SLURM_RESTART_COUNT=1" in out, explain
    assert "SIGUSR1 arrived: stopped after step" in out and "resumed from" in out, explain
    straight, preempted = rec.digests()
    assert straight is not None and straight == preempted, explain


def test_stored_run_resumes_to_the_same_digest() -> None:
    check(preemption.Record(**json.loads(preemption.RECORD.read_text())["run"]))


@needs_slurm
def test_preempted_job_requeues_and_ends_bit_for_bit_like_the_straight_one() -> None:
    rec = preemption.run()
    check(rec)
    assert not [n for n in hosts.namespaces() if n in rec.netns]
    tag = rec.netns[0].split("-")[1]  # ddplab-<tag>-sw
    assert not (slurm.STATE_DIR / tag).exists()
