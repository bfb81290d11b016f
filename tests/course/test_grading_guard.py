"""``course.grading.guard`` on a CUDA build of torch.

A refusal refuses ``ctypes``, and a CUDA build of torch counts GPUs with ``ctypes`` (NVML, in
``torch/cuda/__init__.py``: ``device_count`` -> ``_raw_device_count_nvml``) on every call until
CUDA is initialised. CI's torch is a CPU build, whose ``device_count()`` returns 0 before that
road. These tests make torch a CUDA build on a machine without a GPU, what ``pip install
torch`` gives a grading server: ``torch.cuda._is_compiled()`` looks for
``torch._C._cuda_getDeviceCount``, and NVML's library is absent here, so torch falls back to it.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DistributedSampler

from ddp_lab.course.grading import guard
from ddp_lab.course.grading.learner import Refused, refuse


@pytest.fixture
def cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_initialized():  # a GPU machine, after a test that used CUDA
        pytest.skip("CUDA is initialised in this process: torch counts GPUs without NVML")
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "_cached_device_count", None)
    assert torch.cuda._is_compiled()


@pytest.mark.usefixtures("cuda_build")
def test_torch_counts_gpus_under_a_refusal_while_ctypes_stays_refused() -> None:
    with refuse({"DistributedSampler": DistributedSampler}, "x"):
        assert torch.cuda.device_count() == 0
        with torch.random.fork_rng():  # counts the GPUs too
            torch.rand(1)
        with pytest.raises(Refused, match="ctypes"):
            ctypes.CDLL(None)
    # Counted again after the refusal, as torch does before CUDA is initialised.
    assert torch.cuda._cached_device_count is None


@pytest.mark.usefixtures("cuda_build")
def test_without_the_count_taken_first_the_refusal_refuses_torch_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the first test guards against (and why it can fail): torch's own NVML call."""
    monkeypatch.setattr(guard, "_settle_gpu_count", lambda: False)
    with refuse({"DistributedSampler": DistributedSampler}, "x"):
        with pytest.raises(Refused, match="ctypes.dlopen"):
            torch.cuda.device_count()


def test_a_graded_ranks_lifelong_refusal_lets_torch_count_gpus() -> None:
    """``refuse_for_life`` (a graded rank, ``rankserve``) in a process of its own."""
    code = textwrap.dedent(
        """
        import ctypes, torch
        from torch.utils.data import DistributedSampler
        torch._C._cuda_getDeviceCount = lambda: 0
        from ddp_lab.course.grading.learner import Refused, refuse_for_life
        refuse_for_life({"DistributedSampler": DistributedSampler}, "x")
        with torch.random.fork_rng():
            print("count", torch.cuda.device_count(), torch.cuda._cached_device_count)
        try:
            ctypes.CDLL(None)
        except Refused:
            print("ctypes refused")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["count 0 0", "ctypes refused"]
