"""``ddp-lab doctor`` / ``doctor()``: one report on the GPU stack and what distributed runs need.

Facts are gathered first (``gather``: commands, torch, the OS) and judged afterwards
(``analyse``, a pure function), so tests feed it fake ``nvidia-smi`` / ``nvcc`` outputs for
GPU situations a CPU machine cannot produce. Every line has a verdict (ok / warning /
problem) and, when it is not ok, the fix. Nothing here needs a GPU, nvcc or nvidia-smi.

Teaching version: PyTorch's own ``python -m torch.utils.collect_env`` lists versions but
judges nothing; this report adds the verdicts and the distributed-specific checks.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import types
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp_lab.i18n import _t, get_language, pair
from ddp_lab.tools import cuda_compat as cc
from ddp_lab.tools import interfaces as ifs
from ddp_lab.tools.interfaces import gloo_interface, missing_interfaces, nccl_interface  # noqa: F401

OK, WARNING, PROBLEM = cc.OK, cc.WARNING, cc.PROBLEM
MIB = 1 << 20
DIST_ENV = re.compile(
    r"^(NCCL_|TORCH_NCCL_|TORCH_DISTRIBUTED_|GLOO_|MASTER_ADDR$|MASTER_PORT$|"
    r"RANK$|LOCAL_RANK$|WORLD_SIZE$|LOCAL_WORLD_SIZE$|CUDA_VISIBLE_DEVICES$)"
)


@dataclass
class Facts:
    """Raw observations; every field can be faked in tests."""

    env: dict[str, str] = field(default_factory=dict)
    nvidia_smi: str | None = None  # its output; None when it is not on PATH
    nvcc_path: str | None = None  # ``which nvcc``
    toolkits: dict[str, str] = field(
        default_factory=dict
    )  # toolkit folder (bin/nvcc and a cuda_runtime.h) -> its ``nvcc -V``
    # toolkits whose cuda_runtime.h is not in include/ -> the folder that has it
    toolkit_includes: dict[str, str] = field(default_factory=dict)
    nvcc_text: str | None = None  # ``nvcc -V`` of the nvcc on PATH
    usr_local_cuda: bool = False  # whether /usr/local/cuda exists (torch's last guess)
    torch_version: str = ""
    torch_cuda: str | None = None  # torch.version.cuda
    cudnn: int | None = None
    nccl: str | None = None  # torch.cuda.nccl.version()
    backends: dict[str, bool] = field(default_factory=dict)
    device_count: int = 0
    loaded_nccl: list[str] = field(default_factory=list)  # libnccl files this process mapped
    shm_bytes: int | None = None
    nofile: tuple[int, int] | None = None
    loopback: str = ""  # "" when gloo all-reduced over loopback, else the error
    interfaces: list[str] = field(default_factory=list)
    hostname: str = ""  # gethostname(), what gloo resolves when GLOO_SOCKET_IFNAME is unset
    hostname_addrs: list[str] = field(default_factory=list)  # getaddrinfo order; [] = no
    iface_addrs: dict[str, list[str]] = field(default_factory=dict)  # ``ip -o addr``
    # TORCH_FEATURES' names -> whether this torch has it (empty: not checked)
    torch_features: dict[str, bool] = field(default_factory=dict)


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


def _run(cmd: list[str], timeout: float = 10) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{cmd[0]}: {exc}"


# Where a toolkit keeps cuda_runtime.h: include/ (the runfile, /usr/local/cuda-X.Y), or, in
# conda's CUDA 12+ packages, targets/<arch>/include with nothing under include/.
TARGET_INCLUDES = ("targets/x86_64-linux/include", "targets/sbsa-linux/include")


def toolkit_include(home: str) -> str | None:
    """The folder of ``home``'s ``cuda_runtime.h``, or None when it has none."""
    for sub in ("include", *TARGET_INCLUDES):
        if os.path.exists(os.path.join(home, sub, "cuda_runtime.h")):
            return os.path.join(home, sub)
    return None


def find_cuda_home(
    env: dict[str, str], nvcc_path: str | None, usr_local_cuda: bool | None = None
) -> str | None:
    """Where torch's cpp_extension looks for CUDA (mirrors its ``_find_cuda_home`` on Linux)."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is None and nvcc_path:
        home = os.path.dirname(os.path.dirname(nvcc_path))
    if usr_local_cuda is None:
        usr_local_cuda = os.path.exists("/usr/local/cuda")
    if home is None and usr_local_cuda:
        home = "/usr/local/cuda"
    return home


def _loopback_gloo(timeout_s: float = 5) -> str:
    """All-reduce between two gloo ranks in threads of this process, over a free port."""
    import threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    try:
        t = timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=t, wait_for_workers=False)
        got: dict[int, Any] = {}

        def rank(r: int) -> None:
            try:
                s = store if r == 0 else dist.TCPStore("127.0.0.1", store.port, 2, False, timeout=t)
                pg = dist.ProcessGroupGloo(dist.PrefixStore("doctor", s), r, 2, t)
                x = torch.ones(1)
                pg.allreduce([x]).wait()
                got[r] = x.item()
            except Exception as exc:  # noqa: BLE001  # reported, never raised
                got[r] = exc

        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout_s + 1)
        if got.get(0) == 2.0 and got.get(1) == 2.0:
            return ""
        return "; ".join(f"rank {r}: {got.get(r, 'no answer')}" for r in (0, 1))
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


# The course is written and tested on torch 2.13 (setup.sh's pin). Older torch runs most of
# it; these are the APIs it uses that torch 2.11 lacks (seen on a GPU machine with 2.11),
# each with the lessons that need it. Checked by looking, not by version number.
MIN_TORCH = "2.13"
TORCH_FEATURES: dict[str, str] = {
    "dist.all_gather_single": "04 (tensor forms, traced collectives), 10",
    "dist.reduce_scatter_single": "04, 10 (exercise 3: 10.fsdp_reduce)",
    "DDP(forward_sync_buffers=)": "07 (buffers after wrapping)",
    "gloo all_to_all": "04 (all_to_all)",
}


def torch_features() -> dict[str, bool]:
    """Which of ``TORCH_FEATURES`` this torch has (gloo's all_to_all: on a 1-rank group)."""
    import inspect
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    ddp = torch.nn.parallel.DistributedDataParallel.__init__
    found = {
        "dist.all_gather_single": hasattr(dist, "all_gather_single"),
        "dist.reduce_scatter_single": hasattr(dist, "reduce_scatter_single"),
        "DDP(forward_sync_buffers=)": "forward_sync_buffers" in inspect.signature(ddp).parameters,
        "gloo all_to_all": False,
    }
    try:  # ProcessGroupGloo::alltoall raised "does not support alltoall" before it had one
        pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=5))
        out = [torch.zeros(1)]
        pg.alltoall(out, [torch.ones(1)]).wait()
        found["gloo all_to_all"] = out[0].item() == 1.0
    except Exception:  # noqa: BLE001  # missing, or no gloo: reported as missing
        pass
    return found


def gather() -> Facts:
    """Observe this machine: commands, torch, the OS; never raises, never needs a GPU."""
    import resource
    import socket

    import torch
    import torch.distributed as dist

    f = Facts(env=dict(os.environ), torch_version=torch.__version__, torch_cuda=torch.version.cuda)
    smi = shutil.which("nvidia-smi")
    f.nvidia_smi = _run([smi]) if smi else None
    f.nvcc_path = shutil.which("nvcc")
    f.usr_local_cuda = os.path.exists("/usr/local/cuda")
    homes = {os.path.dirname(os.path.dirname(p)) for p in glob.glob("/usr/local/cuda*/bin/nvcc")}
    for var in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
        if f.env.get(var):
            homes.add(f.env[var])
    if f.nvcc_path:
        homes.add(os.path.dirname(os.path.dirname(f.nvcc_path)))
    for home in sorted(homes):
        # A toolkit has both the compiler and the headers; a lone wrapper script does not.
        nvcc = os.path.join(home, "bin", "nvcc")
        include = toolkit_include(home)
        if os.path.exists(nvcc) and include:
            f.toolkits[os.path.realpath(home)] = _run([nvcc, "-V"])
            if include != os.path.join(home, "include"):
                f.toolkit_includes[os.path.realpath(home)] = include
    if f.nvcc_path:
        f.nvcc_text = _run([f.nvcc_path, "-V"])
    f.cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    f.backends = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    if torch.cuda.is_available():
        f.device_count = torch.cuda.device_count()
    if f.backends["nccl"]:
        f.nccl = ".".join(map(str, torch.cuda.nccl.version()))
    try:
        with open("/proc/self/maps") as maps:
            f.loaded_nccl = sorted({ln.split()[-1] for ln in maps if "libnccl" in ln})
    except OSError:
        pass
    try:
        st = os.statvfs("/dev/shm")
        f.shm_bytes = st.f_frsize * st.f_blocks
    except OSError:
        f.shm_bytes = None
    f.nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    f.interfaces = [name for _, name in socket.if_nameindex()]
    f.loopback = _loopback_gloo()
    f.torch_features = torch_features()
    gather_network(f)
    return f


def gather_network(f: Facts) -> Facts:
    """Fill in what gloo's choice of interface depends on (hostname, addresses); fast."""
    import socket

    f.hostname = socket.gethostname()
    try:
        infos = socket.getaddrinfo(f.hostname, None, type=socket.SOCK_STREAM)
        f.hostname_addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))
    except OSError:
        f.hostname_addrs = []
    for line in _run(["ip", "-o", "addr", "show"]).splitlines():
        words = line.split()  # "2: eth0    inet 10.77.0.1/24 brd ..."
        if len(words) > 3 and words[2] in ("inet", "inet6"):
            f.iface_addrs.setdefault(words[1], []).append(words[3].split("/")[0])
    return f


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


def torch_check() -> str:
    """One line for chapter 00: does this torch have every API the course uses?"""
    (line,) = _torch_feature_findings(Facts(torch_version=_torch_version(),
                                            torch_features=torch_features()))  # fmt: skip
    return f"{line.value}" + (f"\n-> {line.fix}" if line.fix else "")


def has(feature: str) -> bool:
    """Whether this torch has ``feature`` (a ``TORCH_FEATURES`` name); if not, say so.

    For a lesson cell: ``if dl.doctor.has("dist.all_gather_single"): ...`` skips the cell's
    work with one line that names what is missing, instead of a traceback.
    """
    if torch_features().get(feature, False):
        return True
    print(
        _t(
            "Skipped: this torch ({version}) lacks {feature}, which the course's torch "
            ">= {min} has (ddp-lab doctor lists what else).",
            version=_torch_version(),
            feature=feature,
            min=MIN_TORCH,
        )
    )
    return False


def _torch_version() -> str:
    import torch

    return torch.__version__


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


class Report(list):
    """The findings; shown as a coloured table in a notebook."""

    def __str__(self) -> str:
        marks = {OK: "ok     ", WARNING: "WARNING", PROBLEM: "PROBLEM"}
        lines = []
        for x in self:
            lines.append(f"[{marks[x.level]}] {x.key:<16} {x.value}")
            if x.fix:
                lines.append(f"{'':27}-> {x.fix}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        colors = {OK: "#2e7d32", WARNING: "#ef6c00", PROBLEM: "#c62828"}
        rows = "".join(
            f"<tr><td style='color:{colors[x.level]};font-weight:bold'>{x.level}</td>"
            f"<td><code>{x.key}</code></td><td style='text-align:left'>{html.escape(x.value)}"
            + (f"<br><i>&rarr; {html.escape(x.fix)}</i>" if x.fix else "")
            + "</td></tr>"
            for x in self
        )
        return f"<table>{rows}</table>"

    def to_json(self) -> str:
        return json.dumps(
            {
                "findings": [asdict(x) | {"fix": x.fix} for x in self],
                "summary": {lv: sum(x.level == lv for x in self) for lv in (OK, WARNING, PROBLEM)},
            },
            ensure_ascii=False,
            indent=2,
        )


def doctor(facts: Facts | None = None) -> Report:
    """Check this machine (or the given facts) and return the report."""
    return Report(analyse(facts if facts is not None else gather()))


def main(args: Any) -> int:
    """``ddp-lab doctor [--json]``: print the report; exit code 1 when a problem was found."""
    report = doctor()
    print(report.to_json() if getattr(args, "json", False) else report)
    return 1 if any(x.level == PROBLEM for x in report) else 0


class _CallableModule(types.ModuleType):
    """Lets ``dl.doctor()`` call :func:`doctor` although ``dl.doctor`` is this module."""

    def __call__(self, facts: Facts | None = None) -> Report:
        return doctor(facts)


# ``import ddp_lab.tools.doctor`` binds the module to ``ddp_lab.tools.doctor``, so a function of the same
# name in ``ddp_lab/__init__.py`` would be overwritten; making the module callable keeps
# both ``dl.doctor()`` and ``from ddp_lab.tools.doctor import doctor`` working.
sys.modules[__name__].__class__ = _CallableModule
