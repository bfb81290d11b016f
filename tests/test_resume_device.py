"""Resume on a GPU (issue 40, items 6 and 7): the RNG state comes back as a CPU ByteTensor
whatever ``map_location`` did to it; ``train --deterministic`` asks for deterministic kernels.
On CPU the device a state is restored from is checked with a stand-in tensor; ``-m gpu``
loads a real checkpoint onto the GPU and compares a straight and a resumed run on nccl."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import private_tmp

from ddp_lab.tools import resume, train

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


class _OnAnotherDevice:
    """A generator state as ``torch.load(map_location=...)`` left it on another device: only
    ``.to(device="cpu", dtype=torch.uint8)`` gives the real state back."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state, self.moves = state, []

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.moves.append((args, kwargs))
        if kwargs.get("device") != "cpu" or kwargs.get("dtype") is not torch.uint8:
            return self  # type: ignore[return-value]  # still "on the GPU"
        return self.state


def test_rng_state_is_restored_from_a_cpu_byte_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    state = resume.rng_state()
    want = torch.rand(3)
    moved = _OnAnotherDevice(state["torch"])
    seen: list[torch.Tensor] = []
    real = torch.set_rng_state

    def checked(new_state: torch.Tensor) -> None:
        assert type(new_state) is torch.Tensor, new_state  # torch: "must be a ByteTensor"
        assert new_state.device.type == "cpu" and new_state.dtype == torch.uint8
        seen.append(new_state)
        real(new_state)

    monkeypatch.setattr(torch, "set_rng_state", checked)
    torch.rand(7), np.random.rand(2), random.random()
    resume.set_rng_state({**state, "torch": moved})
    assert seen and moved.moves
    assert torch.equal(torch.rand(3), want)


def test_cuda_states_of_gpus_this_process_lacks_are_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkpoint written where 2 GPUs were visible, resumed where 1 is."""
    restored: list[list[torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = resume.rng_state()
    gpu0, gpu1 = torch.full((8,), 1, dtype=torch.uint8), torch.full((8,), 2, dtype=torch.uint8)
    resume.set_rng_state({**state, "cuda": [gpu0, gpu1]})
    assert len(restored) == 1 and [t.tolist() for t in restored[0]] == [gpu0.tolist()]


def test_deterministic_sets_every_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    try:
        train.make_deterministic()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]


def test_deterministic_is_an_option() -> None:
    assert train.parse_args(["--deterministic"]).deterministic
    assert not train.parse_args([]).deterministic


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR")
    }
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=private_tmp())
    return env


def _run(args: list[str], restarts: int = 0) -> str:
    out = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            f"--max-restarts={restarts}",
            "--nproc-per-node",
            "1",
            "-m",
            "ddp_lab.tools.train",
            "--epochs",
            "1",
            "--quiet",
            *args,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    found = re.findall(r"final parameters sha256 ([0-9a-f]{64})", out.stdout)
    assert out.returncode == 0 and found, out.stdout[-2000:] + out.stderr[-4000:]
    return found[0]


def test_deterministic_cpu_run_trains(tmp_path: Path) -> None:
    """On CPU the flags change nothing the course's model uses: the digest is the same."""
    assert _run(["--deterministic", "--backend", "gloo"]) == _run(["--backend", "gloo"])


@pytest.mark.gpu
def test_gpu_rng_state_loaded_onto_the_gpu_restores(tmp_path: Path) -> None:
    path = tmp_path / "ck.pt"
    torch.zeros(1, device="cuda")  # CUDA initialised: rng_state also holds the CUDA states
    resume.save_atomic({"rng": resume.rng_state()}, path)
    want = torch.rand(4), torch.rand(4, device="cuda")
    loaded = torch.load(path, map_location="cuda", weights_only=False)
    assert loaded["rng"]["torch"].device.type == "cuda"
    resume.set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(4), want[0])
    assert torch.equal(torch.rand(4, device="cuda"), want[1])


@pytest.mark.gpu
def test_gpu_nccl_resumed_run_equals_the_straight_one(tmp_path: Path) -> None:
    """Items 6 and 7: deterministic, a run killed at step 25 and restarted ends bit-exact."""
    common = ["--backend", "nccl", "--deterministic", "--checkpoint-every", "10"]
    straight = _run([*common, "--checkpoint-dir", str(tmp_path / "a")])
    again = _run([*common, "--checkpoint-dir", str(tmp_path / "b")])
    resumed = _run([*common, "--checkpoint-dir", str(tmp_path / "c"), "--fail-at-step", "25"],
                   restarts=1)  # fmt: skip
    assert straight == again == resumed
