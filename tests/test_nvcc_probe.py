"""The driver / toolkit / runtime distinction, compiled and run for real (chapter 01).

Needs a real ``nvcc`` (a CUDA toolkit, or NVIDIA's ``nvidia-cuda-nvcc`` pip wheels for CUDA
13+: the ``-cu12`` wheels hold only ptxas and libnvvm); skipped where there is none. Never
downloads anything. No GPU needed: nvcc compiles device code for one architecture without
one, and the program runs with or without a driver.
"""

from __future__ import annotations

import ctypes.util
import subprocess

import pytest

from ddp_lab.tools import cuda_compat as cc

NVCC = cc.find_nvcc()
pytestmark = pytest.mark.skipif(
    NVCC is None, reason="no nvcc here (CUDA_HOME, nvidia/cu13 wheels or PATH)"
)


def test_toolkit_compiles_and_runtime_answers_without_the_driver(tmp_path):
    release = cc.parse_nvcc(
        subprocess.run([str(NVCC), "--version"], capture_output=True, text=True, check=True).stdout
    )
    probe = cc.probe_runtime_driver(NVCC, tmp_path)
    # The runtime linked into the program is the toolkit's own: 13.0 -> 13000.
    assert probe.runtime == release[0] * 1000 + release[1] * 10
    if ctypes.util.find_library("cuda") is None:  # no libcuda: no driver to ask
        assert probe.driver == 0
        assert probe.device_error == "cudaErrorInsufficientDriver"
    else:  # a driver is installed: it reports the newest CUDA it supports
        assert probe.driver >= 1000


def test_device_code_for_one_architecture_needs_no_gpu(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(cc.PROBE_CU)
    cubin = tmp_path / "k.cubin"
    subprocess.run(
        [str(NVCC), "-cubin", "-arch=sm_90", str(src), "-o", str(cubin)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    elf = cubin.read_bytes()
    assert elf[:4] == b"\x7fELF"
    assert int.from_bytes(elf[18:20], "little") == 190  # e_machine EM_CUDA: GPU machine code
