"""Versions of the GPU stack: parse what the tools print and decide what fits together.

The driver (libcuda, reported by ``nvidia-smi``) supports every CUDA runtime up to the
"CUDA Version" it prints; a runtime (libcudart: the one bundled in a PyTorch wheel, or the
toolkit that ``nvcc`` belongs to) needs a driver at least as new as NVIDIA's published
minimum. Within one major version, NVIDIA's *minor version compatibility* lets a newer
runtime run on an older driver of the same family, with limits (no JIT of newer PTX).

Teaching version: PyTorch has no such checker; the rule for nvcc vs torch mirrors
``torch.utils.cpp_extension._check_cuda_version`` (major must match, minor may differ).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.i18n import _t, get_language, pair

Version = tuple[int, ...]

# NVIDIA, "CUDA Toolkit Release Notes", Table 3 (toolkit driver version, Linux x86_64,
# minimum driver of each toolkit's GA release):
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#id5
MIN_DRIVER_LINUX: dict[tuple[int, int], str] = {
    (13, 0): "580.65.06",
    (12, 9): "575.51.03",
    (12, 8): "570.26",
    (12, 6): "560.28.03",
    (12, 5): "555.42.02",
    (12, 4): "550.54.14",
    (12, 3): "545.23.06",
    (12, 2): "535.54.03",
    (12, 1): "530.30.02",
    (12, 0): "525.60.13",
    (11, 8): "520.61.05",
    (11, 7): "515.43.04",
    (11, 6): "510.39.01",
    (11, 5): "495.29.05",
    (11, 4): "470.42.01",
    (11, 3): "465.19.01",
    (11, 2): "460.27.03",
    (11, 1): "455.23",
    (11, 0): "450.51.05",  # 11.0.2 GA; 450.36.06 was the 11.0.1 release candidate
    (10, 2): "440.33",
    (10, 1): "418.39",
    (10, 0): "410.48",
    (9, 2): "396.26",
    (9, 1): "390.46",
    (9, 0): "384.81",
}
# Same release notes, Table 2 (minor version compatibility): the oldest driver that runs
# any runtime of that major version. CUDA 10 and older have no minor version compatibility.
MINOR_COMPAT_MIN_DRIVER: dict[int, str] = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}

OK, WARNING, PROBLEM = "ok", "warning", "problem"


def parse_version(text: str) -> Version:
    """'535.104.05' -> (535, 104, 5); '12.1' -> (12, 1). Raises ValueError otherwise."""
    m = re.fullmatch(r"\s*v?(\d+(?:\.\d+)*)\s*", str(text))
    if not m:
        raise ValueError(
            _pick(
                *pair(
                    "Not a version number: {text!r} (expected digits and dots, e.g. 535.104.05).",
                    text=text,
                )
            )
        )
    return tuple(int(p) for p in m.group(1).split("."))


def fmt(version: Version | None) -> str:
    """(12, 1) -> '12.1'; None -> '-'."""
    return "-" if version is None else ".".join(str(p) for p in version)


def fmt_driver(version: Version | None) -> str:
    """(470, 82, 1) -> '470.82.01': drivers print their minor parts with two digits.

    None (``nvidia-smi`` failed, so ``SmiInfo.driver`` is unknown) -> '-'.
    """
    if version is None:
        return "-"
    return ".".join([str(version[0]), *(f"{p:02d}" for p in version[1:])])


def max_cuda_for_driver(driver: str | Version) -> tuple[int, int] | None:
    """The newest CUDA (major, minor) whose minimum driver is <= ``driver`` (Linux)."""
    d = parse_version(driver) if isinstance(driver, str) else tuple(driver)
    fits = [cuda for cuda, need in MIN_DRIVER_LINUX.items() if d >= parse_version(need)]
    return max(fits) if fits else None


@dataclass
class SmiInfo:
    """What ``nvidia-smi`` told us: driver version, the newest CUDA it supports, GPUs."""

    driver: Version | None = None
    cuda: tuple[int, int] | None = None  # the header's "CUDA Version" (driver 410 and later)
    gpus: tuple[str, ...] = ()
    error: str = ""  # nvidia-smi ran but could not talk to the driver


_SMI_ERRORS = (
    "has failed because it couldn't communicate with the NVIDIA driver",
    "Failed to initialize NVML",
    "No devices were found",
    "command not found",
    "No such file or directory",
)


def parse_nvidia_smi(text: str | None) -> SmiInfo | None:
    """Parse the default table of ``nvidia-smi``; None when it is missing or empty."""
    if not text or not text.strip():
        return None
    for needle in _SMI_ERRORS:
        if needle in text:
            line = next(ln for ln in text.splitlines() if needle in ln)
            return SmiInfo(error=line.strip())
    info = SmiInfo()
    m = re.search(r"Driver Version:\s*([\d.]+)", text)
    if m:
        info.driver = parse_version(m.group(1))
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", text)
    if m:
        info.cuda = (int(m.group(1)), int(m.group(2)))
    elif info.driver is not None:
        info.cuda = max_cuda_for_driver(info.driver)  # drivers before 410 do not print it
    # GPU rows look like "|   0  NVIDIA A100-SXM4-80GB          On  |".
    names = re.findall(r"^\|\s+\d+\s+(.+?)\s+(?:On|Off)\s+\|", text, flags=re.M)
    info.gpus = tuple(n.strip() for n in names)
    if info.driver is None:
        return SmiInfo(error=text.strip().splitlines()[0])
    return info


def parse_nvcc(text: str | None) -> tuple[int, int] | None:
    """CUDA (major, minor) from ``nvcc -V`` ("Cuda compilation tools, release 12.1, ...")."""
    m = re.search(r"release (\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_torch_cuda(text: str | None) -> tuple[int, int] | None:
    """The CUDA of a torch build: '12.1' (torch.version.cuda), '2.3.0+cu121' or 'cu118'.

    None for a CPU build ('2.3.0+cpu', None, '').
    """
    if not text:
        return None
    text = str(text).strip()
    m = re.search(r"cu(\d+)(\d)$", text)  # cu121 -> 12.1, cu118 -> 11.8, cu92 -> 9.2
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _pick(en: str, zh: str) -> str:
    return zh if get_language() == "zh" else en


@dataclass
class Verdict:
    """A decision with the component to change (``"nothing"`` when it fits)."""

    level: str  # ok / warning / problem
    change: str  # nothing / driver / torch / toolkit
    en: str
    zh: str

    @property
    def text(self) -> str:
        return _pick(self.en, self.zh)


def check_driver_runtime(driver: str | Version, runtime: str | tuple[int, int]) -> Verdict:
    """Can a CUDA ``runtime`` (e.g. torch's '12.1') run on this ``driver`` (e.g. '535.54.03')?"""
    d = parse_version(driver) if isinstance(driver, str) else tuple(driver)
    r = parse_version(runtime)[:2] if isinstance(runtime, str) else tuple(runtime)[:2]
    top = max_cuda_for_driver(d)
    need = MIN_DRIVER_LINUX.get(r)
    if top is not None and r <= top:
        return Verdict(
            OK,
            "nothing",
            *pair(
                "driver {d} supports CUDA up to {top} >= {r}",
                d=fmt_driver(d),
                top=fmt(top),
                r=fmt(r),
            ),
        )
    family = MINOR_COMPAT_MIN_DRIVER.get(r[0])
    if family and d >= parse_version(family):
        return Verdict(
            WARNING,
            "driver",
            *pair(
                "driver {d} supports CUDA {top}, older than {r}; it runs through minor "
                "version compatibility (same major {r2}, driver >= {family}) but newer "
                "PTX cannot be JIT-compiled: upgrade the driver to >= {need_or_family} "
                "when you can",
                d=fmt_driver(d),
                top=fmt(top),
                r=fmt(r),
                r2=r[0],
                family=family,
                need_or_family=need or family,
            ),
        )
    # Across major versions only forward compatibility helps: NVIDIA's cuda-compat package
    # (a newer libcuda next to the old kernel driver), for data-center GPUs only.
    across = top is None or r[0] > top[0]
    return Verdict(
        PROBLEM,
        "driver",
        *(
            pair(
                "driver {d} supports CUDA up to {top}, too old for CUDA {r}: upgrade the "
                "driver to >= {need_or} or install a torch build for CUDA <= {top} (on a "
                "data-center GPU, the cuda-compat package of forward compatibility is a "
                "third way)",
                d=fmt_driver(d),
                top=fmt(top),
                r=fmt(r),
                need_or=need or "?",
            )
            if across
            else pair(
                "driver {d} supports CUDA up to {top}, too old for CUDA {r}: upgrade the "
                "driver to >= {need_or} or install a torch build for CUDA <= {top}",
                d=fmt_driver(d),
                top=fmt(top),
                r=fmt(r),
                need_or=need or "?",
            )
        ),
    )


def check_nvcc_torch(nvcc: tuple[int, int] | None, torch_cuda: tuple[int, int] | None) -> Verdict:
    """Can this nvcc build extensions for this torch? (the rule of torch's cpp_extension)."""
    if nvcc is None or torch_cuda is None:
        return Verdict(OK, "nothing", *pair("nothing to compare (no nvcc or a CPU build)"))
    if nvcc[0] != torch_cuda[0]:
        return Verdict(
            WARNING,
            "toolkit",
            *pair(
                "nvcc {nvcc} vs torch's CUDA {torch_cuda}: different major versions, so "
                "building CUDA extensions fails; running torch is not affected. Install "
                "a {torch_cuda2}.x toolkit and point CUDA_HOME at it",
                nvcc=fmt(nvcc),
                torch_cuda=fmt(torch_cuda),
                torch_cuda2=torch_cuda[0],
            ),
        )
    if nvcc != torch_cuda:
        return Verdict(
            OK,
            "nothing",
            *pair(
                "nvcc {nvcc} vs torch {torch_cuda}: same major, builds work (torch only "
                "warns about the minor difference)",
                nvcc=fmt(nvcc),
                torch_cuda=fmt(torch_cuda),
            ),
        )
    return Verdict(OK, "nothing", *pair("nvcc {nvcc} matches torch's CUDA", nvcc=fmt(nvcc)))


def compat_rows(driver: str | Version) -> list[tuple[str, str, str]]:
    """What the checker widget draws: (CUDA version, minimum driver, level) per CUDA release."""
    d = parse_version(driver) if isinstance(driver, str) else tuple(driver)
    return [
        (fmt(cuda), need, check_driver_runtime(d, cuda).level)
        for cuda, need in sorted(MIN_DRIVER_LINUX.items())
    ]


def compat_widget(driver: str | SmiInfo | None = None, runtime: str | None = None):  # noqa: ANN201
    """An ipywidgets checker: pick a driver and a CUDA runtime, see whether they fit and why.

    ``driver`` and ``runtime`` preselect values (e.g. the detected ones); otherwise the
    newest driver and CUDA 12.1 are shown. ``driver`` may also be an ``SmiInfo``, or None,
    '' or '-' when ``nvidia-smi`` failed (an ``SmiInfo`` with only an error): then the
    newest driver is preselected as well.
    """
    if isinstance(driver, SmiInfo):
        driver = fmt_driver(driver.driver) if driver.driver is not None else None
    if driver in ("", "-"):
        driver = None
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    drivers = sorted(
        {
            *MIN_DRIVER_LINUX.values(),
            *MINOR_COMPAT_MIN_DRIVER.values(),
            *([driver] if driver else []),
        },
        key=parse_version,
    )
    cudas = [fmt(c) for c in sorted(MIN_DRIVER_LINUX)]
    if runtime and fmt(parse_version(runtime)[:2]) not in cudas:
        cudas.append(fmt(parse_version(runtime)[:2]))
    style = {"description_width": "initial"}  # long labels are not cut to "CUDA ru..."
    pick_driver = w.Dropdown(
        options=drivers,
        value=driver or drivers[-1],
        description=_t("driver"),
        style=style,
    )
    pick_cuda = w.Dropdown(
        options=cudas,
        value=fmt(parse_version(runtime)[:2]) if runtime else "12.1",
        description=_t("CUDA runtime"),
        style=style,
    )
    verdict = w.HTML()
    out = w.Output()
    colors = {OK: "#4caf50", WARNING: "#ff9800", PROBLEM: "#e53935"}

    def redraw(*_: object) -> None:
        v = check_driver_runtime(pick_driver.value, pick_cuda.value)
        verdict.value = f"<b style='color:{colors[v.level]}'>{v.level.upper()}</b>: {v.text}"
        rows = compat_rows(pick_driver.value)
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(7, 3.2))
            xs = range(len(rows))
            heights = [
                parse_version(need)[0] + parse_version(need)[1] / 1000 for _, need, _ in rows
            ]
            edge = ["black" if c == pick_cuda.value else "none" for c, _, _ in rows]
            ax.bar(
                xs, heights, color=[colors[lv] for _, _, lv in rows], edgecolor=edge, linewidth=2
            )
            d = parse_version(pick_driver.value)
            ax.axhline(
                d[0] + (d[1] if len(d) > 1 else 0) / 1000,
                color="black",
                ls="--",
                label=_t("your driver {value}", value=pick_driver.value),
            )
            ax.set_xticks(list(xs), [c for c, _, _ in rows], rotation=60, fontsize=7)
            ax.set_ylim(370, 600)
            ax.set_xlabel(_t("CUDA runtime version"))
            ax.set_ylabel(_t("minimum driver (Linux)"))
            ax.set_title(
                _t("Green: supported, orange: minor version compatibility, red: too old"),
                fontsize=9,
            )
            ax.legend(loc="upper left", fontsize=8)
            fig.tight_layout()
            plt.show()

    pick_driver.observe(redraw, names="value")
    pick_cuda.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox([pick_driver, pick_cuda]), verdict, out])
    display(box)
    return box


# The smallest program that shows the three layers apart: the toolkit (nvcc) compiles it with
# no GPU and no driver, the runtime (libcudart, linked in statically by nvcc's default
# ``-cudart static``) answers for itself, and the driver (libcuda.so.1, which libcudart opens
# at run time) answers 0 when it is absent (cudaDriverGetVersion in the CUDA Runtime API).
PROBE_CU = r"""#include <cstdio>
#include <cuda_runtime.h>
__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }
int main() {
  int runtime = -1, driver = -1, devices = -1;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  cudaError_t err = cudaGetDeviceCount(&devices);
  printf("runtime %d\ndriver %d\ndevices %d %s\n", runtime, driver, devices,
         cudaGetErrorName(err));
  return 0;
}
"""


@dataclass
class Probe:
    """What ``PROBE_CU`` printed: versions as CUDA encodes them (13000 = 13.0, 0 = no driver)."""

    nvcc: str
    runtime: int
    driver: int
    devices: int
    device_error: str


def find_nvcc() -> Path | None:
    """A real nvcc: ``$CUDA_HOME/bin``, then NVIDIA's pip wheels (``nvidia/cu13/bin``), then PATH."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    for entry in sys.path:  # nvidia-cuda-nvcc (CUDA 13+) installs nvidia/cu13/bin/nvcc
        candidates += sorted(Path(entry or ".").glob("nvidia/cu[0-9]*/bin/nvcc"), reverse=True)
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def probe_runtime_driver(nvcc: Path, workdir: Path, arch: str = "sm_90") -> Probe:
    """Compile ``PROBE_CU`` for one GPU architecture with ``nvcc`` and run it (no GPU needed).

    ``-L <nvcc>/../lib``: the pip wheels put libcudart_static.a in ``lib/`` while nvcc's own
    ``nvcc.profile`` looks in ``lib64/`` (a system toolkit has both).
    """
    src, exe = workdir / "probe.cu", workdir / "probe"
    src.write_text(PROBE_CU)
    home = nvcc.resolve().parent.parent
    cmd = [str(nvcc), f"-arch={arch}", str(src), "-o", str(exe), "-L", str(home / "lib")]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60)
    f = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    devices, error = f["devices"].split()
    return Probe(str(nvcc), int(f["runtime"]), int(f["driver"]), int(devices), error)
