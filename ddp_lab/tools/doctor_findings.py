"""The doctor's findings: ``analyse`` judges the gathered facts, one line per finding.

A pure function of ``doctor_facts.Facts``: every ``Finding`` has a level (ok / warning /
problem) and, when it is not ok, the fix in both languages. The driver and CUDA versions
(``cuda_compat``), NCCL, the toolkit torch's extensions would build with, the system
(``/dev/shm``, open files, interfaces, distributed environment variables) and the torch APIs
the course needs. ``tools/doctor.py`` re-exports these names.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from ddp_lab.i18n import get_language, pair
from ddp_lab.tools import cuda_compat as cc
from ddp_lab.tools import interfaces as ifs
from ddp_lab.tools.doctor_facts import (
    MIN_TORCH,
    TORCH_FEATURES,
    Facts,
    find_cuda_home,
)

OK, WARNING, PROBLEM = cc.OK, cc.WARNING, cc.PROBLEM
MIB = 1 << 20
DIST_ENV = re.compile(
    r"^(NCCL_|TORCH_NCCL_|TORCH_DISTRIBUTED_|GLOO_|MASTER_ADDR$|MASTER_PORT$|"
    r"RANK$|LOCAL_RANK$|WORLD_SIZE$|LOCAL_WORLD_SIZE$|CUDA_VISIBLE_DEVICES$)"
)


@dataclass
class Finding:
    """One line of the report."""

    key: str
    level: str
    value: str
    en: str = ""  # what the fix is (empty when ok)
    zh: str = ""

    @property
    def fix(self) -> str:
        return self.zh if get_language() == "zh" else self.en


def _f(key: str, level: str, value: str, en: str = "", zh: str = "") -> Finding:
    return Finding(key, level, value, en, zh)


def _driver_findings(f: Facts) -> list[Finding]:
    torch_cuda = cc.parse_torch_cuda(f.torch_cuda)
    if f.nvidia_smi is None:
        if torch_cuda is None:
            return [_f("driver", OK, "no nvidia-smi: CPU-only machine and CPU build of torch")]
        return [
            _f(
                "driver",
                WARNING,
                "no nvidia-smi: no NVIDIA driver found",
                *pair(
                    "torch is a CUDA build but there is no driver: it runs on CPU only. "
                    "Install the NVIDIA driver, or use the CPU build."
                ),
            )
        ]
    smi = cc.parse_nvidia_smi(f.nvidia_smi)
    if smi is None or smi.error:
        why = smi.error if smi else "empty output"
        if "version mismatch" in why:
            return [
                _f(
                    "driver",
                    PROBLEM,
                    why,
                    *pair(
                        "The kernel module and the user-space driver differ (an upgrade without "
                        "a reboot): reboot, or reload the nvidia kernel modules."
                    ),
                )
            ]
        return [
            _f(
                "driver",
                PROBLEM,
                why,
                *pair(
                    "nvidia-smi cannot reach the driver: install or load the NVIDIA driver "
                    "(in a container: run it with --gpus all)."
                ),
            )
        ]
    out = [
        _f(
            "driver",
            OK,
            f"{cc.fmt_driver(smi.driver)} (CUDA <= {cc.fmt(smi.cuda)}), "
            f"{len(smi.gpus)} GPU(s): {', '.join(smi.gpus) or '-'}",
        )
    ]
    if torch_cuda is None:
        out.append(
            _f(
                "driver_vs_torch",
                WARNING,
                "CPU build of torch on a GPU machine",
                *pair(
                    "Install a CUDA build of torch whose CUDA <= the driver's {cuda} "
                    "(pytorch.org, 'Get started').",
                    cuda=cc.fmt(smi.cuda),
                ),
            )
        )
    else:
        v = cc.check_driver_runtime(smi.driver, torch_cuda)
        out.append(
            _f(
                "driver_vs_torch",
                v.level,
                f"torch CUDA {cc.fmt(torch_cuda)}: {v.en}",
                "" if v.level == OK else v.en,
                "" if v.level == OK else v.zh,
            )
        )
        cvd = f.env.get("CUDA_VISIBLE_DEVICES")
        if f.device_count == 0 and smi.gpus:
            why = f"CUDA_VISIBLE_DEVICES={cvd!r} hides them" if cvd is not None else "see above"
            out.append(
                _f(
                    "devices",
                    PROBLEM,
                    f"torch sees 0 of {len(smi.gpus)} GPU(s): {why}",
                    *pair("Unset CUDA_VISIBLE_DEVICES or list valid indices (e.g. 0,1)."),
                )
            )
        else:
            out.append(
                _f(
                    "devices",
                    OK,
                    f"torch sees {f.device_count} GPU(s); "
                    f"CUDA_VISIBLE_DEVICES={cvd if cvd is not None else '(unset)'}",
                )
            )
    return out


def _toolkit_findings(f: Facts) -> list[Finding]:
    torch_cuda = cc.parse_torch_cuda(f.torch_cuda)
    versions = {home: cc.parse_nvcc(text) for home, text in f.toolkits.items()}
    listing = ", ".join(f"{h} ({cc.fmt(v)})" for h, v in versions.items()) or "none"
    out = [
        _f(
            "toolkits",
            WARNING if len(set(versions.values())) > 1 else OK,
            f"CUDA toolkits found: {listing}",
            *(
                pair(
                    "Several toolkits: set CUDA_HOME and PATH to the one matching torch's "
                    "CUDA {torch_cuda} before building extensions.",
                    torch_cuda=cc.fmt(torch_cuda),
                )
                if len(set(versions.values())) > 1
                else ()
            ),
        )
    ]
    if f.nvcc_path is None:
        out.append(
            _f(
                "nvcc",
                OK,
                "nvcc not on PATH: not needed to run torch (the wheel bundles "
                "its CUDA runtime); needed only to build CUDA extensions or NCCL",
            )
        )
    else:
        nvcc = cc.parse_nvcc(f.nvcc_text)
        v = cc.check_nvcc_torch(nvcc, torch_cuda)
        out.append(
            _f(
                "nvcc",
                v.level,
                f"{f.nvcc_path}: {cc.fmt(nvcc)}; {v.en}",
                "" if v.level == OK else v.en,
                "" if v.level == OK else v.zh,
            )
        )
    home = find_cuda_home(f.env, f.nvcc_path, f.usr_local_cuda)
    source = (
        "CUDA_HOME"
        if f.env.get("CUDA_HOME")
        else "CUDA_PATH"
        if f.env.get("CUDA_PATH")
        else "nvcc on PATH"
        if f.nvcc_path
        else "default /usr/local/cuda"
    )
    if home is None:
        out.append(
            _f(
                "cuda_home",
                OK,
                "no CUDA_HOME, nvcc or /usr/local/cuda: torch cannot "
                "build CUDA extensions here (running torch is not affected)",
            )
        )
    elif os.path.realpath(home) not in f.toolkits:
        out.append(
            _f(
                "cuda_home",
                WARNING,
                f"{home} (from {source}) is not a toolkit (no bin/nvcc + include/cuda_runtime.h)",
                *(
                    pair(
                        "torch would build extensions with {home}/bin/nvcc and {home}/include: "
                        "set CUDA_HOME to the toolkit folder that holds both (found: {found}).",
                        home=home,
                        found=", ".join(f.toolkits),
                    )
                    if f.toolkits
                    else pair(
                        "torch would build extensions with {home}/bin/nvcc and {home}/include: "
                        "set CUDA_HOME to the toolkit folder that holds both.",
                        home=home,
                        found=", ".join(f.toolkits),
                    )
                ),
            )
        )
    elif os.path.realpath(home) in f.toolkit_includes and not f.env.get("CUDA_INC_PATH"):
        # torch.utils.cpp_extension.include_paths adds CUDA_HOME/include and CUDA_INC_PATH,
        # never targets/<arch>/include: the C++ compiler would not find cuda_runtime.h.
        inc = f.toolkit_includes[os.path.realpath(home)]
        out.append(
            _f(
                "cuda_home",
                WARNING,
                f"{home} (from {source}) keeps its headers in {inc}, not in include/ "
                "(conda's CUDA 12+ layout): building extensions cannot find cuda_runtime.h",
                *pair(
                    "export CUDA_INC_PATH={inc} (torch.utils.cpp_extension.include_paths adds it).",
                    inc=inc,
                ),
            )
        )
    else:
        out.append(_f("cuda_home", OK, f"{home} (from {source})"))
    return out


def _nccl_findings(f: Facts) -> list[Finding]:
    b = f.backends
    names = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in b.items())
    gpus = f.device_count > 0
    out = [
        _f(
            "backends",
            PROBLEM if not b.get("gloo") else WARNING if gpus and not b.get("nccl") else OK,
            names,
            *(
                pair("Install a CUDA build of torch from pytorch.org: it ships NCCL.")
                if gpus and not b.get("nccl")
                else ()
            ),
        )
    ]
    if f.nccl:
        loaded = ", ".join(f.loaded_nccl) or "not loaded yet"
        out.append(_f("nccl", OK, f"NCCL {f.nccl} (torch.cuda.nccl.version()); libnccl: {loaded}"))
        own = [
            d
            for d in f.env.get("LD_LIBRARY_PATH", "").split(":")
            if d and glob.glob(os.path.join(d, "libnccl.so*"))
        ]
        if own and f.loaded_nccl and not any(p.startswith(tuple(own)) for p in f.loaded_nccl):
            out[-1] = _f(
                "nccl",
                WARNING,
                f"LD_LIBRARY_PATH has {own[0]}/libnccl but the process loaded {f.loaded_nccl[0]}",
                *pair(
                    "Your own NCCL is not the one in use: LD_PRELOAD it (torch loads its "
                    "wheel's copy by full path; torch.cuda.nccl.version() only shows the "
                    "nccl.h torch was compiled with)."
                ),
            )
    return out


def _system_findings(f: Facts) -> list[Finding]:
    out = []
    if f.shm_bytes is not None:
        size = f"/dev/shm {f.shm_bytes / MIB:.0f} MiB"
        level = PROBLEM if f.shm_bytes < 256 * MIB else WARNING if f.shm_bytes < 2048 * MIB else OK
        out.append(
            _f(
                "shm",
                level,
                size,
                *(
                    pair(
                        "DataLoader workers and NCCL pass data through /dev/shm: in Docker use "
                        "--shm-size=8g (or --ipc=host)."
                    )
                    if level != OK
                    else ()
                ),
            )
        )
    if f.nofile is not None:
        soft, hard = f.nofile
        out.append(
            _f(
                "nofile",
                WARNING if soft < 4096 else OK,
                f"open files: soft {soft}, hard {hard}",
                *(
                    pair("Raise it: ulimit -n {limit}", limit=min(hard, 65536))
                    if soft < 4096
                    else ()
                ),
            )
        )
    out.append(
        _f(
            "loopback",
            PROBLEM if f.loopback else OK,
            f.loopback or "gloo all-reduce between 2 ranks over 127.0.0.1 and a free port",
            *(
                pair(
                    "Check that the host name resolves (/etc/hosts) or set "
                    "GLOO_SOCKET_IFNAME=lo for single-machine runs."
                )
                if f.loopback
                else ()
            ),
        )
    )
    out += [_f(*finding) for finding in ifs.findings(f)]
    dist_vars = {k: v for k, v in sorted(f.env.items()) if DIST_ENV.match(k)}
    out.append(
        _f(
            "env",
            OK,
            ", ".join(f"{k}={v}" for k, v in dist_vars.items())
            or "no NCCL_*, GLOO_*, TORCH_DISTRIBUTED_* or rank variables set",
        )
    )
    for k in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE"):
        if dist_vars.get(k) == "1":
            out.append(
                _f(
                    k,
                    WARNING,
                    f"{k}=1",
                    *pair(
                        "Slower transfers; unset it unless it works around a known hardware "
                        "problem."
                    ),
                )
            )
    left = [k for k in ("RANK", "WORLD_SIZE", "MASTER_PORT") if k in dist_vars]
    if left:
        out.append(
            _f(
                "leftover",
                WARNING,
                f"{', '.join(left)} set in this shell",
                *pair(
                    "Launchers set these per process; a leftover value makes "
                    "init_process_group wait for ranks that never come. Unset them."
                ),
            )
        )
    return out


def _torch_feature_findings(f: Facts) -> list[Finding]:
    """What of the course this torch cannot run (``TORCH_FEATURES``), and the fix."""
    if not f.torch_features:
        return []
    missing = [name for name, has in f.torch_features.items() if not has]
    if not missing:
        return [_f("torch_features", OK, f"all the APIs the course uses (torch >= {MIN_TORCH})")]
    needs = "; ".join(f"{name}: ch {TORCH_FEATURES.get(name, '?')}" for name in missing)
    return [
        _f(
            "torch_features",
            WARNING,
            f"torch {f.torch_version} lacks {', '.join(missing)}",
            *pair(
                "The course needs torch >= {min}; this torch lacks what these chapters use "
                "({needs}). Those cells fail; the rest runs. Install torch=={min}.0 "
                "(setup.sh does), or keep your cluster's torch and skip those cells.",
                min=MIN_TORCH,
                needs=needs,
            ),
        )
    ]


def analyse(f: Facts) -> list[Finding]:
    """Judge the facts: every finding has a level and, when not ok, a fix."""
    torch_line = _f(
        "torch",
        OK,
        f"torch {f.torch_version}, CUDA {f.torch_cuda or '- (CPU build)'}, cuDNN {f.cudnn or '-'}",
    )
    return [
        torch_line,
        *_torch_feature_findings(f),
        *_driver_findings(f),
        *_nccl_findings(f),
        *_toolkit_findings(f),
        *_system_findings(f),
    ]
