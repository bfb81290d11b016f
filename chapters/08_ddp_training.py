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
#       en: "08 A full DDP training run"
#       zh: "08 一次完整的 DDP 训练"
# ---

# %% [markdown] lang="en"
# # 08 A full DDP training run
#
# Chapter 07 built DDP itself. This chapter uses torch's `DistributedDataParallel` the way
# a real program does, from the first line to a clean shutdown, on a real data set that
# ships with scikit-learn (the 8x8 handwritten digits: nothing to download). The program
# is `ddp_lab/tools/train.py`; you can run it with `torchrun` in a terminal, and this notebook
# runs the very same code through `dl.spawn`. Along the way we check, with running code,
# several claims common in notes and blog posts about DDP; a few of them are wrong.

# %% [markdown] lang="zh"
# # 08 一次完整的 DDP 训练
#
# 第 07 章我们自己实现了 DDP。本章像真实程序那样使用 torch 的 `DistributedDataParallel`：从第
# 一行代码一直到干净地退出，数据集是 scikit-learn 自带的 8×8 手写数字（不用下载）。训练程序是
# `ddp_lab/tools/train.py`：你可以在终端里用 `torchrun` 运行它，本 notebook 则通过 `dl.spawn` 运行完
# 全相同的代码。一路上我们会用可运行的代码检验关于 DDP 的一些常见说法，其中有几条是错的。

# %%
import re
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddp_lab as dl
from ddp_lab.tools import data, train

dl.setup()
workdir = dl.scratch("ch08")  # checkpoints and data of this notebook
print(torch.__version__, "| GPUs:", torch.cuda.device_count())

# %% [markdown] lang="en"
# ## What a real DDP program contains
#
# | step | where | how |
# | --- | --- | --- |
# | start one process per rank | the **launcher** (`torchrun`, `dl.spawn`) | sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` |
# | join the **process group** | `ddp_lab/tools/train.py` | `dist.init_process_group(backend)`, no other arguments |
# | prepare data once per node | `ddp_lab/tools/data.py` | `zero_first()` around the preparation |
# | give each rank its own **shard** | `ddp_lab/tools/train.py` | `DistributedSampler` + `set_epoch(epoch)` |
# | the same initial model, wrapped | `ddp_lab/tools/train.py` | `torch.manual_seed(seed)`, then `DDP(model)` |
# | batch and **learning rate** | `ddp_lab/tools/train.py` | per-rank batch × world size = global batch; LR scaled to it |
# | log the loss of every rank | `ddp_lab/tools/train.py` | `all_reduce` of (sum, count) |
# | evaluate on every rank | `ddp_lab/tools/train.py` | `all_gather`, then drop the sampler's **padding** |
# | progress on rank 0 only | `ddp_lab/tools/train.py` | `Progress(enabled=rank == 0)` |
# | **checkpoint** | `ddp_lab/tools/train_checkpoint.py` | rank 0 saves `model.module.state_dict()`, then `dist.barrier()`; load with `map_location` |
# | resume, shut down | `ddp_lab/tools/train_args.py`, `ddp_lab/tools/train.py` | the `--resume` option; `dist.destroy_process_group()` in `finally` |
#
# `train.py` is also a command-line program (its options are defined in `train_args.py`). Here
# is its `--help`, and the commands that run it on one node and on two nodes:

# %% [markdown] lang="zh"
# ## 一个真实的 DDP 程序包含什么
#
# | 步骤 | 位置 | 做法 |
# | --- | --- | --- |
# | 每个 rank（进程编号）启动一个进程 | **启动器**（launcher，例如 `torchrun`、`dl.spawn`） | 设置 `RANK`、`WORLD_SIZE`、`LOCAL_RANK`、`MASTER_ADDR`、`MASTER_PORT` |
# | 加入**进程组**（process group） | `ddp_lab/tools/train.py` | `dist.init_process_group(backend)`，不需要其他参数 |
# | 每个节点（node）只准备一次数据 | `ddp_lab/tools/data.py` | 用 `zero_first()` 包住准备数据的代码 |
# | 每个 rank 拿到自己的**分片**（shard） | `ddp_lab/tools/train.py` | `DistributedSampler` + `set_epoch(epoch)` |
# | 各 rank 的初始模型相同，再包装 | `ddp_lab/tools/train.py` | `torch.manual_seed(seed)`，然后 `DDP(model)` |
# | 批（batch）与**学习率**（learning rate） | `ddp_lab/tools/train.py` | 每个 rank 的批大小 × world size（进程总数）= 全局批大小；学习率随之缩放 |
# | 记录所有 rank 的损失（loss） | `ddp_lab/tools/train.py` | 对（总和，个数）做 `all_reduce` |
# | 每个 rank 都参与评估 | `ddp_lab/tools/train.py` | `all_gather`，再去掉采样器（sampler）的**填充**（padding） |
# | 只在 rank 0 显示进度 | `ddp_lab/tools/train.py` | `Progress(enabled=rank == 0)` |
# | **检查点**（checkpoint） | `ddp_lab/tools/train_checkpoint.py` | rank 0 保存 `model.module.state_dict()`，然后 `dist.barrier()`；加载时用 `map_location` |
# | 恢复训练、退出 | `ddp_lab/tools/train_args.py`、`ddp_lab/tools/train.py` | `--resume` 选项；在 `finally` 中调用 `dist.destroy_process_group()` |
#
# `train.py` 同时也是命令行程序（它的选项定义在 `train_args.py` 中）。下面是它的 `--help`，以及在一个
# 节点和两个节点上运行它的命令：

# %%
train.make_parser().print_help()
print()
print("# one node, 2 ranks:")
print("torchrun --standalone --nproc_per_node=2 -m ddp_lab.tools.train --checkpoint-dir ckpt")
print("# two nodes (run one line on each machine; ADDR = the first machine's address):")
for node in (0, 1):
    print(f"torchrun --nnodes=2 --node-rank={node} --nproc-per-node=2 "
          "--master-addr=ADDR --master-port=PORT -m ddp_lab.tools.train --checkpoint-dir ckpt")

# %% [markdown] lang="en"
# A common way to parse the local rank is `parser.add_argument("--local_rank", default=-1)`:
# without `type=int` the value is a string, and `torch.cuda.set_device("1")` fails.
# `torchrun` does not pass that argument at all; it sets the `LOCAL_RANK` environment
# variable (only the deprecated `torch.distributed.launch` passes `--local-rank`). And
# `torch.distributed.local_rank()`, also seen in such scripts, does not exist:

# %% [markdown] lang="zh"
# 一种常见写法用 `parser.add_argument("--local_rank", default=-1)` 解析本地 rank（local rank）：没有
# `type=int`，得到的值是字符串，于是 `torch.cuda.set_device("1")` 会出错。而 `torchrun` 根本不
# 传这个参数，它设置的是环境变量 `LOCAL_RANK`（只有已弃用的 `torch.distributed.launch` 才传
# `--local-rank`）。这类脚本里还能见到的 `torch.distributed.local_rank()` 也并不存在：

# %%
import argparse

common_parser = argparse.ArgumentParser()
common_parser.add_argument("--local_rank", default=-1)
print(repr(common_parser.parse_args(["--local_rank", "1"]).local_rank), "<- a str")
print(repr(train.make_parser().parse_args(["--local_rank", "1"]).local_rank), "<- type=int")
print("dist.local_rank exists:", hasattr(dist, "local_rank"))

# %% [markdown] lang="en"
# ## Prepare the data once: the zero-first pattern
#
# When every rank downloads or decodes the data set at the same time, they overwrite each
# other's files. `zero_first` lets local rank 0 do the work while the others wait at a
# **barrier**, then releases them. Each rank calls `dist.barrier()` exactly once: the
# others *before* the body, rank 0 *after* it. The file is written under a temporary name
# and renamed, so two nodes that share a disk cannot corrupt it. The barrier is global, so
# on several nodes every node's local rank 0 does the work, in parallel, and all the other
# ranks wait for all of them.

# %% [markdown] lang="zh"
# ## 只准备一次数据：zero-first 模式
#
# 如果每个 rank 同时下载或解码数据集，它们会互相覆盖对方的文件。`zero_first` 让本地 rank 0 去
# 做这件事，其他 rank 在**屏障**（barrier）处等待，等它做完再放行。每个 rank 恰好调用一次
# `dist.barrier()`：其他 rank 在代码块*之前*调用，rank 0 在代码块*之后*调用。文件先以临时文件
# 名写入再重命名，所以即使两个节点共享同一块磁盘，也不会把它写坏。屏障是全局的：有多个节点
# 时，每个节点的本地 rank 0 同时各做一遍，其余所有 rank 等它们全部做完。

# %%
dl.show_source(data.zero_first)


# %%
def prepare_and_report(rank, folder):
    import time

    start = time.perf_counter()
    train_set, test_set = data.load_digits_split(folder)
    print(f"train {len(train_set)}, test {len(test_set)} samples, "
          f"ready after {time.perf_counter() - start:.2f}s")
    return sorted(p.name for p in Path(folder).iterdir())


print(dl.spawn(prepare_and_report, args=(str(workdir / "data"),), nprocs=2, backend="gloo")[0])

# %% [markdown] lang="en"
# ## A new shuffle every epoch: `set_epoch`
#
# A common observation: with `DistributedSampler` "the order does not change between
# epochs, nor between runs". That is exactly what happens when `sampler.set_epoch(epoch)`
# is missing: the sampler shuffles with `seed + epoch`, and its epoch stays 0. The same order
# on every run is by design (every rank must compute the same permutation); change `seed=`
# to get another one.

# %% [markdown] lang="zh"
# ## 每一轮（epoch）都重新打乱：`set_epoch`
#
# 常见的观察：使用 `DistributedSampler` 时“各轮之间、各次运行之间的顺序都不变”。缺少
# `sampler.set_epoch(epoch)` 时正是这样：采样器用 `seed + epoch` 打乱，而它的 `epoch` 一直是
# 0。每次运行的顺序都相同则是有意的设计（每个 rank 必须算出同一个排列）；想换一种顺序，就改
# `seed=`。

# %%
toy = TensorDataset(torch.arange(10))
for use_set_epoch in (False, True):
    sampler = DistributedSampler(toy, num_replicas=2, rank=0)
    orders = []
    for epoch in range(3):
        if use_set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    print(f"set_epoch={use_set_epoch}: rank 0 reads {orders}")

# %% [markdown] lang="en"
# ## Per-rank batch, global batch and the learning rate
#
# `--batch-size` is per rank: with N ranks one optimizer step sees N times as many samples
# as with one rank, and an epoch has 1/N as many steps. The usual advice scales the learning
# rate linearly (Goyal et al., 2017) and mentions the square-root rule; `train.scaled_lr` does
# both. With k = new batch / old batch, **linear** multiplies the LR by k, which keeps SGD's
# gradient noise scale (about LR × dataset size / batch, Smith and Le 2017) unchanged;
# **sqrt** (Krizhevsky 2014) multiplies it by sqrt(k), which keeps the variance of one update
# (LR squared / batch) unchanged, so the noise falls as the batch grows. In the table only
# the base LR, 0.05, was tuned, for a global batch of 32 (the first row); the other rows
# scale it to their global batch by each rule:

# %% [markdown] lang="zh"
# ## 每个 rank 的批、全局批与学习率
#
# `--batch-size` 是每个 rank 的批大小：有 N 个 rank 时，一次优化器更新看到的样本是一个 rank 时
# 的 N 倍，每轮的步数则是原来的 1/N。常见的建议是按线性规则缩放学习率（Goyal 等，2017），也有
# 人用平方根规则；`train.scaled_lr` 两种都实现了。设 k = 新批大小 / 原批大小：**线性**规则把学习率乘
# 以 k，使 SGD 的梯度噪声尺度（gradient noise scale，约为学习率 × 数据集大小 / 批大小，Smith
# 和 Le，2017）保持不变；**平方根**规则（Krizhevsky，2014）把学习率乘以 sqrt(k)，使单次更新的
# 方差（学习率的平方 / 批大小）保持不变，于是批越大，噪声越小。下表中调好的只有基准学习率
# 0.05，它对应全局批大小 32（第一行）；其余各行按两种规则把它缩放到各自的全局批大小：

# %%
print(f"{'ranks':>5} {'global batch':>12} {'steps/epoch':>11} {'linear lr':>9} {'sqrt lr':>8}")
for n in (1, 2, 4, 8):
    steps = -(-1438 // n // 32)
    print(f"{n:>5} {32 * n:>12} {steps:>11} {train.scaled_lr(0.05, 32 * n, 32, 'linear'):>9.3f}"
          f" {train.scaled_lr(0.05, 32 * n, 32, 'sqrt'):>8.3f}")

# %% [markdown] lang="en"
# The linear rule does not hold at the start of training, when the weights change fast:
# Goyal et al. (2017, section 2.2) needed a **warmup**, the LR rising from the small-batch
# value to k times it over the first 5 epochs, to train ResNet-50 with a batch of 8k;
# without it, the large LR diverges early or ends worse. In torch a warmup is a scheduler,
# e.g. `LinearLR` from 1/k of the scaled LR to all of it (`torch/optim/lr_scheduler.py`):

# %% [markdown] lang="zh"
# 线性规则在训练刚开始、权重变化很快时并不成立：Goyal 等（2017，第 2.2 节）用 8192（8k）的批大
# 小训练 ResNet-50 时，需要**预热**（warmup）：在前 5 轮里把学习率从小批时的值逐步升到它的 k 倍；
# 不预热的话，大学习率会在早期发散，或者最终效果更差。在 torch 里，预热就是一个调度器，例如
# `LinearLR`：从缩放后学习率的 1/k 开始，逐步升到缩放后的学习率
# （`torch/optim/lr_scheduler.py`）：

# %%
k, warmup_steps = 8, 5  # 8 ranks; warm up over 5 steps here (Goyal et al.: 5 epochs)
opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=train.scaled_lr(0.05, 32 * k, 32, "linear"))
warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / k, total_iters=warmup_steps)
lrs = []
for _ in range(warmup_steps + 2):
    lrs.append(round(opt.param_groups[0]["lr"], 4))
    opt.step()
    warmup.step()
print("LR per step:", lrs)

# %% [markdown] lang="en"
# ## The loss to log is the mean over ranks
#
# A common claim in notes and blog posts: "this loss is the sum of every process's loss".
# It is not: each rank
# computes the loss of its own batch only; DDP averages the *gradients*, never the loss value.
# To log the loss of the whole step, all-reduce it. Run it:

# %% [markdown] lang="zh"
# ## 要记录的损失是各 rank 的平均值
#
# 教程和博客里的常见说法：“这个损失是各个进程的损失之和”。并非如此：每个 rank 只计算自己那一批的损失
# ；DDP 平均的是*梯度*，从不平均损失的值。要记录整步的损失，需要对它做全归约
# （all-reduce）。运行看看：

# %% tags=["lesson"]
def local_loss(rank):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 3))
    torch.manual_seed(1 + rank)  # each rank its own batch
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    print(f"local loss {loss.item():.4f}, mean over ranks {logged.item() / 2:.4f}")


dl.spawn(local_loss, nprocs=2, backend="gloo");

# %% [markdown] lang="en"
# A helper often copied is `reduce_value(value, average=True)`, called as
# `reduce_value(loss, world_size)`: `world_size` lands in `average`. It still averages only
# because any non-zero number is true; write `reduce_value(loss, average=True)`.
# `train.mean_across_ranks` all-reduces (sum, count), which also stays right when ranks saw
# different numbers of samples.

# %% [markdown] lang="zh"
# 一个常被照抄的辅助函数是 `reduce_value(value, average=True)`，调用时却写成了
# `reduce_value(loss, world_size)`：`world_size` 落进了 `average` 参数。它仍会求平均，只是因为
# 任何非零数都算作真值；应该写成 `reduce_value(loss, average=True)`。`train.mean_across_ranks` 对（总和，个数）做全归约，即使
# 各 rank 看到的样本数不同，结果也是对的。

# %% [markdown] lang="en"
# ## Evaluation without padding bias
#
# To make the shards equal, `DistributedSampler` repeats the first samples: 5 samples on 4
# ranks become 8 slots. A common evaluation gathers every rank's results with `all_gather`
# and averages them, so the repeated samples count twice. Below, only sample 0 is classified correctly:

# %% [markdown] lang="zh"
# ## 评估时避开填充带来的偏差
#
# 为了让各分片一样大，`DistributedSampler` 会重复开头的样本：5 个样本分给 4 个 rank，变成 8 个
# 位置。常见的评估写法用 `all_gather` 汇总各 rank 的结果再求平均，于是重复的样本算了
# 两次。下面只有样本 0 分类正确：

# %%
five = TensorDataset(torch.arange(5))
correct = torch.tensor([1.0, 0, 0, 0, 0])
shards = [list(DistributedSampler(five, num_replicas=4, rank=r, shuffle=False)) for r in range(4)]
gathered = torch.tensor([i for shard in shards for i in shard])  # what all_gather collects
print("shards:", shards)
print(f"naive mean of the gathered results: {correct[gathered].mean().item():.3f}")
print(f"each sample counted once:           {train.unpadded_mean(gathered, correct[gathered]):.3f}"
      f"  (true accuracy {correct.mean().item():.3f})")

# %% [markdown] lang="en"
# `train.evaluate` gathers each sample's index with its result and counts every index once,
# so the distributed accuracy equals a single-process evaluation (a test checks this on 2 and
# 3 ranks). The digits test set has 359 samples on purpose: 2 or 4 ranks need padding.

# %% [markdown] lang="zh"
# `train.evaluate` 把每个样本的索引和它的结果一起收集，每个索引只计一次，所以分布式算出的准确
# 率与单进程评估完全相同（有一个测试在 2 个和 3 个 rank 上检查了这一点）。数字数据集的测试集特
# 意取了 359 个样本：2 个或 4 个 rank 时都需要填充。

# %%
dl.show_source(train.evaluate)

# %% [markdown] lang="en"
# ## The training run
#
# Now the whole program on 2 ranks, 3 epochs (the command-line default is 10). Only rank 0
# prints its progress bar. The checkpoint goes to a temporary folder.

# %% [markdown] lang="zh"
# ## 完整的训练
#
# 现在在 2 个 rank 上运行整个程序，训练 3 轮（命令行默认是 10 轮）。只有 rank 0 打印进度条。检
# 查点保存在一个临时文件夹里。

# %% tags=["lesson"]
common = ["--threads", "1", "--data-dir", str(workdir / "data")]
ckpt = workdir / "ckpt"
histories = train.launch([*common, "--epochs", "3", "--checkpoint-dir", str(ckpt)], nprocs=2)
h = histories[0]
print("same weights on both ranks:",
      histories[0]["final_weights_sum"] == histories[1]["final_weights_sum"])
print(f"test accuracy {100 * h['test_acc'][-1]:.2f}%, training time {sum(h['epoch_time']):.1f}s")


# %% tags=["lesson"]
def plot_history(history):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
    epochs = range(1, len(history["train_loss"]) + 1)
    ax1.plot(epochs, history["train_loss"], "o-", label=dl.tr(en="train", zh="训练"))
    ax1.plot(epochs, history["test_loss"], "s-", label=dl.tr(en="test", zh="测试"))
    ax1.set(xlabel=dl.tr(en="epoch", zh="轮次（epoch）"), ylabel=dl.tr(en="loss", zh="损失"))
    ax1.legend()
    ax2.plot(epochs, [100 * a for a in history["test_acc"]], "o-")
    ax2.set(xlabel=dl.tr(en="epoch", zh="轮次（epoch）"), ylabel=dl.tr(en="test accuracy (%)",
                                                                  zh="测试准确率（%）"))
    for ax in (ax1, ax2):
        ax.set_xticks(list(epochs))  # whole epochs only
    fig.tight_layout()
    plt.show()


plot_history(h)

# %% [markdown] lang="en"
# ## Checkpoint, `map_location` and resume
#
# Rank 0 alone writes `model.module.state_dict()` (the plain model's weights, without the
# `module.` prefix of the wrapper), then every rank waits at `dist.barrier()`, so nobody
# reads a half-written file. `torch.load(path, map_location=device)` puts the tensors on the
# reading rank's device: without it, tensors saved from `cuda:0` go back to `cuda:0` on
# every rank. Resume loads the weights before `DDP(model)` (its construction broadcasts rank
# 0's weights anyway) and the optimizer's momentum on every rank (nothing broadcasts that).
# Resuming for one more epoch:

# %% [markdown] lang="zh"
# ## 检查点、`map_location` 与恢复训练
#
# 只由 rank 0 写入 `model.module.state_dict()`（未包装模型的权重，不带包装器的 `module.` 前缀
# ），然后所有 rank 在 `dist.barrier()` 处等待，这样谁也不会读到写了一半的文件
# 。`torch.load(path, map_location=device)` 把张量放到读取它的 rank 的设备上：不加它，从
# `cuda:0` 保存的张量在每个 rank 上都会回到 `cuda:0`。恢复训练时，权重在 `DDP(model)` 之前加载
# ：DDP 构造时本来就会广播（broadcast）rank 0 的权重；优化器的动量则每个 rank 都要加载，因为没
# 有任何操作会广播它。再恢复训练 1 轮：

# %% tags=["lesson"]
state = torch.load(ckpt / "last.pt", map_location="cpu", weights_only=True)
print("checkpoint:", sorted(state), "| epoch", state["epoch"],
      "| first keys:", list(state["model"])[:2])
resumed = train.launch([*common, "--epochs", "4", "--checkpoint-dir", str(ckpt), "--resume"],
                       nprocs=2)
plot_history(resumed[0])

# %% [markdown] lang="en"
# On GPUs the same program picks `nccl`, sets `torch.cuda.set_device(LOCAL_RANK)` and loads
# checkpoints with `map_location=cuda:LOCAL_RANK`. This cell runs it when there are at least
# two GPUs:

# %% [markdown] lang="zh"
# 在 GPU 上，同一个程序会选择 `nccl` 后端（backend），调用
# `torch.cuda.set_device(LOCAL_RANK)`，并用 `map_location=cuda:LOCAL_RANK` 加载检查点。至少有
# 两块 GPU 时，下面的单元会真正运行它：

# %% tags=["lesson"]
if torch.cuda.device_count() >= 2:
    gpu = train.launch(["--epochs", "2", "--backend", "nccl", "--data-dir",
                        str(workdir / "data")], nprocs=2)
    print(f"nccl: test accuracy {100 * gpu[0]['test_acc'][-1]:.2f}%")
else:
    print(dl.tr(en="Skipped: no 2 GPUs here. With them this cell trains with backend nccl and "
                   "prints the test accuracy.",
                zh="已跳过：这里没有 2 块 GPU。有 GPU 时，本单元用 nccl 后端训练并打印测试准确率。"))

# %% [markdown] lang="en"
# ## Saving the whole module no longer loads
#
# A common way to save is `torch.save(model.module, path)`: the whole module, pickled. Since
# torch 2.6, `torch.load` defaults to `weights_only=True` (the message in
# `torch/serialization.py` says so), which unpickles tensors, plain containers and numbers
# only, so that a checkpoint cannot run code when it is loaded. A pickled module needs its
# class, so the load fails:

# %% [markdown] lang="zh"
# ## 保存整个模块的文件已经加载不了
#
# 常见的一种保存方式是 `torch.save(model.module, path)`：保存整个模块，也就是把它 pickle 下来。从 torch
# 2.6 起，`torch.load` 的默认值变成了 `weights_only=True`（`torch/serialization.py` 里的提示信
# 息写明了这一点）：它只反序列化张量、普通容器和数字，这样检查点在加载时就无法执行代码。
# pickle 下来的模块要有它的类才能还原，所以加载失败：

# %%
net = torch.nn.Sequential(torch.nn.Linear(4, 2))  # stands for ddp_model.module
torch.save(net, workdir / "whole.pt")
try:
    torch.load(workdir / "whole.pt")
except Exception as err:  # _pickle.UnpicklingError
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines()  # drop the terminal colours
    print(type(err).__name__ + ":", lines[0])
    print("   ", next(line.strip() for line in lines if "Unsupported global" in line))

# %% [markdown] lang="en"
# `weights_only=False` loads it, but only do that for a file you trust: unpickling can run
# any code, and the file also breaks when the class moves or changes. Save the weights
# instead, `model.module.state_dict()` as this chapter's checkpoints do, and rebuild the
# model from code:

# %% [markdown] lang="zh"
# `weights_only=False` 能加载它，但只应对你信任的文件这样做：反序列化可以执行任意代码；而且类
# 一旦移动或修改，这个文件也会失效。应该保存权重，也就是像本章的检查点那样保存
# `model.module.state_dict()`，再用代码重建模型：

# %%
torch.save(net.state_dict(), workdir / "weights.pt")
fresh = torch.nn.Sequential(torch.nn.Linear(4, 2))
fresh.load_state_dict(torch.load(workdir / "weights.pt"))  # weights_only=True: fine
print("same weights:", torch.equal(fresh[0].weight, net[0].weight))

# %% [markdown] lang="en"
# ## `pin_memory` and `non_blocking`
#
# A copy from CPU memory to a GPU is done by the GPU's DMA engine, which can only read
# **page-locked** ("pinned") host memory. From ordinary (pageable) memory the CUDA driver
# first copies the data into a pinned staging buffer, and the call returns only when the
# copy is done. `DataLoader(..., pin_memory=True)` puts each batch in pinned memory (with
# `num_workers > 0` in a separate thread, `_pin_memory_loop` in
# `torch/utils/data/_utils/pin_memory.py`; with `num_workers=0` in the main process, in
# `_SingleProcessDataLoaderIter._next_data`, `torch/utils/data/dataloader.py`); then
# `x.to("cuda", non_blocking=True)` only **queues** the copy on the current CUDA stream and
# returns at once, so the CPU can prepare the next batch while the copy runs, and kernels
# queued later on the same stream still wait for it. `non_blocking=True` from pageable
# memory is allowed but gains little. Pinned memory cannot be paged out, so pinning a lot
# of it starves the rest of the machine. A common explanation ("pin_memory makes
# the GPU read memory faster, non_blocking makes it asynchronous everywhere") mixes up the
# two: it is the pinning that makes the asynchronous copy possible.
#
# Without a GPU there is nothing to pin for: `DataLoader` warns and skips the pinning.
# The GPU cell after it measures both copies.

# %% [markdown] lang="zh"
# ## `pin_memory` 与 `non_blocking`
#
# 从 CPU 内存到 GPU 的复制由 GPU 的 DMA 引擎完成，而它只能读取**页锁定**（page-locked，也叫
# pinned）的主机内存。如果数据在普通的可分页（pageable）内存里，CUDA 驱动（driver）要先把它复
# 制到一块页锁定的中转缓冲区，调用要等复制结束才返回。`DataLoader(..., pin_memory=True)` 把每
# 个批放进页锁定内存（`num_workers > 0` 时在单独的线程里完成，见
# `torch/utils/data/_utils/pin_memory.py` 中的 `_pin_memory_loop`；`num_workers=0` 时在主进程里完
# 成，见 `torch/utils/data/dataloader.py` 中的 `_SingleProcessDataLoaderIter._next_data`）；这时
# `x.to("cuda", non_blocking=True)` 只是把复制**排进**当前 CUDA 流就立即返回，CPU 可以一边准备
# 下一个批，一边让复制进行，而之后排进同一个流的核函数（kernel）仍会等它完成。对可分页内存使用
# `non_blocking=True` 也可以，但几乎没有收益。页锁定内存不能被换出，锁定得太多，机器上的其他程
# 序就会缺内存。一种常见的解释（“`pin_memory` 让 GPU 读内存更快，`non_blocking` 让一切都变
# 成异步”）把两者混为一谈：正是页锁定才使异步复制成为可能。
#
# 没有 GPU 时，页锁定无法进行，`DataLoader` 会警告并跳过它。再下一个单元在 GPU 上测量
# 这两种复制。

# %%
import warnings  # noqa: E402

try:
    torch.empty(4).pin_memory()
    print("pinned:", torch.empty(4).pin_memory().is_pinned())
except RuntimeError as err:
    print("pin_memory():", err)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    next(iter(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)))
print("DataLoader(pin_memory=True):", [str(w.message) for w in caught] or "no warning")

# %% tags=["lesson"]
if torch.cuda.is_available():
    import time

    def copy_ms(src, non_blocking, repeat=10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            dst = src.to("cuda", non_blocking=non_blocking)
        returned = time.perf_counter() - start  # when the CPU got control back
        torch.cuda.synchronize()
        done = time.perf_counter() - start  # when the copies had finished
        del dst
        return 1000 * returned / repeat, 1000 * done / repeat

    pageable = torch.randn(64, 1024, 1024)  # 256 MiB
    pinned = pageable.pin_memory()
    copy_ms(pinned, False)  # warm up
    for name, src, nb in [("pageable", pageable, False), ("pageable", pageable, True),
                          ("pinned", pinned, False), ("pinned", pinned, True)]:
        back, done = copy_ms(src, nb)
        print(f"{name:8s} non_blocking={nb!s:5s}: returns after {back:7.2f} ms, copy done after "
              f"{done:7.2f} ms ({256 / done:5.1f} GiB/s)")
else:
    print(dl.tr(en="Skipped: no GPU here. With one, this cell copies 256 MiB to the GPU from pageable "
                   "and pinned memory, with and without non_blocking, and prints when each call "
                   "returned and when the copy was done.",
                zh="已跳过：这里没有 GPU。有 GPU 时，本单元分别从可分页内存和页锁定内存把 256 MiB 复制到 "
                   "GPU（带与不带 non_blocking），并打印每次调用何时返回、复制何时完成。"))

# %% [markdown] lang="en"
# ## Seeds per rank, and cuDNN's flags
#
# One seed for everything is wrong under DDP, and so is a different seed for everything:
#
# - the **model** must start identical: any seed works, because `DDP(model)` broadcasts
#   rank 0's weights at construction;
# - **random data** (shuffling is the sampler's job, with the same `seed` on every rank)
#   such as augmentation and **dropout** must differ between ranks, or the ranks draw the
#   same masks and the same crops for different samples: seed them with `seed + rank`.
#   `DataLoader` draws a `base_seed` from its `generator` (without one, from the main
#   process's torch generator) each time an iterator starts, and each worker seeds torch and
#   `random` with `base_seed + worker_id` and NumPy from the same two numbers (`_worker_loop`
#   in `torch/utils/data/_utils/worker.py`). So seeding the main process's torch per rank
#   reaches torch, `random` and NumPy in the workers; `random` and NumPy in the main process
#   (`num_workers=0`) you seed yourself, with `seed + rank` too.
#
# The cell shows the masks of a dropout layer on 2 ranks, seeded alike and per rank.

# %% [markdown] lang="zh"
# ## 每个 rank 的随机种子，以及 cuDNN 的开关
#
# 在 DDP 下，所有东西都用同一个种子是错的，所有东西都用不同的种子也是错的：
#
# - **模型**必须从相同的状态开始：用什么种子都行，因为 `DDP(model)` 在构造时会广播 rank 0 的权
#   重；
# - 数据增强、**dropout** 这类**随机数据**（打乱顺序是采样器的事，所有 rank 用同一个 `seed`）
#   必须在各 rank 之间不同，否则各 rank 会对不同的样本抽到相同的掩码、做相同的裁剪：用
#   `seed + rank` 设置随机种子。`DataLoader` 每次开始一个迭代器时，从它的 `generator`（没有
#   指定时，从主进程的 torch 随机数生成器）抽一个 `base_seed`；每个 worker 用
#   `base_seed + worker_id` 给 torch 和 `random` 设种子，NumPy 的种子也由这两个数算出（见
#   `torch/utils/data/_utils/worker.py` 中的 `_worker_loop`）。所以按 rank 给主进程的 torch 设
#   种子，worker 里的 torch、`random` 和 NumPy 也就跟着不同了；主进程里（`num_workers=0` 时）
#   的 `random` 和 NumPy 要自己设种子，同样用 `seed + rank`。
#
# 下面的单元在 2 个 rank 上展示一个 dropout 层的掩码：一次所有 rank 用相同的种子，一次按 rank
# 设不同的种子。

# %%
def dropout_masks(rank, seed=0):
    rows = []
    for per_rank in (False, True):
        torch.manual_seed(seed + rank if per_rank else seed)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5)))
        mask = (model(torch.ones(1, 4)) != 0).int().flatten()
        masks = [torch.empty_like(mask) for _ in range(2)]
        dist.all_gather(masks, mask)
        weights = [torch.empty_like(model.module[0].weight) for _ in range(2)]
        dist.all_gather(weights, model.module[0].weight.detach())
        rows.append(f"{'seed + rank' if per_rank else 'same seed  '}: masks {[m.tolist() for m in masks]} "
                    f"identical={torch.equal(*masks)} | weights identical={torch.equal(*weights)}")
    return rows


for line in dl.spawn(dropout_masks, nprocs=2, backend="gloo")[0]:
    print(line)

# %% [markdown] lang="en"
# On GPUs, `torch.backends.cudnn.benchmark = True` lets cuDNN time several convolution
# algorithms for each new input shape and keep the fastest: faster for fixed shapes, but
# the choice can differ between runs and ranks. `torch.backends.cudnn.deterministic = True`
# restricts cuDNN to deterministic algorithms; `torch.use_deterministic_algorithms(True)`
# goes further and raises an error for any torch operation without a deterministic
# implementation. A widely copied `init_seeds` helper sets `deterministic = (seed == 0)` and
# `benchmark = not deterministic`: with `seed + rank`, rank 0 runs deterministically and
# every other rank does not. Set both flags from a configuration option, the same on every
# rank. On a CPU they change nothing (they are cuDNN's), so this cell only prints them.

# %% [markdown] lang="zh"
# 在 GPU 上，`torch.backends.cudnn.benchmark = True` 让 cuDNN 针对每种新的输入形状试跑几种卷积
# 算法，保留最快的那个：形状固定时更快，但不同的运行、不同的 rank 选中的算法可能不同
# 。`torch.backends.cudnn.deterministic = True` 把 cuDNN 限制在确定性算法上
# ；`torch.use_deterministic_algorithms(True)` 更进一步：任何没有确定性实现的 torch 算子
# （operator）都会报错。一个流传很广的 `init_seeds` 辅助函数设置
# `deterministic = (seed == 0)`、`benchmark = not deterministic`：配合 `seed + rank`，结果只有
# rank 0 以确定性方式运行，其他 rank 都不是。应该由一个配置项来设置这两个开关，并且所有 rank
# 取值相同。在 CPU 上它们不起作用（它们属于 cuDNN），所以本单元只打印它们。

# %%
print("cudnn.benchmark:", torch.backends.cudnn.benchmark,
      "| cudnn.deterministic:", torch.backends.cudnn.deterministic,
      "| deterministic algorithms:", torch.are_deterministic_algorithms_enabled())

# %% [markdown] lang="en"
# ## Scaling: time per epoch on 1, 2 (and 4) ranks
#
# Each rank uses one thread, and an epoch is as long as its slowest rank. What a 2-core
# machine can show: 2 ranks split the work of one epoch, but they also wait for each other
# at every step's all-reduce, and anything else running on the machine slows the slowest
# rank. 4 ranks on 2 cores cannot be faster than 2, so the cell adds 4 ranks only where
# there are at least 4 cores. What
# it cannot show: on GPUs each rank has its own device, the model is far larger, and the
# all-reduce overlaps with the backward pass, so the time per epoch drops almost like
# 1/N until communication or data loading dominates.

# %% [markdown] lang="zh"
# ## 扩展性：1、2（和 4）个 rank 时每轮的时间
#
# 每个 rank 使用一个线程，一轮的时间取决于最慢的 rank。一台 2 核机器能展示的是：2 个 rank 分担
# 一轮的工作，但它们在每一步的全归约处也要互相等待，机器上运行的其他程序也会拖慢最慢的 rank。4
# 个 rank 共用 2 个核不可能比 2 个 rank 更快，所以只有至少 4 个核时，本单元才加上 4 个 rank。
# 它展示不了的是：在 GPU 上每个 rank 有自己的设备，模型也大得多，全归约与反向传播重叠
# （overlap），所以在通信或数据加载成为瓶颈之前，每轮时间几乎按 1/N 下降。

# %% tags=["lesson"]
import os

ranks = [1, 2, 4] if (os.cpu_count() or 1) >= 4 else [1, 2]
times = []
for n in ranks:
    run = train.launch([*common, "--epochs", "2", "--quiet"], nprocs=n)
    times.append(min(run[0]["epoch_time"]))  # the faster epoch: less noise from the machine
    print(f"{n} rank(s): {times[-1]:.3f}s per epoch, speed-up {times[0] / times[-1]:.2f}x")
plt.figure(figsize=(4, 3))
plt.plot(ranks, times, "o-")
plt.xlabel(dl.tr(en="ranks", zh="rank 数"))
plt.ylabel(dl.tr(en="seconds per epoch", zh="每轮秒数"))
plt.xticks(ranks)
plt.show()

# %% [markdown] lang="en"
# ## The buggy training function
#
# This `buggy_fit` gathers real mistakes common in notes and blog posts. Find them before
# reading on:
# it creates the optimizer inside the loop (its momentum restarts at every step, and there is
# no `zero_grad`), never calls `set_epoch`, lets every rank save, saves the DDP wrapper (keys
# start with `module.`), and returns each rank's own loss as "the" loss.

# %% [markdown] lang="zh"
# ## 有错误的训练函数
#
# 下面的 `buggy_fit` 集中了网上教程里常见的真实错误。往下读之前先自己找一找：它在循环里创建优
# 化器（动量每一步都从头开始，而且没有 `zero_grad`），从不调用 `set_epoch`，让每个 rank 都保存
# 检查点，保存的是 DDP 包装器（键名以 `module.` 开头），还把每个 rank 自己的损失当成整体的损失
# 返回。

# %%
def buggy_fit(model, dataset, epochs, batch_size, lr, checkpoint_path):
    ddp_model = DDP(model)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for x, y in loader:
            optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(loader))
    torch.save(ddp_model.state_dict(), checkpoint_path)
    return losses


# %% tags=["lesson"]
def run_buggy(rank, folder):
    train_set, _ = data.load_digits_split(folder)
    torch.manual_seed(0)
    model = train.SmallCNN()
    losses = buggy_fit(model, train_set, 2, 32, 0.05, f"{folder}/buggy.pt")
    dist.barrier()
    keys = list(torch.load(f"{folder}/buggy.pt", weights_only=True))[:2]
    print(f"losses {[round(v, 3) for v in losses]} | checkpoint keys {keys}")


dl.spawn(run_buggy, args=(str(workdir / "data"),), nprocs=2, backend="gloo");

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise: fix the training function (5 points)
#
# Write `fit(model, dataset, epochs, batch_size, lr, checkpoint_path)`. It runs on every rank
# of an initialised gloo process group and must:
# - wrap `model` in `DDP` and train it in place with `torch.optim.SGD(..., lr=lr,
#   momentum=0.9)` created once, `F.cross_entropy`, and `zero_grad()` every step;
# - read batches from `DataLoader(dataset, batch_size=batch_size, sampler=sampler)` with
#   `sampler = DistributedSampler(dataset)` and `sampler.set_epoch(epoch)` every epoch;
# - return one loss per epoch: the mean over all ranks of each rank's average batch loss,
#   the same list on every rank;
# - at the end, save the plain model's `state_dict()` to `checkpoint_path` from rank 0 only,
#   then `dist.barrier()`.
#
# The graded cell runs your function on hidden data and models with 2 or 3 ranks and checks
# what it does: the samples each rank reads, who writes into the checkpoint's folder
# (whatever function does it), that no rank returns before rank 0 has written the checkpoint
# (rank 0's save is made slow on purpose), the checkpoint, the parameters on every rank
# against a correct DDP run, the losses and the accuracy.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习：修好训练函数（5 分）
#
# 编写 `fit(model, dataset, epochs, batch_size, lr, checkpoint_path)`。它在一个已经初始化的
# gloo 进程组的每个 rank 上运行，必须：
# - 用 `DDP` 包装 `model`，原地训练传入的这个模型：只创建一次
#   `torch.optim.SGD(..., lr=lr, momentum=0.9)`，使用 `F.cross_entropy`，每一步都调用
#   `zero_grad()`；
# - 从 `DataLoader(dataset, batch_size=batch_size, sampler=sampler)` 读取批，其中
#   `sampler = DistributedSampler(dataset)`，并且每一轮都调用 `sampler.set_epoch(epoch)`；
# - 返回一个列表，每轮一个损失值：先在每个 rank 上对该轮的批损失求平均，再对所有 rank 求平均；
#   每个 rank 返回的列表相同；
# - 最后只由 rank 0 把未包装模型的 `state_dict()` 保存到 `checkpoint_path`，然后调用
#   `dist.barrier()`。
#
# 评分单元（graded cell）会在隐藏的数据和模型上用 2 个或 3 个 rank 运行你的函数，并检查它的实
# 际行为：每个 rank 读取的样本、谁向检查点所在的文件夹写了文件（不管用哪个函数写）、在 rank 0
# 写完检查点之前有没有 rank 已经返回（评分时会故意让 rank 0 的保存变慢）、检查点本身、每个
# rank 上的参数（与正确的 DDP 训练比较）、损失和准确率。

# %% tags=["exercise"]
def fit(model, dataset, epochs, batch_size, lr, checkpoint_path):
    ### BEGIN SOLUTION
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        mean = torch.tensor(total / len(loader))
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    if dist.get_rank() == 0:
        torch.save(ddp_model.module.state_dict(), checkpoint_path)
    dist.barrier()
    return losses
    ### END SOLUTION


# %% tags=["grade"] grade_id="08.fit" points=5
dl.grade("08.fit", fit)

# %% [markdown] lang="en"
# ## Summary
#
# A DDP program is an ordinary training loop plus a handful of rules: every rank runs the
# same code, reads its own shard (re-shuffled by `set_epoch`), starts from the same weights,
# logs numbers reduced over all ranks, and lets rank 0 alone talk to the outside world
# (progress, checkpoints), with a barrier where others depend on it. The same file runs under
# `torchrun` on one node or many. Scale the LR with a warmup, save `state_dict()`s (a pickled
# module no longer loads by default), pin host memory for asynchronous copies to a GPU,
# seed random data per rank and the model however you like.

# %% [markdown] lang="zh"
# ## 小结
#
# DDP 程序就是普通的训练循环加上几条规则：每个 rank 运行相同的代码，读取自己的分片（由
# `set_epoch` 每轮重新打乱），从相同的权重开始，记录在所有 rank 上归约过的数值，并且只让 rank
# 0 与外界打交道（进度、检查点），在其他 rank 依赖它的地方放一道屏障。同一个文件可以在
# `torchrun` 下运行于一个或多个节点。缩放学习率要配合预热；保存 `state_dict()`（pickle 下来的整
# 个模块默认已经加载不了）；往 GPU 异步复制要用页锁定内存；随机数据按 rank 设不同的种子，模型用
# 什么种子都可以。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`08.concepts`,
# 2 points when all are right).
#
# **1.** The base learning rate 0.05 was tuned for a global batch of 32. You run `--batch-size 32` (per rank) on 4 ranks. What LR does the linear scaling rule give? (a number)
#
# **2.** Rank 0 logs `loss.item()` of its own batch. What does that number measure?
#
# - (a) the same number every rank would log
# - (b) the mean over the epoch
# - (c) the loss on rank 0's shard only, a noisier number; all-reduce it and divide by N for the global one
# - (d) the loss over the global batch
#
# **3.** A checkpoint made with `torch.save(model, path)` (the whole module) is loaded with `torch.load(path)` in torch 2.6 or later. What happens?
#
# - (a) it loads the state_dict only
# - (b) it fails: `weights_only=True` is the default and refuses to unpickle the module's class
# - (c) it loads
# - (d) it loads on the CPU only
#
# **4.** Rank 0 saved a checkpoint from `cuda:0`. Rank 1 (on `cuda:1`) calls `torch.load(path)` without `map_location`. Where do the tensors land?
#
# - (a) on `cuda:0`, the device they were saved from: rank 1 takes memory on GPU 0
# - (b) on `cuda:1`
# - (c) an error is raised
# - (d) on the CPU


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`08.concepts`，全部答对得 2 分）。
#
# **1.** 基础学习率 0.05 是针对全局批大小 32 调好的。你在 4 个 rank 上运行 `--batch-size 32`（每个 rank）。线性缩放规则给出的学习率是多少？（填一个数）
#
# **2.** rank 0 记录它自己那一批的 `loss.item()`。这个数衡量的是什么？
#
# - (a) 每个 rank 记录的都是同一个数
# - (b) 整轮的平均值
# - (c) 只是 rank 0 分片上的损失，噪声更大；要得到全局损失，应全归约后除以 N
# - (d) 整个全局批上的损失
#
# **3.** 用 `torch.save(model, path)`（整个模块）保存的检查点，在 torch 2.6 或更高版本中用 `torch.load(path)` 加载。会发生什么？
#
# - (a) 只加载 state_dict
# - (b) 失败：默认 `weights_only=True`，拒绝反序列化模块的类
# - (c) 正常加载
# - (d) 只能加载到 CPU 上
#
# **4.** rank 0 在 `cuda:0` 上保存了检查点。rank 1（在 `cuda:1` 上）调用 `torch.load(path)` 时没有传 `map_location`。张量会被放到哪里？
#
# - (a) `cuda:0` 上，也就是保存时所在的设备：rank 1 占用了 GPU 0 的显存
# - (b) `cuda:1` 上
# - (c) 报错
# - (d) CPU 上


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 0.2,  # a number
    2: "c",  # a letter
    3: "b",  # a letter
    4: "a",  # a letter
    ### END ANSWERS
}
dl.quiz("08", my_answers)


# %% tags=["grade"] grade_id="08.concepts" points=2
dl.grade("08.concepts", my_answers)
