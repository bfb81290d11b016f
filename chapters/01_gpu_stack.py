# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: ddp_lab
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   ddp_lab:
#     title:
#       en: "01 The GPU software stack and NCCL"
#       zh: "01 GPU 软件栈与 NCCL"
# ---

# %% [markdown] lang="en"
# # 01 The GPU software stack and NCCL
#
# Before any distributed code runs, five pieces must fit together: the **driver**, the CUDA
# runtime that PyTorch ships, the **CUDA toolkit** (with `nvcc`), cuDNN and NCCL. This
# chapter inspects *your* machine. Where it has no GPU, cells say so and show what a GPU
# machine prints, using real outputs stored with the course (clearly labelled).

# %% [markdown] lang="zh"
# # 01 GPU 软件栈与 NCCL
#
# 在运行任何分布式代码之前，五个部分必须相互匹配：**驱动**（driver）、PyTorch 自带的 CUDA
# 运行时、**CUDA 工具包**（CUDA toolkit，含 `nvcc`）、cuDNN 和 NCCL。本章检查的是*你自己的*
# 机器。如果没有 GPU，代码单元会说明这一点，并展示 GPU 机器上的真实输出（课程自带，
# 已明确标注）。

# %%
import os
import shutil
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.tools import cuda_compat as cc
from ddp_lab.tools.doctor import doctor

dl.setup()
FIXTURES = Path(dl.__file__).resolve().parent.parent / "tests" / "fixtures"
print("torch", torch.__version__, "| torch.version.cuda =", torch.version.cuda)

# %% [markdown] lang="en"
# ## Driver API vs runtime API
#
# - The **driver API** lives in `libcuda.so`, installed with the GPU driver. `nvidia-smi`
#   talks to the driver, and the "CUDA Version" in its header is the *newest* CUDA that this
#   driver can run, not an installed CUDA.
# - The **runtime API** lives in `libcudart.so`. A PyTorch wheel bundles its own copy (its
#   version is `torch.version.cuda`); a CUDA toolkit has another, and `nvcc -V` prints the
#   toolkit's version. `nvcc` knows nothing about the driver.
#
# So `nvidia-smi` and `nvcc -V` usually print *different* CUDA versions. That is fine when
# the driver's number is the larger one. When PyTorch's runtime is newer, it depends on the
# major version: a newer runtime of the *same* major still runs (minor version
# compatibility, below), and only across major versions (a CUDA 12 runtime on a driver whose
# header says 11.x) does it fail to start. Let us ask this machine.

# %% [markdown] lang="zh"
# ## 驱动 API 与运行时 API
#
# - **驱动 API**（driver API）在 `libcuda.so` 中，随 GPU 驱动一起安装。`nvidia-smi` 与驱动
#   通信，它表头里的“CUDA Version”是这个驱动*最高*能运行的 CUDA 版本，并不是已安装的 CUDA。
# - **运行时 API**（runtime API）在 `libcudart.so` 中。PyTorch 的 wheel 自带一份（版本就是
#   `torch.version.cuda`）；CUDA 工具包里还有另一份，`nvcc -V` 打印的是工具包的版本。
#   `nvcc` 对驱动一无所知。
#
# 因此 `nvidia-smi` 和 `nvcc -V` 打印的 CUDA 版本通常*不同*。只要驱动的版本号更大就没有问题。
# 如果 PyTorch 自带的运行时比驱动支持的版本还新，就要看主版本：*同一*主版本内较新的运行时
# 仍然可以运行（下面讲的小版本兼容），只有跨主版本（例如 CUDA 12 的运行时遇到表头写着 11.x 的驱动）才无法启动。
# 下面看看这台机器上的情况。

# %%
def run(cmd):
    """Run a command and return what it printed, or None when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return None
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    return p.stdout + p.stderr


smi_text = run(["nvidia-smi"])
nvcc_text = run(["nvcc", "-V"])
if smi_text is None:
    print("nvidia-smi: not found on this machine (no NVIDIA driver).")
    smi_text = (FIXTURES / "nvidia-smi" / "535.104.05_cuda12.2_h100.txt").read_text()
    print("=== EXAMPLE from an H100 machine (not this machine) ===")
print("\n".join(smi_text.splitlines()[:10]))
print("--- nvcc -V on this machine ---" if nvcc_text else "nvcc: not found on this machine")
print(nvcc_text or "")

# %%
info = cc.parse_nvidia_smi(smi_text)
if info is None or info.error:
    # nvidia-smi exists but cannot talk to the driver: no version to read on this machine.
    print("nvidia-smi FAILED here:", info.error if info else "(it printed nothing)")
    print("-> no usable driver: `ddp-lab doctor` below says whether to install or reboot.")
    print("=== below: EXAMPLE from an H100 machine (not this machine) ===")
    info = cc.parse_nvidia_smi((FIXTURES / "nvidia-smi" / "535.104.05_cuda12.2_h100.txt").read_text())
print("driver:", cc.fmt_driver(info.driver), "| newest CUDA it runs:", cc.fmt(info.cuda))
print("nvcc's CUDA:", cc.fmt(cc.parse_nvcc(nvcc_text)), "| torch's CUDA runtime:", torch.version.cuda)
print(cc.check_driver_runtime(info.driver, "12.1").text)
print(cc.check_driver_runtime(info.driver, "12.8").text)

# %% [markdown] lang="en"
# The rule comes from NVIDIA's table of minimum driver versions per CUDA release (CUDA
# Toolkit Release Notes, Tables 2 and 3, Linux x86_64:
# [docs.nvidia.com/cuda/cuda-toolkit-release-notes](https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)).
# Within one major version,
# *minor version compatibility* lets, say, a CUDA 12.4 runtime run on a 12.0 driver
# (>= 525.60.13). What does not work there: JIT compilation of PTX produced by the newer
# toolkit (code shipped only as PTX fails to load), and the few API calls that need a newer
# driver (they return `cudaErrorCallRequiresNewerDriver`). So it is a warning, not an error.
# Across major versions only **forward compatibility** helps: NVIDIA's `cuda-compat`
# package puts a newer user-mode driver (`libcuda.so`) next to the old kernel driver, and it
# is supported on data-center GPUs only
# ([CUDA Compatibility guide](https://docs.nvidia.com/deploy/cuda-compatibility/); needs such
# a GPU, not run here).

# %% [markdown] lang="zh"
# 这条规则来自 NVIDIA 发布的各 CUDA 版本最低驱动版本表
# （[CUDA Toolkit Release Notes](https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)
# 的表 2 和表 3，Linux x86_64）。
# 在同一个主版本内，*小版本兼容*（minor version compatibility）允许例如 CUDA 12.4 的运行时在
# 12.0 的驱动（>= 525.60.13）上运行。在这种情况下不能用的是：JIT 编译新工具包生成的 PTX
# （只以 PTX 形式提供的代码无法加载），以及少数需要新驱动的 API（返回
# `cudaErrorCallRequiresNewerDriver`）。所以这是警告，不是错误。跨主版本时只有**前向兼容**
# （forward compatibility）能帮上忙：NVIDIA 的 `cuda-compat` 包把更新的用户态驱动
# （`libcuda.so`）放在旧的内核驱动旁边，而且只支持数据中心 GPU（见
# [CUDA Compatibility 指南](https://docs.nvidia.com/deploy/cuda-compatibility/)；需要这类 GPU，
# 这里没有运行）。

# %%
for cuda, need in list(cc.MIN_DRIVER_LINUX.items())[:6] + [((11, 0), cc.MIN_DRIVER_LINUX[11, 0])]:
    print(f"CUDA {cc.fmt(cuda):>5} needs driver >= {need}")
# GA releases only: CUDA 11.0's 450.36.06, quoted in many places, was its release candidate.
print(cc.check_driver_runtime("470.82.01", "11.8").text)  # same major: runs, with a warning
print(cc.check_driver_runtime("470.82.01", "12.1").text)  # across majors: does not start

# %% [markdown] lang="en"
# ### Interactive checker
#
# Pick a driver and a CUDA runtime (the detected ones are preselected when there is a GPU).
# Bars show the minimum driver of each CUDA release; the dashed line is your driver.

# %% [markdown] lang="zh"
# ### 交互式检查器
#
# 选择一个驱动版本和一个 CUDA 运行时版本（有 GPU 时会预先选中检测到的版本）。柱子表示每个
# CUDA 版本要求的最低驱动，虚线是你的驱动。

# %%
cc.compat_widget(driver=cc.fmt_driver(info.driver), runtime=torch.version.cuda or "12.1");

# %% [markdown] lang="en"
# ## cuDNN, NCCL and the backends of this build
#
# cuDNN (the neural-network kernels) and NCCL (GPU collectives) also come inside the
# PyTorch wheel. A CPU build has neither: the only distributed backend is `gloo`.

# %% [markdown] lang="zh"
# ## cuDNN、NCCL 以及当前版本支持的后端
#
# cuDNN（神经网络算子库）和 NCCL（GPU 集合通信库）同样包含在 PyTorch 的 wheel 中。
# CPU 版本两者都没有：唯一可用的分布式后端（backend）是 `gloo`。

# %%
print("cuDNN:", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("gloo:", dist.is_gloo_available(), "| nccl:", dist.is_nccl_available(),
      "| mpi:", dist.is_mpi_available())
if dist.is_nccl_available():  # a CUDA build has NCCL even on a machine without a GPU
    try:
        print("NCCL bundled with torch:", torch.cuda.nccl.version(),
              "| GPUs visible:", torch.cuda.device_count())
    except RuntimeError as err:  # not seen, but this machine's driver may be broken
        print("NCCL is built in, but asking its version failed:", err)
else:
    print("No NCCL in this build (a CPU build): torch.cuda.nccl.version() would fail here.")

# %% [markdown] lang="en"
# "Inside the wheel" needs a precision: the CUDA wheels on PyPI and download.pytorch.org
# bring NCCL, cuDNN, cuBLAS and the CUDA runtime as **separate** `nvidia-*` wheels that pip
# installs as dependencies. Their names carry the CUDA major: `nvidia-nccl-cu12`,
# `nvidia-cudnn-cu12` for a CUDA 12 build, `-cu13` names for a CUDA 13 build. The cell reads
# the dependencies of *your* torch (a CPU build has none):

# %% [markdown] lang="zh"
# “包含在 wheel 中”需要说得更准确些：PyPI 和 download.pytorch.org 上的 CUDA 版 wheel 把
# NCCL、cuDNN、cuBLAS 和 CUDA 运行时做成**单独的** `nvidia-*` wheel，由 pip 作为依赖安装。
# 它们的名字带着 CUDA 主版本：CUDA 12 版本是 `nvidia-nccl-cu12`、`nvidia-cudnn-cu12`，
# CUDA 13 版本则是 `-cu13` 结尾的名字。下面的单元读取*你的* torch 的依赖（CPU 版本没有）：

# %%
from importlib import metadata

needs = [r.split(";")[0] for r in metadata.requires("torch") or [] if r.startswith("nvidia-")]
print(needs or "this torch build depends on no nvidia-* wheel (a CPU build)")

# %% [markdown] lang="en"
# Which `libnccl` did the process really load? Your `LD_LIBRARY_PATH` does not decide it
# alone: the wheel's copy (from the `nvidia-nccl-cu12` or `-cu13` package) is found first
# unless you `LD_PRELOAD` yours. The memory map of the process tells the truth:

# %% [markdown] lang="zh"
# 进程实际加载的是哪个 `libnccl`？这并不只由 `LD_LIBRARY_PATH` 决定：除非你用 `LD_PRELOAD`
# 指定自己的版本，否则会先找到 wheel 带来的那一份（来自 `nvidia-nccl-cu12` 或 `-cu13` 包）。
# 进程的内存映射会给出真实答案：

# %%
loaded = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line})
print(loaded or "no libnccl is loaded in this process (CPU build of torch)")

# %% [markdown] lang="en"
# ## GPU architecture vs the wheel, and device order
#
# A CUDA wheel holds kernels compiled for a list of GPU architectures, printed by
# `torch.cuda.get_arch_list()` (`sm_90` = compute capability 9.0; `compute_90` = PTX that the
# driver can JIT-compile for newer GPUs). A GPU outside that list (an old one dropped by the
# build, or a new one without matching PTX) gets a warning at start (`_check_capability` in
# `torch/cuda/__init__.py`) and then `CUDA error: no kernel image is available for execution
# on the device` at the first kernel. The fix is a wheel built for it, not a driver.
#
# Device numbers differ between tools: CUDA (and so torch) numbers GPUs fastest first by
# default (`CUDA_DEVICE_ORDER=FASTEST_FIRST`), `nvidia-smi` by PCI bus. On a machine with
# mixed GPUs, `cuda:0` may not be `nvidia-smi`'s GPU 0; export
# `CUDA_DEVICE_ORDER=PCI_BUS_ID` to make them agree (CUDA Programming Guide, "CUDA
# Environment Variables"; this machine cannot show it).

# %% [markdown] lang="zh"
# ## GPU 架构与 wheel，以及设备编号
#
# CUDA 版 wheel 里的核函数（kernel）是为一组 GPU 架构编译的，用 `torch.cuda.get_arch_list()` 可以打印
# 出来（`sm_90` 即计算能力 9.0；`compute_90` 是 PTX，驱动可以为更新的 GPU 做 JIT 编译）。
# 不在这个列表里的 GPU（被这个版本放弃的旧卡，或者没有对应 PTX 的新卡）启动时会得到一条警告
# （`torch/cuda/__init__.py` 的 `_check_capability`），第一个核函数运行时则报
# `CUDA error: no kernel image is available for execution on the device`。解决办法是换一个为它
# 编译的 wheel，而不是换驱动。
#
# 各工具的设备编号也不一样：CUDA（因而 torch 也一样）默认按速度从快到慢编号
# （`CUDA_DEVICE_ORDER=FASTEST_FIRST`），`nvidia-smi` 按 PCI 总线编号。在混插不同 GPU 的机器上，
# `cuda:0` 不一定是 `nvidia-smi` 里的 GPU 0；设置 `CUDA_DEVICE_ORDER=PCI_BUS_ID` 就能让两者一致
# （CUDA Programming Guide 的“CUDA Environment Variables”；本机无法演示）。

# %%
print("kernels in this wheel:", torch.cuda.get_arch_list() or "none (a CPU build)")
print("CUDA_DEVICE_ORDER =", os.environ.get("CUDA_DEVICE_ORDER", "(unset: FASTEST_FIRST)"))
for d in range(torch.cuda.device_count()):
    major, minor = torch.cuda.get_device_capability(d)
    built = f"sm_{major}{minor}" in torch.cuda.get_arch_list()
    print(f"cuda:{d}", torch.cuda.get_device_name(d), f"sm_{major}{minor}",
          "has kernels in this wheel" if built else "-> no exact kernels: needs PTX or another wheel")

# %% [markdown] lang="en"
# ### Building NCCL without root (and testing it)
#
# Building NCCL needs a CUDA toolkit (`nvcc`, the CUDA headers and `libcudart_static.a`), but
# no GPU, no driver and no root. A recipe common in notes and blog posts builds NCCL in a home
# folder, which works, but two of its steps are wrong: it adds the build's `include/` folder to
# `PATH` (headers are not programs; the programs a build makes since NCCL 2.24, `ncclras` and
# later `ncclparam`, go to `bin/`, see `BINDIR` in NCCL's `src/Makefile`), and its
# `LD_LIBRARY_PATH` points at a different folder than `BUILDDIR`.
#
# Where the machine has no toolkit (on a cluster, `module avail cuda` lists the installed
# ones), NVIDIA's pip wheels bring one into a virtual environment. For CUDA 13,
# `nvidia-cuda-nvcc`, the wheels it depends on and `nvidia-cuda-cccl` (the C++ headers that
# NCCL includes from `include/cccl`) put `nvcc`, `cicc`, `ptxas`, the headers and
# `libcudart_static.a` into one folder, `site-packages/nvidia/cu13`, which serves as
# `CUDA_HOME`. The CUDA 12 wheel `nvidia-cuda-nvcc-cu12` (12.8.93, and 12.9.86, the newest)
# holds only `ptxas` and `libnvvm`, no `nvcc`: for CUDA 12 you need a real toolkit. Build with
# the CUDA major of your torch: torch 2.13.0 on PyPI is a CUDA 13.0 build that depends on
# `nvidia-nccl-cu13==2.29.7`. Pin all five wheels: unpinned, pip completes
# `nvidia-cuda-nvcc==13.0.88` with the newest `nvidia-nvvm` and `nvidia-cuda-crt` (13.5.37),
# parts of another release.
#
# The wheels differ from a toolkit in `/usr/local/cuda` in two ways that the makefiles meet.
# They have `lib/` and no `lib64/`, while NCCL's `makefiles/common.mk` and nccl-tests'
# `src/common.mk` say `CUDA_LIB ?= $(CUDA_HOME)/lib64`: without `CUDA_LIB=$CUDA_HOME/lib`
# the link fails with `cannot find -lcudart_static`. And `lib/` has `libcudart.so.13` but no
# `libcudart.so`, which nccl-tests links with `-lcudart` (`CUDARTLIB ?= cudart`): without
# `CUDARTLIB=cudart_static` it fails with `cannot find -lcudart`. Nothing links against the
# driver (`libcuda.so`, which no wheel here brings): the CUDA runtime opens it while the
# program runs.
#
# `v2.30.7-1` is the newest tag of NVIDIA/nccl and `v2.19.6` that of NVIDIA/nccl-tests as
# this course was checked. NCCL's `makefiles/common.mk` knows CUDA 8 to 13 (CUDA 13 drops
# GPUs before sm_75); which CUDA versions NVIDIA builds and tests a tag with is in its
# [release notes](https://github.com/NVIDIA/nccl/releases): pick a tag whose notes list
# your CUDA. `NVCC_GENCODE` compiles the kernels for your GPU only (here
# compute capability 9.0, an H100); without it, CUDA 13 compiles them for six architectures
# plus PTX (`NVCC_GENCODE ?=` in `makefiles/common.mk`).
#
# ```bash
# python3 -m venv $HOME/opt/cuda13                        # a CUDA toolkit from pip, no root
# $HOME/opt/cuda13/bin/pip install nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
#     nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
# export CUDA_HOME=$(echo $HOME/opt/cuda13/lib/python3*/site-packages/nvidia/cu13)
# git clone https://github.com/NVIDIA/nccl.git && cd nccl
# git checkout v2.30.7-1                     # a tag whose release notes list your CUDA
# make -j$(nproc) src.build BUILDDIR=$HOME/opt/nccl CUDA_HOME=$CUDA_HOME \
#      CUDA_LIB=$CUDA_HOME/lib NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
# cd .. && git clone https://github.com/NVIDIA/nccl-tests.git && cd nccl-tests
# git checkout v2.19.6
# make MPI=0 CUDA_HOME=$CUDA_HOME CUDA_LIB=$CUDA_HOME/lib CUDARTLIB=cudart_static \
#      NCCL_HOME=$HOME/opt/nccl NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
# export LD_LIBRARY_PATH=$HOME/opt/nccl/lib:$LD_LIBRARY_PATH   # lib/ (bin/ has ncclras)
# ./build/all_reduce_perf -b 8 -e 256M -f 2 -g 2     # 2 GPUs, 8 B to 256 MB
# ```

# %% [markdown] lang="zh"
# ### 无 root 权限编译 NCCL（并测试）
#
# 编译 NCCL 需要 CUDA 工具包（`nvcc`、CUDA 头文件和 `libcudart_static.a`），但不需要 GPU、驱动，
# 也不需要 root。网上常见的一种做法是在用户目录下编译 NCCL，这个思路可行，但有两步是错的：把编译结果的
# `include/` 目录加入了 `PATH`（头文件不是可执行程序；从 NCCL 2.24 起编译出的程序 `ncclras`，
# 以及后来的 `ncclparam`，放在 `bin/` 里，见 NCCL `src/Makefile` 中的 `BINDIR`），而且
# `LD_LIBRARY_PATH` 指向的目录与 `BUILDDIR` 不同。
#
# 机器上没有工具包时（在集群上，`module avail cuda` 会列出已安装的版本），可以用 NVIDIA 的
# pip wheel 把工具包装进虚拟环境。对 CUDA 13，`nvidia-cuda-nvcc`、它依赖的几个 wheel 以及
# `nvidia-cuda-cccl`（NCCL 从 `include/cccl` 引用的 C++ 头文件）会把 `nvcc`、`cicc`、
# `ptxas`、头文件和 `libcudart_static.a` 装进同一个目录 `site-packages/nvidia/cu13`，
# 这个目录就可以当作 `CUDA_HOME`。CUDA 12 的
# `nvidia-cuda-nvcc-cu12`（12.8.93，以及最新的 12.9.86）里只有 `ptxas` 和 `libnvvm`，没有
# `nvcc`：用 CUDA 12 就得有真正的工具包。请用与你的 torch 相同的 CUDA 主版本编译：PyPI 上的
# torch 2.13.0 是 CUDA 13.0 版本，依赖 `nvidia-nccl-cu13==2.29.7`。五个 wheel 都要固定版本：
# 不固定的话，pip 会给 `nvidia-cuda-nvcc==13.0.88` 配上最新的 `nvidia-nvvm` 和
# `nvidia-cuda-crt`（13.5.37），也就是另一个发行版的组件。
#
# 这些 wheel 与 `/usr/local/cuda` 下的工具包有两处不同，makefile 都会遇到。它们只有 `lib/`，
# 没有 `lib64/`，而 NCCL 的 `makefiles/common.mk` 和 nccl-tests 的 `src/common.mk` 都写着
# `CUDA_LIB ?= $(CUDA_HOME)/lib64`：不加 `CUDA_LIB=$CUDA_HOME/lib`，链接时会报
# `cannot find -lcudart_static`。另外 `lib/` 里有 `libcudart.so.13`，却没有 `libcudart.so`，
# 而 nccl-tests 用 `-lcudart` 链接（`CUDARTLIB ?= cudart`）：不加 `CUDARTLIB=cudart_static`，
# 会报 `cannot find -lcudart`。没有任何东西链接驱动（`libcuda.so`，这里的 wheel 都不带它）：
# CUDA 运行时在程序运行时才去打开它。
#
# 核对本课程时，NVIDIA/nccl 最新的 tag 是 `v2.30.7-1`，NVIDIA/nccl-tests 是 `v2.19.6`。NCCL 的
# `makefiles/common.mk` 支持 CUDA 8 到 13（CUDA 13 不再支持 sm_75 之前的 GPU）；NVIDIA 用哪些
# CUDA 版本编译和测试某个 tag，写在它的[发布说明](https://github.com/NVIDIA/nccl/releases)里：请选择发布说明中列出你的 CUDA 的 tag。`NVCC_GENCODE` 让核函数只为你的 GPU
# 编译（这里是计算能力 9.0，即 H100）；不设置的话，CUDA 13 会为六种架构各编译一遍，另加 PTX
# （见 `makefiles/common.mk` 中的 `NVCC_GENCODE ?=`）。
#
# ```bash
# python3 -m venv $HOME/opt/cuda13                        # 用 pip 装 CUDA 工具包，无需 root
# $HOME/opt/cuda13/bin/pip install nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
#     nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
# export CUDA_HOME=$(echo $HOME/opt/cuda13/lib/python3*/site-packages/nvidia/cu13)
# git clone https://github.com/NVIDIA/nccl.git && cd nccl
# git checkout v2.30.7-1                     # 选择发布说明中列出你的 CUDA 版本的 tag
# make -j$(nproc) src.build BUILDDIR=$HOME/opt/nccl CUDA_HOME=$CUDA_HOME \
#      CUDA_LIB=$CUDA_HOME/lib NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
# cd .. && git clone https://github.com/NVIDIA/nccl-tests.git && cd nccl-tests
# git checkout v2.19.6
# make MPI=0 CUDA_HOME=$CUDA_HOME CUDA_LIB=$CUDA_HOME/lib CUDARTLIB=cudart_static \
#      NCCL_HOME=$HOME/opt/nccl NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
# export LD_LIBRARY_PATH=$HOME/opt/nccl/lib:$LD_LIBRARY_PATH   # 是 lib/（bin/ 里是 ncclras）
# ./build/all_reduce_perf -b 8 -e 256M -f 2 -g 2     # 2 块 GPU，8 B 到 256 MB
# ```

# %% [markdown] lang="en"
# What you will see (a run on 2026-11-25: no GPU, no driver, 2 CPU cores shared with other
# jobs, the toolkit from the wheels above, paths written as in the commands; the whole
# transcript is in `docs/nccl-build.md`):
#
# ```text
# $ ls $CUDA_HOME $CUDA_HOME/lib
# bin  include  lib  nvvm
# cmake  libcudadevrt.a  libcudart.so.13  libcudart_static.a  libnvvm.so.4
# $ $CUDA_HOME/bin/nvcc --version | tail -2
# Cuda compilation tools, release 13.0, V13.0.88
# Build cuda_13.0.r13.0/compiler.36424714_0
# $ make -j$(nproc) src.build BUILDDIR=$HOME/opt/nccl CUDA_HOME=$CUDA_HOME ...    # nproc: 2
# NVCC_GENCODE is -gencode=arch=compute_90,code=sm_90
# Generating nccl.h.in                           > $HOME/opt/nccl/include/nccl.h
# ...
# Compiling  bootstrap.cc                        > $HOME/opt/nccl/obj/bootstrap.o
# ...
# Compiling       $HOME/opt/nccl/obj/device/gensrc/reduce_sum_bf16.cu
# ...
# $ grep 'define NCCL_VERSION_CODE' $HOME/opt/nccl/include/nccl.h     # written first
# #define NCCL_VERSION_CODE 23007
# $ strings $HOME/opt/nccl/obj/init.o | grep '^NCCL version'          # compiled in
# NCCL version 2.30.7+cuda13.0
# $ ls -l $HOME/opt/nccl/lib
# lrwxrwxrwx 1 root root        12 Nov 25 21:52 libnccl.so -> libnccl.so.2
# lrwxrwxrwx 1 root root        17 Nov 25 21:52 libnccl.so.2 -> libnccl.so.2.30.7
# -rwxr-xr-x 1 root root  58404992 Nov 25 21:52 libnccl.so.2.30.7
# -rw-r--r-- 1 root root 106061030 Nov 25 21:52 libnccl_static.a
# drwxr-xr-x 2 root root      4096 Nov 25 17:00 pkgconfig
# $ ldd $HOME/opt/nccl/lib/libnccl.so | grep -c -e cudart -e libcuda
# 0
# $ nm -D --defined-only $HOME/opt/nccl/lib/libnccl.so | grep -w -e ncclAllReduce -e ncclGetVersion
# 0000000000086490 W ncclAllReduce
# 00000000000b0f00 W ncclGetVersion
# $ cuobjdump --list-elf $HOME/opt/nccl/lib/libnccl.so | grep -o 'sm_[0-9]*' | sort | uniq -c
#      10 sm_100
#      28 sm_90
# $ ./build/all_reduce_perf -b 8 -e 256M -f 2 -g 2            # in nccl-tests, no GPU here
# # nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007
# ...
# vm: Test CUDA failure util.cu:674 'CUDA driver version is insufficient for CUDA runtime version'
# ```
#
# The build compiles 136 C++ files and 171 CUDA files (169 of them generated by `generate.py`
# in `src/device/` and `src/device/symmetric/`, each once for the one architecture), then links
# `lib/libnccl.so.2.30.7`. On few cores the CUDA files take long: on those 2 shared cores the
# same command ran three times on the same `BUILDDIR` (an interrupted `make` keeps what it
# finished): 52, 8 and 35 minutes, most of it in the CUDA files; on more cores `-j$(nproc)`
# divides that part. To get a library to link against sooner, NCCL's own `ONLY_FUNCS` option
# (`src/device/generate.py` explains it; e.g. `ONLY_FUNCS="AllReduce Sum f32 * *"`: kernels for
# a sum all-reduce of `float` only) linked one in 23 minutes there, half the size, with the
# same host side; for real runs build without it.
#
# `cuobjdump` (not among the five wheels: `pip install nvidia-cuda-cuobjdump`) lists the GPU
# machine code inside the library: 28 objects for `sm_90` and no PTX, so this library runs on
# compute capability 9.0 GPUs (H100, H200) and nothing else. The ten `sm_100` objects are FP8
# symmetric kernels that `src/device/Makefile` always compiles for `sm_100f`
# (`NVCC_GENCODE_LDMC_FP8`), whatever `NVCC_GENCODE` says. The `libnccl.so.2` of the
# `nvidia-nccl-cu13` wheel that torch installs is 236 MB: code for six architectures, from
# `sm_75` to `sm_120`, plus PTX that the driver can compile for a newer GPU.
#
# Your library needs neither `libcudart` (linked in statically) nor `libcuda`: the CUDA runtime
# opens the driver only when the program runs, which is why `all_reduce_perf` starts, finds `libnccl.so.2` through
# `LD_LIBRARY_PATH`, and fails only at its first CUDA call, with `cudaErrorInsufficientDriver`
# (the error the small CUDA program compiled further below meets too).
#
# Without `CUDA_HOME` pointing at a toolkit (say `CUDA_HOME=/usr/local/cuda-12.8` on a
# machine that has none), `make` does not stop at once: the first file that includes the CUDA
# headers fails with `fatal error: cuda_runtime.h: No such file or directory`.
#
# `ncclGetVersion` only stores `NCCL_VERSION_CODE` (23007 for 2.30.7; `src/init.cc`), so a
# built library answers it without a GPU. The cell below asks the one in `NCCL_HOME`, or in
# `$HOME/opt/nccl`, if there is one.

# %% [markdown] lang="zh"
# 你会看到的输出（2026-11-25 的一次运行：没有 GPU，没有驱动，2 个与其他任务共享的 CPU 核，
# 工具包来自上面的 wheel，路径按上面命令的写法给出；完整记录见 `docs/nccl-build.md`）：
#
# ```text
# $ ls $CUDA_HOME $CUDA_HOME/lib
# bin  include  lib  nvvm
# cmake  libcudadevrt.a  libcudart.so.13  libcudart_static.a  libnvvm.so.4
# $ $CUDA_HOME/bin/nvcc --version | tail -2
# Cuda compilation tools, release 13.0, V13.0.88
# Build cuda_13.0.r13.0/compiler.36424714_0
# $ make -j$(nproc) src.build BUILDDIR=$HOME/opt/nccl CUDA_HOME=$CUDA_HOME ...    # nproc: 2
# NVCC_GENCODE is -gencode=arch=compute_90,code=sm_90
# Generating nccl.h.in                           > $HOME/opt/nccl/include/nccl.h
# ...
# Compiling  bootstrap.cc                        > $HOME/opt/nccl/obj/bootstrap.o
# ...
# Compiling       $HOME/opt/nccl/obj/device/gensrc/reduce_sum_bf16.cu
# ...
# $ grep 'define NCCL_VERSION_CODE' $HOME/opt/nccl/include/nccl.h     # written first
# #define NCCL_VERSION_CODE 23007
# $ strings $HOME/opt/nccl/obj/init.o | grep '^NCCL version'          # compiled in
# NCCL version 2.30.7+cuda13.0
# $ ls -l $HOME/opt/nccl/lib
# lrwxrwxrwx 1 root root        12 Nov 25 21:52 libnccl.so -> libnccl.so.2
# lrwxrwxrwx 1 root root        17 Nov 25 21:52 libnccl.so.2 -> libnccl.so.2.30.7
# -rwxr-xr-x 1 root root  58404992 Nov 25 21:52 libnccl.so.2.30.7
# -rw-r--r-- 1 root root 106061030 Nov 25 21:52 libnccl_static.a
# drwxr-xr-x 2 root root      4096 Nov 25 17:00 pkgconfig
# $ ldd $HOME/opt/nccl/lib/libnccl.so | grep -c -e cudart -e libcuda
# 0
# $ nm -D --defined-only $HOME/opt/nccl/lib/libnccl.so | grep -w -e ncclAllReduce -e ncclGetVersion
# 0000000000086490 W ncclAllReduce
# 00000000000b0f00 W ncclGetVersion
# $ cuobjdump --list-elf $HOME/opt/nccl/lib/libnccl.so | grep -o 'sm_[0-9]*' | sort | uniq -c
#      10 sm_100
#      28 sm_90
# $ ./build/all_reduce_perf -b 8 -e 256M -f 2 -g 2            # in nccl-tests, no GPU here
# # nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007
# ...
# vm: Test CUDA failure util.cu:674 'CUDA driver version is insufficient for CUDA runtime version'
# ```
#
# 整个过程要编译 136 个 C++ 文件和 171 个 CUDA 文件（其中 169 个由 `src/device/` 和
# `src/device/symmetric/` 中的 `generate.py` 生成，每个只为这一种架构编译一次），然后链接出
# `lib/libnccl.so.2.30.7`。核数少时 CUDA 文件编译得很慢：在那 2 个共享的 CPU 核上，同一条命令
# 在同一个 `BUILDDIR` 上先后跑了三次（`make` 中断后，已经编译好的文件会保留），分别用了 52、8 和
# 35 分钟，大部分时间花在 CUDA 文件上；核数多时，`-j$(nproc)` 能把这部分分摊开。如果想早点拿到
# 一个能链接的库，可以用 NCCL 自带的 `ONLY_FUNCS` 选项（`src/device/generate.py` 里有说明；例如
# `ONLY_FUNCS="AllReduce Sum f32 * *"`：只生成 `float` 求和全归约的核函数），在那台机器上 23 分钟
# 就链接好了，大小只有一半，主机端代码完全相同；真正要跑训练时，请不带这个选项完整编译。
#
# `cuobjdump` 不在上面那五个 wheel 里（要另装 `pip install nvidia-cuda-cuobjdump`），它能列出库里
# 的 GPU 机器码：`sm_90` 的目标文件有 28 个，没有 PTX，所以这个库只能在计算能力 9.0 的 GPU
# （H100、H200）上运行。那 10 个 `sm_100` 目标文件是 FP8 的对称核函数，不管 `NVCC_GENCODE`
# 怎么设，`src/device/Makefile` 都会把它们编译成 `sm_100f`（`NVCC_GENCODE_LDMC_FP8`）。torch
# 安装的 `nvidia-nccl-cu13` wheel 里的 `libnccl.so.2` 有 236 MB：包含从 `sm_75` 到 `sm_120`
# 六种架构的机器码，外加 PTX，驱动可以把它编译给更新的 GPU。
#
# 你编译出的库既不依赖 `libcudart`（已静态链接进来），也不依赖 `libcuda`：CUDA 运行时要到程序
# 运行时才去打开驱动。因此 `all_reduce_perf` 能够启动，并通过 `LD_LIBRARY_PATH` 找到 `libnccl.so.2`，直到第一次调用
# CUDA 才失败，报的是 `cudaErrorInsufficientDriver`（后面编译的那个小 CUDA 程序也会遇到它）。
#
# 如果 `CUDA_HOME` 没有指向工具包（例如机器上并没有 `/usr/local/cuda-12.8`，却设置了
# `CUDA_HOME=/usr/local/cuda-12.8`），`make` 不会立刻停下：第一个包含 CUDA 头文件的源文件会报
# `fatal error: cuda_runtime.h: No such file or directory`。
#
# `ncclGetVersion` 只是写回 `NCCL_VERSION_CODE`（2.30.7 对应 23007；见 `src/init.cc`），所以
# 编译好的库不需要 GPU 就能回答它。下面的单元会调用 `NCCL_HOME` 或 `$HOME/opt/nccl` 中那个库
# （如果有）的 `ncclGetVersion`。

# %%
import ctypes

nccl_lib = Path(os.environ.get("NCCL_HOME", Path.home() / "opt" / "nccl")) / "lib" / "libnccl.so"
if nccl_lib.exists():
    version = ctypes.c_int()
    ctypes.CDLL(str(nccl_lib)).ncclGetVersion(ctypes.byref(version))  # no GPU needed
    print(nccl_lib, "-> ncclGetVersion:", version.value)
else:
    print("No", nccl_lib, "here: build it with the commands above (or set NCCL_HOME).")

# %% [markdown] lang="en"
# On a GPU machine, `all_reduce_perf` prints per size `algbw` (bytes / time) and `busbw`
# (`algbw * 2(n-1)/n` for all-reduce: the traffic each link really carries, comparable to
# the hardware bandwidth):

# %% [markdown] lang="zh"
# 在 GPU 机器上，`all_reduce_perf` 对每个数据量打印 `algbw`（字节数 / 时间）和 `busbw`：对全归约
# （all-reduce）而言 `busbw` 是 `algbw * 2(n-1)/n`，即每条链路实际承载的流量，可以直接与硬件
# 带宽比较：

# %%
def busbw(algbw_gbs, n):
    """nccl-tests' bus bandwidth of all-reduce on n ranks."""
    return algbw_gbs * 2 * (n - 1) / n


print("algbw 100 GB/s on 8 GPUs -> busbw", busbw(100, 8), "GB/s")


# %% [markdown] lang="en"
# The driver, the toolkit and the runtime are three different things, and a build shows it.
# The cell below compiles a small CUDA program for one architecture (sm_90) with the `nvcc`
# it finds (`CUDA_HOME`, the pip wheels in this environment, then `PATH`) and runs it, GPU or
# not. `runtime` is the CUDA runtime the toolkit linked into the program (13000 means 13.0);
# `driver` is what `libcuda` says, 0 when there is none (`cudaDriverGetVersion` in the CUDA
# Runtime API); without a driver, asking for devices fails with
# `cudaErrorInsufficientDriver`. The program is `cc.PROBE_CU`; it prints 0 for the driver
# here and the driver's CUDA version (for example 12080) on a GPU machine.

# %% [markdown] lang="zh"
# 驱动、工具包和运行时是三样不同的东西，编译一次就能看出来。下面的单元用它找到的 `nvcc`
# （依次是 `CUDA_HOME`、本环境里的 pip wheel、`PATH`）为一种架构（sm_90）编译一个小 CUDA
# 程序并运行它，有没有 GPU 都可以。`runtime` 是工具包链接进程序的 CUDA 运行时（13000 表示
# 13.0）；`driver` 是 `libcuda` 报告的版本，没有驱动时为 0（CUDA Runtime API 的
# `cudaDriverGetVersion`）；没有驱动时，查询设备会失败，错误是 `cudaErrorInsufficientDriver`。
# 这个程序就是 `cc.PROBE_CU`；在这里它报告的驱动版本是 0，在 GPU 机器上则是驱动支持的 CUDA
# 版本（例如 12080）。

# %%
import tempfile

nvcc = cc.find_nvcc()
if nvcc is None:
    print("No nvcc here. On 2026-11-25, with nvcc 13.0 from the pip wheels and no driver:")
    print("Probe(nvcc='.../nvidia/cu13/bin/nvcc', runtime=13000, driver=0, devices=-1, "
          "device_error='cudaErrorInsufficientDriver')")
else:
    with tempfile.TemporaryDirectory() as tmp:
        print(cc.probe_runtime_driver(nvcc, Path(tmp)))

# %% [markdown] lang="en"
# #### Making torch use your NCCL
#
# A CUDA build of torch from PyPI loads the `libnccl.so.2` of its `nvidia-nccl-cu13` wheel
# (`site-packages/nvidia/nccl/lib`), and `LD_LIBRARY_PATH` does not change that, for two
# reasons. `import torch` opens the wheel's copy by its full path (`_preload_cuda_deps`,
# called from `_load_global_deps` in `torch/__init__.py` once `libcudart` is loaded), and a
# library loaded under the name `libnccl.so.2` answers every later request for that name.
# And `torch/lib/libtorch_cuda.so`, which needs `libnccl.so.2`, carries a `DT_RPATH` starting
# with `$ORIGIN/../../nvidia/cudnn/lib:$ORIGIN/../../nvidia/nvshmem/lib:$ORIGIN/../../nvidia/nccl/lib`
# (read with `readelf -d` from the torch 2.13.0 wheel), which the dynamic loader searches
# *before* `LD_LIBRARY_PATH` (`man ld.so`). `LD_PRELOAD` comes before both: the library it
# names is loaded first, holds the name `libnccl.so.2`, and torch's calls go to it; the
# wheel's copy is still mapped, unused.
#
# `torch.cuda.nccl.version()` cannot tell you which one runs: it returns `NCCL_MAJOR`,
# `NCCL_MINOR` and `NCCL_PATCH` of the `nccl.h` that torch was compiled with, constants
# (`version()` in `torch/csrc/cuda/nccl.cpp`). Ask the library instead: `dlopen` by the name
# `libnccl.so.2` returns the copy already loaded under that name, the one torch is bound to.
# Two stand-in libraries with the same name and a third that needs it show all of this on
# this machine (`docs/nccl-build.md`); with torch it needs a CUDA build (no GPU), not run
# here:
#
# ```bash
# LD_PRELOAD=$HOME/opt/nccl/lib/libnccl.so.2 python -c "
# import ctypes, torch
# v = ctypes.c_int(); ctypes.CDLL('libnccl.so.2').ncclGetVersion(ctypes.byref(v))
# print(v.value, torch.cuda.nccl.version())"
# # expected: 23007 (your 2.30.7 runs), then the nccl.h version torch was compiled with
# ```
#
# The memory-map cell earlier in this chapter then lists both files; `strings FILE | grep
# '^NCCL version'` tells each file's version without loading it (`VERSION_STRING` in NCCL's
# `src/init.cc`, kept whole for that purpose). With GPUs,
# `NCCL_DEBUG=INFO` prints the version of the NCCL that runs when the first communicator
# starts.

# %% [markdown] lang="zh"
# #### 让 torch 使用你编译的 NCCL
#
# PyPI 上的 CUDA 版 torch 会加载它的 `nvidia-nccl-cu13` wheel 里的 `libnccl.so.2`
# （`site-packages/nvidia/nccl/lib`），`LD_LIBRARY_PATH` 改变不了这一点，原因有两个。
# `import torch` 会按完整路径打开 wheel 里的那一份（`torch/__init__.py` 中的
# `_preload_cuda_deps`，在 `libcudart` 加载之后由 `_load_global_deps` 调用），而一个库一旦以
# `libnccl.so.2` 这个名字加载，之后凡是按这个名字请求的，拿到的都是它。此外，需要
# `libnccl.so.2` 的 `torch/lib/libtorch_cuda.so` 带有 `DT_RPATH`，开头是
# `$ORIGIN/../../nvidia/cudnn/lib:$ORIGIN/../../nvidia/nvshmem/lib:$ORIGIN/../../nvidia/nccl/lib`
# （用 `readelf -d` 从 torch 2.13.0 的 wheel 中读出），动态加载器会*先于* `LD_LIBRARY_PATH`
# 搜索它（`man ld.so`）。`LD_PRELOAD` 比这两者都早：它指定的库最先加载，占住 `libnccl.so.2`
# 这个名字，torch 的调用都会进入它；wheel 里的那一份仍然映射在进程里，但不会被用到。
#
# `torch.cuda.nccl.version()` 回答不了实际运行的是哪一份：它返回的是 torch 编译时所用
# `nccl.h` 中的 `NCCL_MAJOR`、`NCCL_MINOR` 和 `NCCL_PATCH`，是常量（见
# `torch/csrc/cuda/nccl.cpp` 的 `version()`）。要问库本身：按 `libnccl.so.2` 这个名字
# `dlopen`，得到的就是已经以这个名字加载的那一份，也就是 torch 绑定的那一份。用两个同名的
# 替身库和一个依赖它的库，可以在本机演示以上全部内容（见 `docs/nccl-build.md`）；换成 torch
# 则需要 CUDA 版（不需要 GPU），这里没有运行：
#
# ```bash
# LD_PRELOAD=$HOME/opt/nccl/lib/libnccl.so.2 python -c "
# import ctypes, torch
# v = ctypes.c_int(); ctypes.CDLL('libnccl.so.2').ncclGetVersion(ctypes.byref(v))
# print(v.value, torch.cuda.nccl.version())"
# # expected: 23007 (your 2.30.7 runs), then the nccl.h version torch was compiled with
# ```
#
# 这时本章前面那个读内存映射的单元会列出两个文件；`strings 文件 | grep '^NCCL version'`
# 不用加载就能看出每个文件的版本（NCCL `src/init.cc` 中的 `VERSION_STRING`，特意保留为完整的
# 字符串）。有 GPU 时，`NCCL_DEBUG=INFO` 会在第一个
# 通信器启动时打印实际运行的 NCCL 的版本。

# %% [markdown] lang="en"
# ## Where PyTorch looks for CUDA when it builds extensions
#
# `torch.utils.cpp_extension` uses `CUDA_HOME`, else `CUDA_PATH`, else the folder above the
# `nvcc` found on `PATH`, else `/usr/local/cuda`. A conda toolkit (`conda install
# cuda-toolkit`) puts `nvcc` in `$CONDA_PREFIX/bin`, so the folder is found, but its CUDA
# 12+ packages put the headers in `$CONDA_PREFIX/targets/x86_64-linux/include`, not in
# `include/`. torch adds only `CUDA_HOME/include` and the folder in `CUDA_INC_PATH`
# (`include_paths` in `torch/utils/cpp_extension.py`), so set
# `CUDA_INC_PATH=$CONDA_PREFIX/targets/x86_64-linux/include`; `ddp-lab doctor` says so when it
# sees that layout (seeing it needs a conda toolkit; not run here).
# A trap the course's reference machine showed: a wrapper script `/usr/local/bin/nvcc` made
# the guess `/usr/local`, which has no CUDA headers. The cell shows what *your* machine gives
# (without `nvcc` on `PATH`: `/usr/local/cuda` where that exists, else `None`).

# %% [markdown] lang="zh"
# ## PyTorch 编译扩展时去哪里找 CUDA
#
# `torch.utils.cpp_extension` 依次使用 `CUDA_HOME`、`CUDA_PATH`、`PATH` 上找到的 `nvcc` 的
# 上两级目录，最后是 `/usr/local/cuda`。用 conda 安装的工具包（`conda install cuda-toolkit`）
# 把 `nvcc` 放在 `$CONDA_PREFIX/bin`，所以能找到工具包目录；但 CUDA 12 及以后的 conda 包把头文件放在
# `$CONDA_PREFIX/targets/x86_64-linux/include`，而不是 `include/`。torch 只加入
# `CUDA_HOME/include` 和 `CUDA_INC_PATH` 指定的目录（`torch/utils/cpp_extension.py` 的
# `include_paths`），所以要设置 `CUDA_INC_PATH=$CONDA_PREFIX/targets/x86_64-linux/include`；
# `ddp-lab doctor` 看到这种布局时会给出这条建议（要看到这种布局需要 conda 安装的工具包，
# 这里没有运行）。
# 课程的参考机器上出现过一个陷阱：包装脚本 `/usr/local/bin/nvcc` 让 torch 猜成
# `/usr/local`，而那里没有 CUDA 头文件。下面的单元显示*你的*机器会得到什么（`PATH` 上没有
# `nvcc` 时：`/usr/local/cuda` 存在就用它，否则是 `None`）。

# %%
from ddp_lab.tools.doctor import find_cuda_home

nvcc_path = shutil.which("nvcc")
home = find_cuda_home(dict(os.environ), nvcc_path)
print("nvcc on PATH:", nvcc_path, "-> CUDA home torch would use:", home)
if home:
    print("has include/cuda_runtime.h:", os.path.exists(os.path.join(home, "include", "cuda_runtime.h")))
print("with CUDA_HOME=/usr/local/cuda-12.1:",
      find_cuda_home({"CUDA_HOME": "/usr/local/cuda-12.1"}, nvcc_path))

# %% [markdown] lang="en"
# ## Installing a matching torch build
#
# Pick a wheel index whose CUDA is **<=** the "CUDA Version" of `nvidia-smi` (for example
# `pip install torch --index-url https://download.pytorch.org/whl/cu128`), or the CPU build
# (`.../whl/cpu`) on a machine without a GPU. Each index holds only the releases built for
# that CUDA: `cu121` stops at torch 2.5 (the "Release Compatibility Matrix" in PyTorch's
# `RELEASE.md` lists CUDA 12.1 up to 2.5 and not after), so an old driver pins you to an old
# torch (or, within one major, minor version compatibility lets a newer index run with a
# warning). Old tutorials pin `torch==1.10.1+cu102` and claim "torch >= 1.9 is unstable":
# that claim comes from one elastic-agent warning ("Received 1 death signal"), which only
# says a worker was stopped. Use a current release.
#
# `bash setup.sh` reads two variables: `TORCH_INDEX_URL` (where torch comes from, e.g. the
# CPU wheels on a laptop without a GPU) and `PIP_INDEX_URL` (every other package, e.g. a
# PyPI mirror). Readers in mainland China, where the multi-GB CUDA wheels and GitHub clones
# are often slow, find mirrors and how to choose them in the README's "No GPU, or a slow
# network" section.

# %% [markdown] lang="zh"
# ## 安装匹配的 torch
#
# 选择 CUDA 版本**不高于** `nvidia-smi` 表头“CUDA Version”的 wheel 索引（例如
# `pip install torch --index-url https://download.pytorch.org/whl/cu128`），没有 GPU 的机器用
# CPU 版本（`.../whl/cpu`）。每个索引只收录为该 CUDA 编译的版本：`cu121` 最高到 torch 2.5
# （PyTorch 的 `RELEASE.md` 里的“Release Compatibility Matrix”中，CUDA 12.1 只列到 2.5），
# 所以旧驱动会把你限制在旧的 torch 上（在同一主版本内，也可以借助小版本兼容使用更新的索引，
# 只是会有警告）。一些旧教程固定使用 `torch==1.10.1+cu102`，并说“torch >= 1.9 不稳定”：这个
# 说法只来自一条弹性代理（elastic agent）的警告（“Received 1 death signal”），它只表示某个
# worker 被停止了。请使用当前的稳定版。
#
# `bash setup.sh` 读取两个变量：`TORCH_INDEX_URL`（torch 从哪里装，例如没有 GPU 的笔记本
# 电脑用 CPU 版 wheel）和 `PIP_INDEX_URL`（其余所有包，例如 PyPI 镜像）。在中国大陆，数 GB
# 的 CUDA 版 wheel 和 GitHub 克隆往往很慢，甚至中断：镜像站的选择和用法见 README 的
# “没有 GPU，或网络较慢”一节。

# %% [markdown] lang="en"
# ## `ddp-lab doctor`: everything in one report
#
# In a terminal run `ddp-lab doctor` (or `ddp-lab doctor --json`). In a notebook:

# %% [markdown] lang="zh"
# ## `ddp-lab doctor`：一份报告看全部
#
# 在终端运行 `ddp-lab doctor`（或 `ddp-lab doctor --json`）。在 notebook 中：

# %%
report = doctor()
print(report)

# %% [markdown] lang="en"
# The same checks on situations this machine cannot produce, from stored outputs: a driver
# that is too old for a CUDA 12.1 build, and a broken driver after an upgrade without reboot.

# %% [markdown] lang="zh"
# 用保存的输出检查这台机器无法产生的情况：驱动对 CUDA 12.1 版本的 torch 来说太旧，
# 以及升级驱动后没有重启导致的驱动故障。

# %%
from dataclasses import replace

from ddp_lab.tools.doctor import analyse, gather

facts = gather()
for name in ["470.82.01_cuda11.4_a100.txt", "nvml_mismatch.txt"]:
    fake = replace(facts, torch_cuda="12.1", nvidia_smi=(FIXTURES / "nvidia-smi" / name).read_text())
    for f in analyse(fake):
        if f.key in ("driver", "driver_vs_torch") and f.level != "ok":
            print(f"[{f.level}] {f.key}: {f.value}\n    -> {f.fix}")

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise: can this setup run this torch build? (3 points)
#
# Write `diagnose(nvidia_smi, nvcc_v, torch_build)`. It receives the text printed by
# `nvidia-smi` and by `nvcc -V`, and a torch version such as `"2.5.1+cu121"` or
# `"2.5.1+cpu"`. Return a tuple `(level, change)`:
#
# - CPU build: `("ok", "nothing")` without a working driver, `("warning", "torch")` with one.
# - CUDA build and no working driver: `("problem", "driver")`.
# - Driver too old: `("problem", "driver")`, or `("warning", "driver")` when minor version
#   compatibility lets it run (use `cc.check_driver_runtime`).
# - Otherwise compare `nvcc` with torch's CUDA (`cc.check_nvcc_torch`): a different major
#   gives `("warning", "toolkit")`; everything else `("ok", "nothing")`.
#
# The parsers `cc.parse_nvidia_smi`, `cc.parse_nvcc` and `cc.parse_torch_cuda` help.
# Compare versions as numbers, never as text.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习：这套环境能运行这个 torch 吗？（3 分）
#
# 编写 `diagnose(nvidia_smi, nvcc_v, torch_build)`。它接收 `nvidia-smi` 和 `nvcc -V` 打印的
# 文本，以及一个 torch 版本，例如 `"2.5.1+cu121"` 或 `"2.5.1+cpu"`。返回元组
# `(level, change)`：
#
# - CPU 版本：没有可用驱动时返回 `("ok", "nothing")`，有驱动时返回 `("warning", "torch")`。
# - CUDA 版本但没有可用驱动：`("problem", "driver")`。
# - 驱动太旧：`("problem", "driver")`；若小版本兼容使其可以运行，则返回
#   `("warning", "driver")`（使用 `cc.check_driver_runtime`）。
# - 否则比较 `nvcc` 与 torch 的 CUDA（`cc.check_nvcc_torch`）：主版本不同返回
#   `("warning", "toolkit")`；其余情况返回 `("ok", "nothing")`。
#
# 可以使用解析函数 `cc.parse_nvidia_smi`、`cc.parse_nvcc` 和 `cc.parse_torch_cuda`。
# 版本要按数字比较，不要按文本比较。

# %% tags=["exercise"]
def diagnose(nvidia_smi: str, nvcc_v: str, torch_build: str) -> tuple[str, str]:
    ### BEGIN SOLUTION
    torch_cuda = cc.parse_torch_cuda(torch_build)
    smi = cc.parse_nvidia_smi(nvidia_smi)
    has_driver = smi is not None and not smi.error
    if torch_cuda is None:
        return ("warning", "torch") if has_driver else ("ok", "nothing")
    if not has_driver:
        return ("problem", "driver")
    v = cc.check_driver_runtime(smi.driver, torch_cuda)
    if v.level != "ok":
        return (v.level, v.change)
    n = cc.check_nvcc_torch(cc.parse_nvcc(nvcc_v), torch_cuda)
    return (n.level, n.change)
    ### END SOLUTION


# %% tags=["exercise"]
print(diagnose((FIXTURES / "nvidia-smi" / "525.60.13_cuda12.0_a100.txt").read_text(),
               (FIXTURES / "nvcc" / "11.8.txt").read_text(), "2.5.1+cu124"))

# %% tags=["grade"] grade_id="01.diagnose" points=3
dl.grade("01.diagnose", diagnose)

# %% [markdown] lang="en"
# ## What next
#
# Chapter 02 starts several processes and gives each one its rank.

# %% [markdown] lang="zh"
# ## 接下来
#
# 第 02 章会启动多个进程，并给每个进程分配 rank（进程编号）。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`01.concepts`,
# 2 points when all are right).
#
# **1.** `nvidia-smi` says "CUDA Version: 12.0" (driver 525.60.13), `nvcc -V` says 11.8, and torch is `2.5.1+cu124`. Which CUDA runtime does torch run its kernels with?
#
# - (a) 11.8, the toolkit's
# - (b) none: torch cannot start CUDA here
# - (c) 12.0, the driver's
# - (d) 12.4, the runtime the wheel bundles, on this driver by minor version compatibility
#
# **2.** On that same machine (a 12.4 runtime on a 12.0 driver), what does *not* work?
#
# - (a) code that the newer toolkit shipped only as PTX, which the old driver would have to JIT-compile
# - (b) `torch.cuda.is_available()`
# - (c) `nvidia-smi`
# - (d) any CUDA kernel at all
#
# **3.** A GPU's compute capability is missing from `torch.cuda.get_arch_list()`, and there is no PTX for it. The first kernel fails with "no kernel image is available". What fixes it?
#
# - (a) a torch wheel built for that architecture
# - (b) installing a CUDA toolkit with `nvcc`
# - (c) a newer driver
# - (d) `CUDA_DEVICE_ORDER=PCI_BUS_ID`
#
# **4.** A machine has two different GPU models. Is torch's `cuda:0` the GPU that `nvidia-smi` lists as GPU 0?
#
# - (a) always
# - (b) never
# - (c) not necessarily: CUDA numbers the fastest GPU first by default, `nvidia-smi` by PCI bus; `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes them agree
# - (d) only inside a container


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`01.concepts`，全部答对得 2 分）。
#
# **1.** `nvidia-smi` 显示“CUDA Version: 12.0”（驱动 525.60.13），`nvcc -V` 显示 11.8，torch 是 `2.5.1+cu124`。torch 用哪个 CUDA 运行时来运行它的核函数？
#
# - (a) 11.8，工具包的
# - (b) 都不是：torch 在这里无法启动 CUDA
# - (c) 12.0，驱动的
# - (d) 12.4，wheel 自带的运行时；靠次版本兼容在这个驱动上运行
#
# **2.** 还是那台机器（12.4 运行时配 12.0 驱动），下面哪一项*不能*工作？
#
# - (a) 新工具包只以 PTX 形式提供、需要旧驱动即时编译的代码
# - (b) `torch.cuda.is_available()`
# - (c) `nvidia-smi`
# - (d) 任何 CUDA 核函数都不行
#
# **3.** 某块 GPU 的计算能力不在 `torch.cuda.get_arch_list()` 里，也没有对应的 PTX。第一个核函数就报 `no kernel image is available`。怎么修？
#
# - (a) 换一个为这个架构编译的 torch wheel
# - (b) 安装带 `nvcc` 的 CUDA 工具包
# - (c) 更新驱动
# - (d) `CUDA_DEVICE_ORDER=PCI_BUS_ID`
#
# **4.** 一台机器上有两种不同型号的 GPU。torch 的 `cuda:0` 是 `nvidia-smi` 列出的 GPU 0 吗？
#
# - (a) 总是
# - (b) 从不
# - (c) 不一定：CUDA 默认把最快的 GPU 排在前面，`nvidia-smi` 按 PCI 总线排序；设 `CUDA_DEVICE_ORDER=PCI_BUS_ID` 可以让两者一致
# - (d) 只在容器里才是


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: "d",  # a letter
    2: "a",  # a letter
    3: "a",  # a letter
    4: "c",  # a letter
    ### END ANSWERS
}
dl.quiz("01", my_answers)


# %% tags=["grade"] grade_id="01.concepts" points=2
dl.grade("01.concepts", my_answers)
