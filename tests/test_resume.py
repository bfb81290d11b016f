"""ddp_lab.tools.resume and ``ddp_lab.tools.train --checkpoint-every``: resume bit for bit, atomic writes.

Oracles: torch's DistributedSampler (the resumable sampler at position 0, and the tail of an
epoch after a stop), an uninterrupted torchrun run (the digest of a run killed by SIGKILL and
restarted by torchrun must equal it), and a writer killed inside ``torch.save``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import private_tmp
from torch.utils.data import DistributedSampler

from ddp_lab.tools import resume, train

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR")
    }
    # torchrun's default: one TCPStore shared across restarts (ddp_lab/attempt_store.py).
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=private_tmp(), **extra)
    return env


@pytest.mark.parametrize("n", [1, 7, 10, 33])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_sampler_at_position_0_is_distributed_sampler(n, world, shuffle):
    for rank in range(world):
        ours = resume.ResumableDistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=5
        )
        theirs = DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=5
        )
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


@pytest.mark.parametrize("n, world, batch, steps", [(33, 2, 4, 3), (50, 3, 2, 5), (10, 2, 3, 1)])
def test_sampler_continues_the_epoch_where_it_stopped(n, world, batch, steps):
    for rank in range(world):
        full = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=1)
        full.set_epoch(2)
        ours = resume.ResumableDistributedSampler(range(n), num_replicas=world, rank=rank, seed=1)
        ours.set_epoch(2)
        ours.advance(steps, batch)
        again = resume.ResumableDistributedSampler(range(n), num_replicas=world, rank=rank, seed=1)
        again.load_state_dict(ours.state_dict())
        assert list(again) == list(full)[steps * batch :]


def test_sampler_on_another_world_size_uses_each_remaining_sample_once():
    n, batch, steps = 40, 3, 4
    old = resume.ResumableDistributedSampler(range(n), num_replicas=2, rank=0, seed=3)
    old.advance(steps, batch)
    used = {i for r in range(2) for i in list(DistributedSampler(range(n), 2, r, seed=3))[:12]}
    rest = []
    for rank in range(3):
        s = resume.ResumableDistributedSampler(range(n), num_replicas=3, rank=rank, seed=3)
        s.load_state_dict(old.state_dict())
        rest += list(s)
    assert set(rest) >= set(range(n)) - used  # every sample not used yet comes
    assert len(rest) - (n - len(used)) < 3  # plus at most world - 1 of padding


def test_rng_state_round_trip():
    state = resume.rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(2), random.random()
    resume.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_params_sha256_sees_one_bit():
    model = train.SmallCNN()
    before = resume.params_sha256(model)
    with torch.no_grad():
        p = model.fc.bias
        p.view(torch.int32)[0] ^= 1  # the lowest bit of one float
    assert resume.params_sha256(model) != before


_KILLED_WRITER = """
import os, signal, sys, torch
from ddp_lab.tools import resume
folder = sys.argv[1]
resume.save_atomic({"step": 1, "w": torch.ones(1000)}, resume.step_path(folder, 1))
real = torch.save
def dying_save(obj, f, *args, **kwargs):
    f.write(b"PK\\x03\\x04 half a zip file")  # the first bytes are out, then the end
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = dying_save
resume.save_atomic({"step": 2, "w": torch.zeros(1000)}, resume.step_path(folder, 2))
"""


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    out = subprocess.run(
        [PY, "-c", _KILLED_WRITER, str(tmp_path)], env=_env(), capture_output=True, timeout=120
    )
    assert out.returncode == -9, out.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0].startswith(".step-00000002.pt.tmp-"), names  # the half-written file
    assert names[1:] == ["step-00000001.pt"]
    latest = resume.latest_checkpoint(tmp_path)
    assert latest == tmp_path / "step-00000001.pt"
    state = resume.load(latest)
    assert state["step"] == 1 and torch.equal(state["w"], torch.ones(1000))
    resume.prune(tmp_path)  # the dead writer's temporary file goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001.pt"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--checkpoint-every", "3"], "--checkpoint-dir"),
        (["--fail-at-step", "3"], "--checkpoint-dir"),
        (["--checkpoint-every", "-1", "--checkpoint-dir", "x"], "--checkpoint-every"),
        (["--timeout", "-1"], "--timeout"),
        (["--step-sleep", "nan"], "--step-sleep"),
        (["--preempt-signal", "USR1", "--checkpoint-dir", "x"], "--checkpoint-every"),
        (["--preempt-signal", "KILL", "--checkpoint-dir", "x", "--checkpoint-every", "2"], "USR1"),
    ],
)
def test_bad_resume_arguments(argv, words, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert words in capsys.readouterr().err


def _torchrun(tmp_path: Path, *extra: str, nprocs: int = 2) -> subprocess.CompletedProcess:
    cmd = [
        TORCHRUN,
        "--standalone",
        f"--nproc-per-node={nprocs}",
        "--max-restarts=1",
        "-m",
        "ddp_lab.tools.train",
        *("--epochs", "2", "--batch-size", "64", "--threads", "1", "--augment"),
        *("--warmup-steps", "5", "--data-dir", str(tmp_path / "data"), *extra),
        # auto puts the ranks on GPUs where each can have its own: bit for bit there needs
        # deterministic cuDNN and cuBLAS (on CPU it changes nothing: test_resume_device.py).
        "--deterministic",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)


def _digest(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    found = re.findall(r"sha256 ([0-9a-f]{64})", out.stdout)
    assert len(found) == 1, out.stdout  # rank 0 prints it once
    return found[0]


def test_a_run_killed_mid_epoch_ends_with_the_uninterrupted_digest(tmp_path):
    straight = _torchrun(tmp_path, "--quiet")
    ckpt = tmp_path / "ckpt"
    killed = _torchrun(tmp_path, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4",
                       "--fail-at-step", "10")  # fmt: skip
    # The last rank died by SIGKILL after step 10; torchrun restarted both from step 8.
    assert "exitcode: -9" in killed.stderr, killed.stderr[-3000:]
    assert "resumed from" in killed.stdout and "step 8," in killed.stdout, killed.stdout
    assert (ckpt / "failed-at-step-10").exists()
    assert _digest(killed) == _digest(straight)
    # Steps 4 and 8 before the kill, then 12..24 after it; the two newest are kept.
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000020.pt", "step-00000024.pt"]


def test_a_run_killed_on_three_ranks_ends_with_the_uninterrupted_digest(tmp_path):
    # On 3 ranks a ring all-reduce sums (a + b) + c or a + (b + c) depending on where an
    # element sits in its bucket; DDP rebuilds its buckets after the first step, a resumed
    # process starts with the first layout again (train.fixed_buckets). With DDP's default
    # buckets the digests differed (4a3e00ef... straight, 2b8240aa... killed and resumed).
    straight = _torchrun(tmp_path, "--quiet", nprocs=3)
    killed = _torchrun(tmp_path, "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--checkpoint-every", "2", "--fail-at-step", "4", nprocs=3)  # fmt: skip
    assert "resumed from" in killed.stdout, killed.stdout
    assert _digest(killed) == _digest(straight)
    assert "find_unused_parameters" not in straight.stderr + killed.stderr


def test_a_step_checkpoint_resumed_on_another_world_size_trains_at_the_new_worlds_lr(tmp_path):
    # 2 ranks (global batch 64, linear scaling: base LR 0.1) write step checkpoints; 1 rank
    # (global batch 32: 0.05) resumes from them and writes its own. A restored LambdaLR and
    # optimizer would keep 0.1; the schedule must be rescaled and keep its warmup position.
    ckpt = tmp_path / "ckpt"
    common = ["--threads", "1", "--quiet", "--data-dir", str(tmp_path / "data"),
              "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5", "--warmup-steps", "40"]  # fmt: skip
    train.launch([*common, "--epochs", "1"], nprocs=2, quiet=True, timeout=300)
    before = resume.load(resume.latest_checkpoint(ckpt))
    assert before["world_size"] == 2 and before["scheduler"]["base_lrs"] == [0.1]
    train.launch([*common, "--epochs", "2"], nprocs=1, quiet=True, timeout=300)
    after = resume.load(resume.latest_checkpoint(ckpt))
    assert after["world_size"] == 1 and after["step"] > before["step"]
    assert after["scheduler"]["base_lrs"] == [0.05]
    step = after["scheduler"]["last_epoch"]
    assert step == after["step"]
    assert after["optimizer"]["param_groups"][0]["lr"] == 0.05 * min(1.0, (step + 1) / 40)


def test_sigterm_to_torchrun_checkpoints_and_stops_every_rank(tmp_path):
    # What Slurm does at preemption (and scancel, and the time limit): SIGTERM to the job's
    # processes; torchrun's agent forwards it to its workers (its default --signals-to-handle).
    ckpt = tmp_path / "ckpt"
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node=2", "-m", "ddp_lab.train",
           "--epochs", "3", "--threads", "1", "--step-sleep", "0.05", "--data-dir",
           str(tmp_path / "data"), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3",
           "--preempt-signal", "USR1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list(ckpt.glob("step-*.pt")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    stopped = re.findall(r"SIGTERM arrived: stopped after step (\d+)", out)
    assert len(stopped) == 1, out + err[-3000:]
    assert (ckpt / "preempted").read_text().strip() == stopped[0]
    assert resume.load(resume.latest_checkpoint(ckpt))["step"] == int(stopped[0])
