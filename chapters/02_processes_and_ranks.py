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
#       en: "02 Processes, ranks and the words of distributed training"
#       zh: "02 进程、rank 与分布式训练的基本术语"
# ---

# %% [markdown] lang="en"
# # 02 Processes, ranks and the words of distributed training
#
# **Why parallelise?** Either the model does not fit on one device (split the *model*:
# **model parallel**), or one device is too slow for the data you need per step (split the
# *batch*: **data parallel**, each **replica** sees a part of the batch and the gradients
# are averaged). `DataParallel` (DP) does data parallelism with *threads* in one process;
# `DistributedDataParallel` (DDP) uses one *process* per replica. DDP has two usage modes:
# one GPU per process (`device_ids=[local_rank]`, the recommended one), and one model spread
# over several devices per process (`device_ids=None`: DDP combined with model parallelism,
# for models too big for a GPU). A third mode, several GPUs per process each holding a copy,
# is gone: `DDP(model, device_ids=[0, 1])` raises `ValueError: device_ids can only be None or
# contain a single element` (`torch/nn/parallel/distributed.py`, `__init__`; the error came
# with PyTorch 1.9, pytorch/pytorch#54454 "Error out SPMD mode"). The cells below show the
# error, on CPU too, and the second mode.
#
# A claim often met in notes and blog posts: "DP uses threads, and so does DDP". DDP uses
# **processes**, and the reason is the GIL, which we now measure.

# %% [markdown] lang="zh"
# # 02 进程、rank 与分布式训练的基本术语
#
# **为什么要并行**？要么模型在一个设备上放不下，这时切分*模型*，即**模型并行**（model
# parallelism）；要么一个设备处理每步所需的数据太慢，这时切分*批*，即**数据并行**（data
# parallelism）：每个**副本**（replica）处理批的一部分，再对梯度求平均。
# `DataParallel`（DP）在一个进程里用*线程*做数据并行；`DistributedDataParallel`（DDP）为每个
# 副本使用一个*进程*。DDP 有两种用法：每个进程一块 GPU（`device_ids=[local_rank]`，推荐）；
# 每个进程把一个模型分布在多个设备上（`device_ids=None`：DDP 与模型并行结合，用于单卡放不下
# 的模型）。第三种用法（每个进程多块 GPU、每块放一份副本）已经被移除：
# `DDP(model, device_ids=[0, 1])` 会抛出 `ValueError: device_ids can only be None or contain a
# single element`（`torch/nn/parallel/distributed.py` 的 `__init__`；这个报错从 PyTorch 1.9
# 开始出现，见 pytorch/pytorch#54454）。下面的单元展示这个错误（在 CPU
# 上也会报错）以及第二种用法。
#
# 网上常见一种说法：“DP 使用多线程，DDP 也使用多线程”。其实 DDP 使用的是**多进程**，原因在于
# GIL；下面实际测一测。

# %%
import os
import threading
import time

import matplotlib.pyplot as plt
import torch

import ddp_lab as dl
from ddp_lab.tools import ranks

dl.setup()
print("CPU cores:", os.cpu_count())


# %%
def ddp_modes(rank):
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    try:
        DDP(nn.Linear(2, 2), device_ids=[0, 1])  # the removed "copies on several GPUs" mode
    except ValueError as err:
        print("device_ids=[0, 1]:", err)
    if torch.cuda.device_count() >= 2:
        # Mode 2: one model over two GPUs (a ToyMpModel), device_ids=None.
        net = nn.Sequential(nn.Linear(4, 8).to("cuda:0"), nn.Linear(8, 2).to("cuda:1"))
        net.forward = lambda x: net[1](net[0](x.to("cuda:0")).to("cuda:1"))
        model = DDP(net, device_ids=None)
        print("model over cuda:0 and cuda:1 wrapped, output on", model(torch.randn(3, 4)).device)
    else:
        # The same rule without GPUs: a module that is not on one CUDA device needs None.
        DDP(nn.Linear(2, 2), device_ids=None)
        print("CPU module with device_ids=None: fine; a model over 2 GPUs needs 2 GPUs "
              f"(found {torch.cuda.device_count()}), so mode 2 is not run here.")


dl.spawn(ddp_modes, nprocs=1, backend="gloo");

# %% [markdown] lang="en"
# ## Threads vs processes, measured
#
# Two equal jobs, run one after the other, in two threads, and in two processes
# (`dl.spawn`; `ranks.timed_in_processes` starts the clock in the ranks once both are up,
# so starting them, about a second, is not counted). Pure-Python work holds the GIL, so threads take turns; torch operations
# release the GIL while they compute, so threads do run in parallel there. Each job limits
# torch to one thread so that only *our* parallelism is measured.

# %% [markdown] lang="zh"
# ## 线程与进程：实际测量
#
# 两个相同的任务，分别顺序执行、用两个线程执行、用两个进程（`dl.spawn`）执行。
# `ranks.timed_in_processes` 在两个 rank 都启动之后才在 rank 内部开始计时，所以启动进程的
# 时间（约一秒）不计在内。纯 Python
# 计算会一直持有 GIL，所以线程只能轮流运行；torch 运算在计算时会释放 GIL，所以线程在这里
# 真的可以并行。每个任务都把 torch 限制为单线程，这样测到的只是*我们自己*的并行。

# %%
def python_job(_=None):
    total = 0
    for i in range(2_400_000):
        total += i * i % 7
    return total


def torch_job(_=None):
    torch.set_num_threads(1)
    a = torch.randn(384, 384)
    for _ in range(100):
        a = torch.tanh(a @ a / 384)
    return float(a.sum())


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def in_threads(job):
    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


threads_before = torch.get_num_threads()
results = {}
for name, job in [("pure Python", python_job), ("torch ops", torch_job)]:
    torch.set_num_threads(1)
    results[name] = {
        "sequential": timed(lambda: [job(), job()]),
        "2 threads": timed(lambda: in_threads(job)),
        # timed inside the 2 ranks, between barriers: their start-up is not counted
        "2 processes": ranks.timed_in_processes(job, nprocs=2),
    }
torch.set_num_threads(threads_before)
for name, r in results.items():
    print(name, {k: f"{v:.2f} s" for k, v in r.items()},
          "| speed-up threads x%.2f, processes x%.2f"
          % (r["sequential"] / r["2 threads"], r["sequential"] / r["2 processes"]))

# %%
fig, ax = plt.subplots(figsize=(6, 3))
modes = ["sequential", "2 threads", "2 processes"]
for i, (name, r) in enumerate(results.items()):
    ax.bar([j + 0.38 * i for j in range(3)], [r[m] for m in modes], width=0.36,
           label=tr_name if (tr_name := dl.tr(en=name, zh={"pure Python": "纯 Python",
                                                              "torch ops": "torch 运算"}[name])) else name)
ax.set_xticks([j + 0.19 for j in range(3)],
              [dl.tr(en=m, zh={"sequential": "顺序", "2 threads": "2 个线程",
                               "2 processes": "2 个进程"}[m]) for m in modes])
ax.set_ylabel(dl.tr(en="seconds (lower is better)", zh="秒（越低越好）"))
ax.set_title(dl.tr(en="Two equal jobs on this machine", zh="本机上的两个相同任务"))
ax.legend()
plt.show()

# %% [markdown] lang="en"
# Read your numbers: pure Python in threads is no faster than sequential (the GIL), while
# processes approach 2x on 2 free cores; torch ops gain in threads too. The common claim
# "one Python process can only use one CPU core" is therefore too strong: native code that
# releases the GIL (torch kernels, NCCL calls) uses many cores from one process. DP still
# suffers, because its Python code (scatter, replicate, gather) runs under the GIL.

# %% [markdown] lang="zh"
# 看看你测出来的数字：线程中的纯 Python 并不比顺序执行快（GIL 的缘故），而在 2 个空闲核上
# 进程接近 2 倍；torch 运算在线程中也能加速。因此常见的“一个 Python 进程只能用一个 CPU 核”的说法
# 过于绝对：释放 GIL 的原生代码（torch 算子、NCCL 调用）可以在一个进程里使用多个核。
# DP 仍然吃亏，因为它的 Python 代码（`scatter`、`replicate`、`gather`）在 GIL 下运行。

# %% [markdown] lang="en"
# ## world size, rank, local rank, node
#
# A launch runs on `nnodes` **nodes** with `nproc_per_node` processes each. The **world
# size** is the number of processes; each has a **rank** (0 to `world_size - 1`, an identity,
# not a priority) and a **local rank** (its index on its node, used to pick its GPU).
# The processes form the default **process group**; they meet at `MASTER_ADDR:MASTER_PORT`
# (the **rendezvous**). `torch.distributed.local_rank()`, which some tutorials call, does
# not exist: the launcher gives `LOCAL_RANK` in the environment.

# %% [markdown] lang="zh"
# ## world size、rank、本地 rank、节点
#
# 一次启动在 `nnodes` 个**节点**（node）上运行，每个节点 `nproc_per_node` 个进程。
# **world size**（进程总数）即参与这次任务的进程数；每个进程有一个 **rank**（进程编号，0 到
# `world_size - 1`，是身份，不是
# 优先级）和一个**本地 rank**（local rank，它在本节点上的编号，用来选择 GPU）。这些进程组成默认的
# **进程组**（process group），在 `MASTER_ADDR:MASTER_PORT` 会合（rendezvous）。有些教程里
# 调用的 `torch.distributed.local_rank()` 并不存在：启动器通过环境变量 `LOCAL_RANK` 提供本地 rank。

# %%
print("torch.distributed has local_rank():", hasattr(torch.distributed, "local_rank"))
dl.show_source(ranks.assign)

# %% [markdown] lang="en"
# Move the sliders. `CUDA_VISIBLE_DEVICES=4,5,6,7` with 4 processes per node puts local
# rank 0 on physical GPU 4; with 8 processes (a mistake easy to make when copying a
# launch line) local ranks 4-7 get no GPU at all.

# %% [markdown] lang="zh"
# 拖动滑块试试。`CUDA_VISIBLE_DEVICES=4,5,6,7` 且每节点 4 个进程时，本地 rank 0 使用物理
# GPU 4；如果每节点 8 个进程（照抄启动命令时很容易犯的错误），本地 rank 4～7 根本没有 GPU。

# %%
ranks.rank_table_widget(nnodes=2, nproc_per_node=4, gpus_per_node=8);

# %%
for p in ranks.assign(8, nnodes=1, cuda_visible_devices="4,5,6,7", gpus_per_node=8)[3:6]:
    print(p)

# %% [markdown] lang="en"
# ## What torchrun really does
#
# We start two torchrun agents on this machine, each pretending to be a node, with
# `--rdzv-backend=c10d` and a free port. Note `--node_rank`: with the c10d rendezvous it is
# **ignored**, and the rendezvous numbers the nodes itself (see `GROUP_RANK`). Nodes may
# even have different sizes.

# %% [markdown] lang="zh"
# ## torchrun 实际做了什么
#
# 我们在本机启动两个 torchrun 代理，各自扮演一个节点，使用 `--rdzv-backend=c10d` 和一个
# 空闲端口。注意 `--node_rank`：使用 c10d 会合时它会被**忽略**，节点编号由会合过程自己分配
# （见 `GROUP_RANK`）。各节点的进程数甚至可以不同。

# %% tags=["lesson"]
seen = ranks.torchrun_assignment([2, 3], ["1,0", None])
for row in seen:
    print(row)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise: place every process (3 points)
#
# Write `place(nproc_per_node, cuda_visible_devices, gpus_per_node)`: `nproc_per_node` and
# `cuda_visible_devices` are lists with one entry per node, in node-rank order (an entry
# of `cuda_visible_devices` is a string or `None` for unset). Return one dict per process,
# in global rank order, with keys `rank`, `local_rank`, `node_rank`, `world_size`,
# `device` (`"cuda:<local rank>"`, or `None` when no GPU is visible for it) and `gpu` (the
# physical GPU index, or `None`). CUDA's rule: unset shows all GPUs; the list stops at the
# first invalid entry. The graded cell compares you with a real torchrun launch.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习：推算每个进程的 rank 与 GPU（3 分）
#
# 编写 `place(nproc_per_node, cuda_visible_devices, gpus_per_node)`：`nproc_per_node` 和
# `cuda_visible_devices` 都是按节点编号顺序、每个节点一项的列表（`cuda_visible_devices` 的
# 每一项是字符串，或表示未设置的 `None`）。按全局 rank 顺序为每个进程返回一个 dict，键为
# `rank`、`local_rank`、`node_rank`、`world_size`、`device`（`"cuda:<本地 rank>"`，没有可见
# GPU 时为 `None`）和 `gpu`（物理 GPU 编号，或 `None`）。CUDA 的规则：未设置时所有 GPU 可见；
# 列表在第一个无效项处截止。评分单元会把你的结果与真实的 torchrun 启动结果比较。

# %% tags=["exercise"]
def place(nproc_per_node, cuda_visible_devices, gpus_per_node):
    ### BEGIN SOLUTION
    world_size = sum(nproc_per_node)
    out, base = [], 0
    for node, (n, cvd) in enumerate(zip(nproc_per_node, cuda_visible_devices)):
        visible = []
        for token in ([] if cvd is None else cvd.split(",")):
            if not token.strip().isdigit() or int(token) >= gpus_per_node:
                break
            visible.append(int(token))
        if cvd is None:
            visible = list(range(gpus_per_node))
        for local in range(n):
            ok = local < len(visible)
            out.append({"rank": base + local, "local_rank": local, "node_rank": node,
                        "world_size": world_size, "device": f"cuda:{local}" if ok else None,
                        "gpu": visible[local] if ok else None})
        base += n
    return out
    ### END SOLUTION


# %% tags=["exercise"]
for row in place([2, 3], ["7,1", None], 8):
    print(row)

# %% tags=["grade"] grade_id="02.place" points=3
dl.grade("02.place", place)

# %% [markdown] lang="en"
# ## What next
#
# Chapter 03 looks inside `nn.DataParallel` (one process, several devices); chapter 04
# makes these processes talk: point-to-point messages and collectives.

# %% [markdown] lang="zh"
# ## 接下来
#
# 第 03 章先看 `nn.DataParallel` 的内部（一个进程、多个设备）；第 04 章让这些进程互相通信：
# 点对点通信和集合通信。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`02.concepts`,
# 2 points when all are right).
#
# **1.** torchrun starts two nodes with 2 and 3 processes (node ranks 0 and 1). What is the global rank of local rank 1 on node 1? (a number)
#
# **2.** With `CUDA_VISIBLE_DEVICES=4,5,6,7` and 4 processes per node, each using `cuda:<local rank>`: which physical GPU does local rank 0 use?
#
# - (a) GPU 7
# - (b) GPU 4
# - (c) GPU 0
# - (d) none
#
# **3.** `CUDA_VISIBLE_DEVICES=1,x,3` on a node with 4 GPUs. Which GPUs can a process see?
#
# - (a) 1 and 3
# - (b) only 1
# - (c) none
# - (d) all four
#
# **4.** Two torchrun agents use `--rdzv-backend=c10d`; you start the first with `--node_rank=1` and the second with `--node_rank=0`. Does the first get `GROUP_RANK` 1?
#
# - (a) torchrun refuses to start
# - (b) both get 0
# - (c) not necessarily: the c10d rendezvous ignores `--node_rank` and numbers the nodes itself
# - (d) yes, always


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`02.concepts`，全部答对得 2 分）。
#
# **1.** torchrun 在两个节点上分别启动 2 个和 3 个进程（节点 rank 为 0 和 1）。节点 1 上 local rank 为 1 的进程，全局 rank 是多少？（填一个数）
#
# **2.** 设置 `CUDA_VISIBLE_DEVICES=4,5,6,7`，每个节点 4 个进程，每个进程用 `cuda:<local rank>`：local rank 0 用的是哪块物理 GPU？
#
# - (a) GPU 7
# - (b) GPU 4
# - (c) GPU 0
# - (d) 没有
#
# **3.** 在有 4 块 GPU 的节点上设置 `CUDA_VISIBLE_DEVICES=1,x,3`。进程能看到哪些 GPU？
#
# - (a) 1 和 3
# - (b) 只有 1
# - (c) 一块都没有
# - (d) 全部 4 块
#
# **4.** 两个 torchrun 代理使用 `--rdzv-backend=c10d`；你给先启动的那个传 `--node_rank=1`，后一个传 `--node_rank=0`。先启动的那个会得到 `GROUP_RANK` 1 吗？
#
# - (a) torchrun 拒绝启动
# - (b) 两个都得到 0
# - (c) 不一定：c10d 会合（rendezvous）忽略 `--node_rank`，自己给节点编号
# - (d) 会，总是这样


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 3,  # a number
    2: "b",  # a letter
    3: "b",  # a letter
    4: "c",  # a letter
    ### END ANSWERS
}
dl.quiz("02", my_answers)


# %% tags=["grade"] grade_id="02.concepts" points=2
dl.grade("02.concepts", my_answers)
