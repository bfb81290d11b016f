"""The doctor's facts: what ``ddp-lab doctor`` observes on this machine, judging nothing.

``gather`` fills a ``Facts`` (commands such as ``nvidia-smi`` and ``nvcc -V``, torch, the OS,
a loopback gloo all-reduce, which of the course's torch APIs exist); ``doctor_findings``
judges them. Every field can be faked, so tests describe GPU machines a CPU machine cannot
be. ``tools/doctor.py`` re-exports these names.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any


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
# torch 2.13's single-tensor collectives under the names torch had for them before
# (``all_gather_into_tensor``, ``reduce_scatter_tensor``: same arguments, now deprecated).
# ``collective`` is the one lookup the package's code uses.
OLD_COLLECTIVE_NAMES: dict[str, str] = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}
TORCH_FEATURES: dict[str, str] = {
    "dist.all_gather_single": "04 (tensor forms, traced collectives), 10",
    "dist.reduce_scatter_single": "04, 10 (exercise 3: 10.fsdp_reduce)",
    "DDP(forward_sync_buffers=)": "07 (buffers after wrapping)",
    "gloo all_to_all": "04 (all_to_all)",
}


def collective(name: str) -> Any:
    """``torch.distributed.<name>``, or on a torch without it (2.11) the same collective
    under its older name (``OLD_COLLECTIVE_NAMES``).

    Looked up at each call, not at import, so a patched ``dist.<name>`` (a recording test,
    a grader's wrapper) is the one called.
    """
    import torch.distributed as dist

    fn = getattr(dist, name, None)
    return fn if fn is not None else getattr(dist, OLD_COLLECTIVE_NAMES[name])


def torch_features() -> dict[str, bool]:
    """Which of ``TORCH_FEATURES`` this torch has (gloo's all_to_all: on a 1-rank group)."""
    import inspect
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    ddp = torch.nn.parallel.DistributedDataParallel.__init__
    found = {
        **{f"dist.{name}": hasattr(dist, name) for name in OLD_COLLECTIVE_NAMES},
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
