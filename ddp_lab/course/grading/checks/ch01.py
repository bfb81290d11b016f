"""Checker of chapter 01's exercise: can this driver / toolkit / torch build run, and what to change.

The learner writes ``diagnose(nvidia_smi, nvcc_v, torch_build) -> (level, change)`` from the
texts the tools print. Hidden cases are rendered in the real layouts of several
``nvidia-smi`` releases; the expected answer comes from NVIDIA's minimum-driver table
(``ddp_lab.tools.cuda_compat``) and, for nvcc, from the rule of torch's cpp_extension.

The probe (``probes.probe_diagnose``) runs the learner's function on one case's three texts,
in a rank of its own that receives that case only (``learner.ranks``; this module, which
computes the answer, is hidden there), and returns what came out as data; the expected answer
is computed and compared in the checker.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.probes import one, probe_diagnose
from ddp_lab.i18n import N_, _t, lookup
from ddp_lab.tools import cuda_compat as cc

MESSAGES = {
    "case_new_driver": N_("new driver"),
    "case_minor_version": N_("minor version"),
    "case_old_driver": N_("old driver"),
    "case_below_minor_compat": N_("below minor version compatibility"),
    "case_nvcc_major": N_("nvcc major"),
    "case_no_driver": N_("no driver"),
    "case_cpu_build_gpu": N_("cpu build, GPU"),
    "case_cpu_build_no_gpu": N_("cpu build, no GPU"),
    "case_cuda_13": N_("CUDA 13"),
}

# The header line of three generations of nvidia-smi (2019, 2023, 2025 layouts).
_SMI_OLD = """+-----------------------------------------------------------------------------+
| NVIDIA-SMI {d:<14} Driver Version: {d:<12} CUDA Version: {c:<8} |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
|===============================+======================+======================|
|   0  Tesla V100-SXM2...  On   | 00000000:00:1E.0 Off |                    0 |
+-------------------------------+----------------------+----------------------+"""
_SMI_WIDE = """+---------------------------------------------------------------------------------------+
| NVIDIA-SMI {d:<22} Driver Version: {d:<12} CUDA Version: {c:<8} |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
|=========================================+======================+======================|
|   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |                    0 |
+-----------------------------------------+----------------------+----------------------+"""
_SMI_NEW = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {d:<22} Driver Version: {d:<14} CUDA Version: {c:<8} |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+"""
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
# What nvidia-smi (or the shell) prints where there is no working driver: the no-driver case
# draws one, so that a solution looking for one sentence only does not pass.
NO_DRIVER_TEXTS = (
    NO_DRIVER,
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.54",
    "bash: nvidia-smi: command not found",
)
NO_NVCC = "bash: nvcc: command not found"
NVCC = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Cuda compilation tools, release {v}, V{v}.{patch}
Build cuda_{v}.r{v}/compiler.33961263_0"""
TORCH_CUDAS = [(11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (13, 0)]


def render_smi(driver: str, rng: random.Random) -> str:
    """nvidia-smi's table for ``driver`` in a layout of its era."""
    cuda = cc.fmt(cc.max_cuda_for_driver(driver))
    layout = _SMI_OLD if cc.parse_version(driver) < (530,) else rng.choice([_SMI_WIDE, _SMI_NEW])
    return layout.format(d=driver, c=cuda)


def render_nvcc(cuda: tuple[int, int] | None, rng: random.Random) -> str:
    if cuda is None:
        return NO_NVCC
    return NVCC.format(v=cc.fmt(cuda), patch=rng.randint(20, 120))


def expected(nvidia_smi: str, nvcc_v: str, torch_build: str) -> tuple[str, str]:
    """The reference answer: (level, component to change)."""
    torch_cuda = cc.parse_torch_cuda(torch_build)
    smi = cc.parse_nvidia_smi(nvidia_smi)
    has_driver = smi is not None and not smi.error
    if torch_cuda is None:  # a CPU build runs anywhere; on a GPU machine it wastes the GPU
        return ("warning", "torch") if has_driver else ("ok", "nothing")
    if not has_driver:
        return "problem", "driver"
    v = cc.check_driver_runtime(smi.driver, torch_cuda)
    if v.level != cc.OK:
        return v.level, v.change
    n = cc.check_nvcc_torch(cc.parse_nvcc(nvcc_v), torch_cuda)
    return n.level, n.change


def _drivers_for(rule: Callable[[tuple[int, int]], bool]) -> list[str]:
    return [d for d in cc.MIN_DRIVER_LINUX.values() if rule(cc.max_cuda_for_driver(d))]


def make_cases(rng: random.Random) -> list[tuple[str, str, str, str]]:
    """One case per kind of situation, with random versions: (label, smi, nvcc, torch)."""
    cases = []

    def torch_str(cuda: tuple[int, int]) -> str:
        return f"2.{rng.randint(1, 9)}.{rng.randint(0, 1)}+cu{cuda[0]}{cuda[1]}"

    # 1. driver new enough, nvcc newer than torch (same major): fine
    t = rng.choice([c for c in TORCH_CUDAS if c[0] == 12 and c < (12, 8)])
    d = rng.choice(_drivers_for(lambda top, t=t: top >= (12, 8)))
    cases.append(("new_driver", render_smi(d, rng), render_nvcc((12, 8), rng), torch_str(t)))
    # 2. same major, driver older than the runtime: minor version compatibility
    d = rng.choice(["525.60.13", "530.30.02"])
    t = rng.choice([(12, 4), (12, 6), (12, 8)])
    cases.append(("minor_version", render_smi(d, rng), render_nvcc(None, rng), torch_str(t)))
    # 3. driver of an older major: too old. Its nvcc (11.8) has another major than torch's
    # CUDA too, so an answer that compares nvcc before the driver says "toolkit" here.
    d = rng.choice(_drivers_for(lambda top: (11, 0) <= top < (12, 0)))
    t = rng.choice([(12, 1), (12, 4)])
    cases.append(("old_driver", render_smi(d, rng), render_nvcc((11, 8), rng), torch_str(t)))
    # 3b. same major but below the family's minimum for minor version compatibility (CUDA
    # 11.0's own driver and a cu118 build): a problem, not the warning of case 2
    d = rng.choice([v for v in cc.MIN_DRIVER_LINUX.values() if v.startswith("450.")])
    cases.append(
        (
            "below_minor_compat",
            render_smi(d, rng),
            render_nvcc(rng.choice([None, (11, 8)]), rng),
            torch_str((11, 8)),
        )
    )
    # 4. runtime fits the driver but nvcc has another major: extensions will not build
    d = rng.choice(_drivers_for(lambda top: top >= (12, 4)))
    cases.append(
        (
            "nvcc_major",
            render_smi(d, rng),
            render_nvcc((11, 8), rng),
            torch_str(rng.choice([(12, 1), (12, 4)])),
        )
    )
    # 5. no driver at all, CUDA build
    no_driver = rng.choice(NO_DRIVER_TEXTS)
    cases.append(("no_driver", no_driver, render_nvcc((12, 1), rng), torch_str((12, 1))))
    # 6. CPU build: on a GPU machine, and without a driver
    d = rng.choice(_drivers_for(lambda top: top >= (12, 0)))
    cases.append(("cpu_build_gpu", render_smi(d, rng), NO_NVCC, f"2.{rng.randint(1, 9)}.0+cpu"))
    cases.append(("cpu_build_no_gpu", NO_DRIVER, NO_NVCC, f"2.{rng.randint(1, 9)}.0+cpu"))
    # 7. exact match, driver CUDA == torch CUDA (13.0)
    cases.append(
        ("cuda_13", render_smi("580.65.06", rng), render_nvcc((13, 0), rng), torch_str((13, 0)))
    )
    rng.shuffle(cases)
    return cases


def _kind(got: object) -> str:
    if isinstance(got, dict) and type(got.get("kind")) is str:
        return got["kind"][:40]
    return type(got).__name__


@checker("01.diagnose", points=3)
def check_diagnose(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = make_cases(rng)
    yield len(cases)
    for label, smi, nvcc, torch_build in cases:
        case = running(lookup(MESSAGES, f"case_{label}"))
        want = expected(smi, nvcc, torch_build)
        got = one(learner.ranks(probe_diagnose, [[smi, nvcc, torch_build]], timeout=30))
        if type(got) is not tuple or not all(type(x) is str for x in got):
            raise fail(
                _t(
                    "torch {torch_build}: return a tuple of two str (level, change), not {kind}",
                    torch_build=torch_build,
                    kind=_kind(got),
                ),
                case,
            )
        if got != want:
            shown = repr(got) if len(repr(got)) <= 80 else repr(got)[:77] + "..."
            raise fail(
                _t(
                    "torch {torch_build}: expected {expected}, got {got}",
                    torch_build=torch_build,
                    expected=want,
                    got=shown,
                ),
                case,
            )
        yield case
