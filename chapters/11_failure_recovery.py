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
#       en: "11 Runs that fail: checkpoints, restarts, hangs"
#       zh: "11 训练出故障时：检查点、重启与卡住"
# ---

# %% [markdown] lang="en"
# # 11 Runs that fail: checkpoints, restarts, hangs
#
# A long run does not stay healthy: a worker dies at hour 30, a node is taken away, the
# scheduler ends the job. This chapter makes chapter 08's program survive that. A worker is
# killed mid-run and `torchrun` restarts the job from a **checkpoint**, and the run ends with
# the same parameters, bit for bit, as one that was never interrupted. Then: how to write a
# checkpoint that is complete or absent even if the writer dies, **sharded checkpoints** with
# `torch.distributed.checkpoint` (saved on 2 ranks, loaded on 3), how a peer that hangs
# becomes an error, a host that leaves an **elastic** job and comes back, a Slurm job that is
# warned, checkpoints, requeues itself and resumes, and what a checkpoint costs.

# %% [markdown] lang="zh"
# # 11 训练出故障时：检查点、重启与卡住
#
# 长时间的训练总会出状况：某个 worker 在第 30 个小时挂掉，某个节点被收回，调度器终止了作业。本
# 章让第 08 章的训练程序扛得住这些情况。我们在训练中途杀掉一个 worker，`torchrun`
# 从**检查点**（checkpoint）重启整个作业，最终参数与从未中断的运行逐位相同。接下来讨论：怎样写
# 出“要么完整，要么没有”的检查点，哪怕写文件的进程中途死掉；怎样用
# `torch.distributed.checkpoint` 写**分片检查点**（sharded checkpoint），由 2 个 rank（进程编
# 号）保存、3 个 rank 加载；怎样让卡住的对端变成一个明确的错误；一台主机离开**弹性**
# （elastic）作业、随后又回来时会发生什么；Slurm 作业怎样收到预警、写检查点、把自己重新排队并
# 恢复运行；以及一个检查点要花多少时间。

# %%
import os
import subprocess
import sys
from pathlib import Path

import torch

import ddp_lab as dl
from ddp_lab.labs import recovery
from ddp_lab.tools import resume

dl.setup()
WORK = dl.scratch("ch11")  # removed when this kernel stops
# TMPDIR inside WORK: torchrun writes a folder of logs there and never removes it
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(WORK)}
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
print(torch.__version__)

# %% [markdown] lang="en" tags=["lesson"]
# ## 1. What a checkpoint must hold to resume exactly
#
# After a restart, the next step must see exactly what it would have seen: the same weights,
# the same **optimizer state** (SGD's momentum, Adam's moments), the same learning rate (the
# **LR schedule**'s step count), the same batch (the sampler's epoch *and* how far into the
# epoch the run got) and the same random draws (dropout, augmentation: every rank's torch
# generators, CPU and CUDA, and its NumPy and Python ones, each rank its own). Miss one and
# the run still trains, but it is another run. `ddp_lab.tools.resume` keeps all of it; `python -m ddp_lab.tools.train
# --checkpoint-every K` writes it every K steps and resumes from the newest complete one.
# The sampler's position is the subtle part: with W ranks, rank r reads positions r, r+W,
# r+2W, ... of the epoch's order, so after p steps of B samples per rank the first p·B·W
# positions are used, whatever the rank. `ResumableDistributedSampler` drops them and deals
# out the rest as `DistributedSampler` does (at position 0 it yields the very same indices).

# %% [markdown] lang="zh" tags=["lesson"]
# ## 1. 检查点要包含什么才能精确恢复
#
# 重启之后，下一步看到的一切必须和没有中断时完全一样：同样的权重；同样
# 的**优化器状态**（optimizer state），即 SGD 的动量、Adam 的一阶和二阶矩；同样的学习率，也就
# 是**学习率调度**（LR schedule）已走的步数；同样的批，即采样器所在的轮（epoch），*以及*这一轮
# 已经读到了哪里；同样的随机数（dropout、数据增强），即每个 rank 各自的 torch（CPU 和 CUDA）、
# NumPy 和 Python 随机数生成器。漏掉任何一项，训练照样能跑，但已经是另一次训练了。`ddp_lab.tools.resume` 保存了所有这
# 些；`python -m ddp_lab.tools.train --checkpoint-every K` 每 K 步写一次检查点，启动时从最新的完整检
# 查点恢复。最微妙的是采样器的位置：world size（进程总数）为 W 时，rank r 读取本轮顺序中的第
# r、r+W、r+2W……个位置，所以每个 rank 每步取 B 个样本、走了 p 步之后，前 p·B·W 个位置已经用掉，
# 与 rank 无关。`ResumableDistributedSampler` 跳过这些位置，把其余的像 `DistributedSampler` 一
# 样分给各 rank（位置为 0 时，它给出的索引与 `DistributedSampler` 完全相同）。

# %% tags=["lesson"]
dl.show_source(resume.save_step)

# %% [markdown] lang="en" tags=["lesson"]
# The data loader hides two more pieces of random state. Every `iter(loader)` draws a
# `_base_seed` from `loader.generator`, and without one from the global torch generator, even
# with `num_workers=0` (`_BaseDataLoaderIter.__init__` in `torch/utils/data/dataloader.py`): a
# resumed run makes its iterator mid-epoch, at another point of that stream, and every later
# draw shifts. That is why `python -m ddp_lab.tools.train` and `recovery.resumable_loop` give their
# loaders a `torch.Generator()` of their own. With `num_workers > 0` the augmentation draws
# happen in the worker processes, each seeded with `base_seed + worker_id` when an iterator
# starts (`torch/utils/data/_utils/worker.py`; chapter 08 seeds them); their generators live
# in the workers, so saving the main process's state does not capture them. Below, an epoch
# of 8 items, each a `torch.rand` drawn in one of 2 workers; the "resumed" run restores the
# main process's state and skips the first 4 items, and its workers start their generators
# over. `torchdata.stateful_dataloader.StatefulDataLoader` is the production answer: a
# `DataLoader` with `state_dict()`/`load_state_dict()` that saves how far the iterator got and
# collects per-worker state; a dataset whose workers hold their own random state saves it
# through its own `state_dict`/`load_state_dict`, which the loader calls in each worker (its
# documentation, pytorch.org/data).

# %% [markdown] lang="zh" tags=["lesson"]
# 数据加载器里还藏着两份随机状态。每次 `iter(loader)` 都会从 `loader.generator` 抽取一个
# `_base_seed`；没有指定 `generator` 时，抽的是全局的 torch 随机数生成器，即使
# `num_workers=0` 也是如此（`torch/utils/data/dataloader.py` 中的 `_BaseDataLoaderIter.__init__`）。
# 恢复的运行在一轮的中途创建迭代器，抽取时处在随机数序列的另一个位置，之后的每次抽取都错开了。所
# 以 `python -m ddp_lab.tools.train` 和 `recovery.resumable_loop` 都给数据加载器单独配了一个
# `torch.Generator()`。`num_workers > 0` 时，数据增强的随机数在 worker 进程里抽取，每个迭代器开
# 始时，worker 的种子设为 `base_seed + worker_id`（`torch/utils/data/_utils/worker.py`；第 08 章
# 讲过怎样给它们设种子）。这些生成器在 worker 进程里，保存主进程的随机数状态并不能把它们一起保
# 存下来。下面一轮有 8 个样本，每个样本是某个 worker（共 2 个）里抽出的一个 `torch.rand`；“恢
# 复”的运行还原主进程的随机数状态，跳过前 4 个样本，而它的 worker 从头开始抽取随机数。生产环境
# 的做法是 `torchdata.stateful_dataloader.StatefulDataLoader`：它是带 `state_dict()` /
# `load_state_dict()` 的 `DataLoader`，保存迭代器读到了哪里，并汇总各个 worker 的状态；如果数据
# 集在 worker 里有自己的随机状态，就由数据集自己的 `state_dict` / `load_state_dict` 保存，加载
# 器会在每个 worker 里调用它们（见 pytorch.org/data 上的文档）。

# %% tags=["lesson"]
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(())  # an augmentation's random draw, made in a worker


def epoch_items(skip, rng_state):
    torch.set_rng_state(rng_state)
    loader = DataLoader(Augmented(), num_workers=2, sampler=range(skip, 8))
    return [f"{x.item():.3f}" for x in loader]


torch.manual_seed(0)
saved_rng = torch.get_rng_state()
straight_items = epoch_items(0, saved_rng)
print("straight, items 0-3:", straight_items[:4])
print("straight, items 4-7:", straight_items[4:])
print("resumed,  items 4-7:", epoch_items(4, saved_rng))

# %% [markdown] lang="en" tags=["lesson"]
# Two runs of the same program under `torchrun --max-restarts=1`: one straight through; in
# the other the last rank kills itself with SIGKILL right after step 4, before that step's
# checkpoint is written (`--fail-at-step 4`, once: a marker file in the checkpoint folder
# says it already happened). The other rank's next collective fails at once (its peer's
# socket is closed), torchrun stops the group, starts both workers again, and they resume
# from step 2's checkpoint. Compare the last lines.
#
# A restart has a trap of its own. torchrun's c10d rendezvous hands its own TCPStore to the
# workers and keeps the same store server across restarts
# (`torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`, `next_rendezvous`), and
# `init_process_group` names its keys the same in every attempt (`default_pg/0/...`:
# `_create_c10d_store` in `torch/distributed/rendezvous.py` adds no per-attempt prefix).
# gloo's `connectFullMesh` has each rank write its address under its rank's key and read the
# others': a restarted rank that reads a peer's key before the peer has rewritten it gets the
# address of a dead process, and fails with "Connection refused" or waits
# (pytorch/pytorch#135712). On a busy machine, where the ranks start seconds apart, that
# happened in 7 of 10 restarts. `ddp_lab.tools.train` therefore lets the ranks of each attempt agree
# on a fresh random name first and puts the group's keys under it (`ddp_lab/tools/attempt_store.py`;
# `TORCHELASTIC_RESTART_COUNT` would not do, since each agent counts its own restarts).
# Setting `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` for torchrun avoids the trap too: each round
# then gets a store of its own.

# %% [markdown] lang="zh" tags=["lesson"]
# 在 `torchrun --max-restarts=1` 下把同一个程序运行两次：一次一口气跑完；另一次，最后一个 rank
# 在第 4 步刚结束、这一步的检查点还没写出时用 SIGKILL 杀死自己（`--fail-at-step 4`，只杀一次：
# 检查点目录中的一个标记文件记下它已经发生过）。另一个 rank 的下一次集合通信（collective）立即失败，
# 因为对端的套接字已经关闭；torchrun 停掉整个组，重新启动两个 worker，它们从第 2 步的检查点
# 恢复。比较两次运行输出的最后几行。
#
# 重启本身还有一个陷阱。torchrun 的 c10d 会合（rendezvous）把自己的 `TCPStore`（一个键值
# store）交给 worker 使用，并且在多次重启之间一直沿用同一个 store 服务器
# （`torch/distributed/elastic/rendezvous/dynamic_rendezvous.py` 中的 `next_rendezvous`）；
# 而 `init_process_group` 在每次尝试中用的键名都一样（`default_pg/0/...`：
# `torch/distributed/rendezvous.py` 中的 `_create_c10d_store` 没有加上区分尝试的前缀）。gloo 的
# `connectFullMesh` 让每个 rank 把自己的地址写在以 rank 命名的键下，再读取其他 rank 的键：重启
# 后的 rank 如果在对端重写之前就读了它的键，拿到的就是一个已经死掉的进程的地址，于是报
# “Connection refused”，或者一直等下去（pytorch/pytorch#135712）。在繁忙的机器上，各 rank 的启
# 动时间相差好几秒，10 次重启中有 7 次出了这个问题。所以 `ddp_lab.tools.train` 先让同一次尝试的各
# rank 商定一个新的随机名字，再把进程组的键都放在这个名字下面（`ddp_lab/tools/attempt_store.py`；
# `TORCHELASTIC_RESTART_COUNT` 不行，因为每个代理只数自己的重启次数）。给 torchrun 设置
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` 也能避开这个陷阱：这样每一轮会合都有自己的 store。

# %% tags=["lesson"]
def train_run(*extra):
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
           "-m", "ddp_lab.tools.train", "--epochs", "1", "--batch-size", "128", "--threads", "1",
           "--augment", "--warmup-steps", "3", "--data-dir", str(WORK / "data"),
           "--deterministic", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


straight = train_run("--quiet")
killed = train_run("--checkpoint-dir", str(WORK / "ckpt"), "--checkpoint-every", "2",
                   "--fail-at-step", "4")
print("straight:", straight.stdout.strip().splitlines()[-1])
print("killed:  ", "\n          ".join(killed.stdout.strip().splitlines()))
print([line for line in killed.stderr.splitlines() if "exitcode" in line][:1])


def final_sha(out):
    return next((ln.split()[-1] for ln in reversed(out.splitlines()) if "sha256" in ln), None)


print("same parameters, bit for bit:",
      final_sha(straight.stdout) is not None and final_sha(straight.stdout) == final_sha(killed.stdout))

# %% [markdown] lang="en" tags=["lesson"]
# On CPU the same inputs give the same result anyway. On a GPU they do not, even without a
# restart: two straight runs end with different digests, because cuDNN and cuBLAS may pick
# other algorithms from run to run, some of which add in an order that is not fixed. That is
# what `--deterministic` is for (`train.make_deterministic`): `CUBLAS_WORKSPACE_CONFIG=:4096:8`
# set before CUDA starts (cuBLAS then keeps fixed workspaces), cuDNN's `deterministic = True`
# and `benchmark = False`, and `torch.use_deterministic_algorithms(True)`, which also makes
# an operation that has no deterministic version raise instead of running (the list is in
# its docstring, `torch/__init__.py`). The cost: slower kernels where the fast ones are not
# deterministic, no autotuning, and 8 fixed cuBLAS workspaces of 4 MiB per handle; how much
# slower depends on the model (measure it: `--deterministic` on and off).

# %% [markdown] lang="zh" tags=["lesson"]
# 在 CPU 上，同样的输入本来就给出同样的结果。在 GPU 上却不是这样，即使没有重启：两次一口气跑完的
# 运行，摘要也不同，因为 cuDNN 和 cuBLAS 每次运行可能选用不同的算法，其中有些算法的加法顺序不固定。
# `--deterministic` 就是为此准备的（`train.make_deterministic`）：在 CUDA 启动之前设置
# `CUBLAS_WORKSPACE_CONFIG=:4096:8`（cuBLAS 因此使用固定的工作区），设置 cuDNN 的
# `deterministic = True` 和 `benchmark = False`，再调用 `torch.use_deterministic_algorithms(True)`；
# 后者还会让没有确定性实现的算子直接报错，而不是照常运行（清单见它的文档字符串，`torch/__init__.py`）。
# 代价是：在快的实现不确定时改用较慢的实现，不再自动调优，每个 cuBLAS 句柄占用 8 块 4 MiB 的固定
# 工作区；具体慢多少取决于模型（自己量一下：分别打开和关闭 `--deterministic`）。

# %% [markdown] lang="en" tags=["lesson"]
# On three ranks or more, one more order must stay the same: that of DDP's buckets. DDP
# all-reduces gradients in buckets. Its first step puts every parameter into one bucket, in
# reverse order (`compute_bucket_size_limits` in `torch/nn/parallel/distributed.py`); after
# that step it rebuilds the buckets in the order the gradients arrived
# (`Reducer::should_rebuild_buckets` in `torch/csrc/distributed/c10d/reducer.hpp`). A resumed
# process builds a new DDP model, so its first step all-reduces in the first layout where the
# uninterrupted run used the rebuilt one. A ring all-reduce adds each element's values in an
# order set by where the element sits in the bucket. With two ranks that changes nothing
# (a + b = b + a). With three, (a + b) + c and a + (b + c) can differ in the last bit, and from
# then on so do the parameters. A checkpoint cannot hold the layout, so keep it fixed:
# `recovery.resumable_loop` in the exercise below passes `find_unused_parameters=True`, with
# which DDP never rebuilds (`should_rebuild_buckets` is false), at the cost of one walk over the
# autograd graph and one small all-reduce of the used-parameter map per step
# (`Reducer::all_reduce_local_used_map` in `reducer.cpp`), and a warning from torch that it
# found no unused parameter. `ddp_lab.tools.train` keeps the layout fixed another way
# (`fixed_buckets` in `ddp_lab/tools/train_process.py`): with a `bucket_cap_mb_list` of one
# byte (`[2**-20]` MiB) DDP uses the same limits for the first layout and for the rebuild
# ("Case 1" of `compute_bucket_size_limits`), and a one-byte limit closes each bucket after
# one parameter (not 0: torch 2.11 rejects a largest limit of 0). Each gradient is then all-reduced on its own in both layouts; the rebuild only
# changes which bucket goes first. The cost: one all-reduce per parameter tensor (6 for this
# model) instead of one per step. Checked with the command above and `--nproc-per-node=3`:
# the straight and the killed-and-resumed run both end with the digest `a0188c55...`; with
# DDP's default buckets they ended with `4a3e00ef...` and `2b8240aa...`.

# %% [markdown] lang="zh" tags=["lesson"]
# 在三个或更多 rank 上，还有一个顺序必须保持不变：DDP 的桶（bucket）。DDP 按桶对梯度做全归约
# （all-reduce）。第一步时它把所有参数按逆序放进同一个桶（`torch/nn/parallel/distributed.py`
# 中的 `compute_bucket_size_limits`）；这一步之后，它按梯度到达的顺序重建各个桶
# （`torch/csrc/distributed/c10d/reducer.hpp` 中的 `Reducer::should_rebuild_buckets`）。恢复后
# 的进程新建了一个 DDP 模型，所以它的第一步用的是最初的布局，而不间断的那次运行此时用的已经是
# 重建后的布局。环形全归约把各 rank 上同一个元素的值相加，加法的先后顺序取决于这个元素在桶中
# 的位置。两个 rank 时这没有影响（a + b = b + a）；三个 rank 时，(a + b) + c 和 a + (b + c) 的
# 最后一位可能不同，此后参数也就不同了。检查点存不下这个布局，那就让它固定不变：下面练习里的
# `recovery.resumable_loop` 给 DDP 传了 `find_unused_parameters=True`，这样 DDP 就不会重建桶
# （`should_rebuild_buckets` 返回 false），代价是每一步要多遍历一次 autograd 图，再对“哪些参数
# 用到了”这张表做一次小的全归约（`reducer.cpp` 中的 `Reducer::all_reduce_local_used_map`），
# torch 还会警告说没有发现未使用的参数。`ddp_lab.tools.train` 换了一种办法固定布局（见
# `ddp_lab/tools/train_process.py` 中的 `fixed_buckets`）：把 `bucket_cap_mb_list` 设为一个字节
# （`[2**-20]` MiB）后，DDP 在最初分桶和重建时使用同一组上限（`compute_bucket_size_limits` 中
# 的“Case 1”），而一个字节的上限意味着每放进一个参数就封一个桶（不用 0：torch 2.11 不接受最大
# 上限为 0）。这样在两种布局下，每个梯度都单独做全归约，重建只改变各个桶的先后顺序。代价是每
# 一步从一次全归约变成每个参数张量一次（这个模型有 6 个）。用上面的命令加上
# `--nproc-per-node=3` 验证过：一口气跑完和中途被杀再恢复的两次运行，最终摘要都是
# `a0188c55...`；沿用 DDP 默认分桶时，两者分别是 `4a3e00ef...` 和 `2b8240aa...`。

# %% [markdown] lang="en" tags=["lesson"]
# ## 2. Complete or absent: atomic writes
#
# A worker can die while it writes. A half-written file under the checkpoint's name is worse
# than none: the restart loads it and crashes, every time. `save_atomic` writes to a
# temporary file in the same folder, `fsync`s it, renames it over the final name with
# `os.replace` (atomic on POSIX within one file system) and `fsync`s the folder so that the
# rename survives a power cut. Below, a writer is killed inside `torch.save`: the folder
# keeps the previous checkpoint and a `.tmp` file that `latest_checkpoint` never picks.
# `torch.distributed.checkpoint` does the same for its `.metadata` file
# (`torch/distributed/checkpoint/filesystem.py`, `FileSystemWriter.finish`: `.metadata.tmp`,
# then a rename), which the coordinator writes after every rank's data: in a fresh folder, no
# `.metadata`, no checkpoint. Its data files (`__0_0.distcp`, ...) are written under their
# final names, though, and `overwrite=True` is the default: an existing checkpoint in the
# folder only draws a warning (`prepare_local_plan`, same file). A `dcp.save` into a folder
# that already holds a checkpoint, killed midway, leaves the old `.metadata` beside
# half-rewritten data, and that looks complete. So give every DCP checkpoint a folder of its
# own (`step-000120/`) and load the newest folder that has its `.metadata`, the rule
# `latest_checkpoint` follows for files, or pass `FileSystemWriter(path, overwrite=False)` so
# that a second save into the same folder fails.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 2. 要么完整，要么没有：原子写入
#
# worker 可能在写文件时死掉。顶着检查点名字的半截文件比没有文件更糟：每次重启都会加载它，每次都
# 崩溃。`save_atomic` 先写到同一目录下的临时文件，对它调用 `fsync`，再用 `os.replace` 把它重命
# 名为最终的名字（在同一个文件系统内，POSIX 保证这是原子操作），最后对目录调用 `fsync`，让这次
# 重命名在断电后也不会丢失。下面的写入进程在 `torch.save` 中途被杀死：目录里留下上一个检查点，
# 以及一个 `latest_checkpoint` 永远不会选中的 `.tmp` 文件。`torch.distributed.checkpoint` 对它
# 的 `.metadata` 文件也是这样做的（`torch/distributed/checkpoint/filesystem.py` 中的
# `FileSystemWriter.finish`：先写 `.metadata.tmp`，再重命名），而且这个文件由协调者在所有 rank
# 的数据都写完之后才写：在新目录里，没有 `.metadata` 就没有检查点。但数据文件（`__0_0.distcp`
# 等）是直接以最终的名字写出的，而且 `overwrite=True` 是默认值：目录里已有检查点时只给一个警告
# （同一文件中的 `prepare_local_plan`）。如果往已有检查点的目录里 `dcp.save`，写到一半被杀掉，
# 目录里就是旧的 `.metadata` 加上改写了一半的数据文件，看上去却是完整的。所以每个 DCP 检查点都
# 要写进自己的新目录（如 `step-000120/`），加载时选有 `.metadata` 的最新目录，这和
# `latest_checkpoint` 挑选文件的规则相同；或者传入 `FileSystemWriter(path, overwrite=False)`，
# 让第二次写进同一目录的保存直接失败。

# %% tags=["lesson"]
dl.show_source(resume.save_atomic)

# %% tags=["lesson"]
KILLED_WRITER = """
import os, signal, sys, torch
from ddp_lab.tools import resume
resume.save_atomic({"step": 1}, resume.step_path(sys.argv[1], 1))
def dying_save(obj, f, *args, **kwargs):
    f.write(b"PK half a file")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = dying_save
resume.save_atomic({"step": 2}, resume.step_path(sys.argv[1], 2))
"""
folder = WORK / "atomic"
out = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(folder)], env=ENV)
print("exit code", out.returncode, sorted(p.name for p in folder.iterdir()))
print("latest:", resume.latest_checkpoint(folder).name, resume.load(resume.latest_checkpoint(folder)))

# %% [markdown] lang="en" tags=["lesson"]
# ## 3. Sharded checkpoints: `torch.distributed.checkpoint`
#
# Under FSDP no rank holds the whole model. Gathering it on rank 0 to `torch.save` it (a
# **full state dict**) needs the whole model in one process's memory and makes the other
# ranks wait; at scale that is the slow part. A **sharded state dict** keeps each rank's own
# rows: `get_state_dict(model, optimizer)` returns `DTensor`s, each knowing its global shape
# and which piece this rank holds, and `dcp.save` (`torch.distributed.checkpoint`, DCP for
# short) has every rank write its pieces in parallel, plus a `.metadata` file that records
# where each piece of each tensor went. `dcp.load` fills the state dict you hand it *in
# place*: each rank reads the pieces that overlap the rows it holds now, whatever the world
# size at save time (**resharding**). `torch/distributed/checkpoint/state_dict.py` documents
# the options: `full_state_dict=True` gathers full tensors, with it `cpu_offload=True` moves
# them to CPU and keeps them on rank 0 only (so that the full model never sits in GPU memory),
# `broadcast_from_rank0=True` takes a full state on rank 0 and broadcasts it tensor by tensor,
# each rank keeping its shard. `dcp.async_save` (`state_dict_saver.py`) copies the state to CPU memory and writes it in a background
# thread, so that training goes on during the write. Below: `fully_shard` on 2 gloo CPU
# ranks, three Adam steps, `dcp.save`; then 3 fresh ranks load it; the full states are
# compared.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 3. 分片检查点：`torch.distributed.checkpoint`
#
# 在完全分片数据并行（FSDP）下，没有哪个 rank 持有整个模型。把模型收集到 rank 0 再
# `torch.save`，得到的是**完整状态字典**（full state dict）：一个进程的内存要放得下整个模型，其
# 他 rank 还得等着；规模一大，这就是最慢的一环。**分片状态字典**（sharded state dict）只保留每
# 个 rank 自己的那几行：`get_state_dict(model, optimizer)` 返回 `DTensor`，每个 `DTensor` 都知
# 道自己的全局形状，以及本 rank 持有的是哪一块；`dcp.save`（`torch.distributed.checkpoint`，简
# 称 DCP）让每个 rank 并行写出自己的块，另外写一个 `.metadata` 文件，记录每个张量的每一块写到了
# 哪里。`dcp.load` *原地*填充你交给它的状态字典：每个 rank 读取与它现在持有的行有重叠的块，不管
# 保存时的 world size 是多少，这就是**重新分片**（resharding）。
#
# `torch/distributed/checkpoint/state_dict.py` 说明了各个选项：`full_state_dict=True` 收集完整张量；与它同用时，`cpu_offload=True` 把它们移到 CPU，并且
# 只留在 rank 0 上，这样完整模型永远不会进入 GPU 显存；`broadcast_from_rank0=True` 由 rank 0 拿到完整状态，
# 再逐个张量广播出去，各 rank 只留下自己的分片。`dcp.async_save`（`state_dict_saver.py`）先把状态复制到 CPU 内存，再在后台线
# 程中写出，写入期间训练照常进行。下面在 2 个 CPU rank 上（gloo 后端）用 `fully_shard` 分片，做
# 三步 Adam，再 `dcp.save`；然后由 3 个新的 rank 加载，比较两边的完整状态。

# %% tags=["lesson"]
dl.show_source(recovery.dcp_load)

# %% tags=["lesson"]
ckpt = str(WORK / "dcp")
saved = dl.spawn(recovery.dcp_save, args=(ckpt,), nprocs=2, backend="gloo", quiet=True)
loaded = dl.spawn(recovery.dcp_load, args=(ckpt,), nprocs=3, backend="gloo", quiet=True)
print("files:", sorted(p.name for p in Path(ckpt).iterdir()))
print("rank 0 held", saved[0]["local_shapes"]["0.weight"], "of 0.weight on 2 ranks,",
      loaded[0]["local_shapes"]["0.weight"], "on 3")
a, b = saved[0]["full"], loaded[0]["full"]
print("model equal:", all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]))
print("Adam state equal:", all(torch.equal(torch.as_tensor(v), torch.as_tensor(b["optim"][k][n]))
                               for k in a["optim"] for n, v in a["optim"][k].items()))

# %% [markdown] lang="en" tags=["lesson"]
# Why `torch.save` of each rank's shard is not a checkpoint: the file holds a plain tensor,
# rows 0-14 or 15-29 of a (30, 12) weight, and nothing says which. On 3 ranks each rank
# expects 10 rows, and a third rank has no file at all.
#
# The course's `FullyShardedDP` (chapter 10) cannot hand its shards to DCP as they are: each
# rank holds a 1-D slice of one padded flat vector per unit, and a slice boundary can fall
# inside a parameter. DCP needs each saved tensor described as pieces with offsets and sizes
# in the tensor's own shape (`ChunkStorageMetadata` in `torch/distributed/checkpoint/
# metadata.py`). It would take a `state_dict` that, for each parameter, cuts the rank's flat
# slice at the parameter's bounds and returns that piece as a 1-D tensor of the flattened
# parameter with its offset, and a `load_state_dict` that copies the pieces back into the
# flat shard. A `DTensor` cannot express uneven offsets. The lighter route is an object of
# your own that implements `__create_write_items__` and `__create_chunk_list__`, which DCP
# asks for a tensor's pieces (`_create_write_items` and `_create_chunk_list` in
# `torch/distributed/checkpoint/planner_helpers.py`); the older `ShardedTensor` with
# `ShardMetadata` can express them too, but it is legacy. `ShardedOptimizer` (ZeRO-1) is easier: each parameter's state
# lives whole on one rank, so a `state_dict` keyed by global parameter index, holding only
# the owned entries on each rank, is already something DCP can save: each key is written by
# the one rank that has it.

# %% [markdown] lang="zh" tags=["lesson"]
# 为什么每个 rank 对自己的分片调用 `torch.save` 不算检查点：文件里只是一个普通张量，是 (30, 12)
# 权重的第 0～14 行或第 15～29 行，却没有任何信息说明是哪几行。换成 3 个 rank 时，每个 rank 需要
# 10 行，而第三个 rank 根本没有文件。
#
# 课程自己的 `FullyShardedDP`（第 10 章）不能把分片原样交给 DCP：它把每个单元（unit）的参数展
# 平、填充成一个向量，每个 rank 持有其中的一段一维切片，而切片边界可能落在某个参数的中间。DCP
# 要求把每个要保存的张量描述成若干块，每块给出它在该张量自身形状中的偏移和大小
# （`torch/distributed/checkpoint/metadata.py` 中的 `ChunkStorageMetadata`）。要做到这一点，需
# 要一个 `state_dict`：对每个参数，在参数边界处切开本 rank 的一维切片，把切下的这一段作为展平后
# 参数的一维张量返回，并附上它的偏移；还需要一个 `load_state_dict`，把这些块拷回一维分片。
# `DTensor` 表达不了这种不均匀的偏移。更轻便的做法是自己写一个对象，实现
# `__create_write_items__` 和 `__create_chunk_list__`，DCP 会通过它们询问张量由哪些块组成
# （`torch/distributed/checkpoint/planner_helpers.py` 中的 `_create_write_items` 和
# `_create_chunk_list`）；较旧的 `ShardedTensor` 配合 `ShardMetadata` 也能表达，但它已是遗留接
# 口。`ShardedOptimizer`（ZeRO-1）简单得多：每个参数的状态完整地放在一个 rank 上，所以只要
# `state_dict` 以全局参数索引为键、每个 rank 只放自己拥有的条目，DCP 就能直接保存：每个键由持
# 有它的那个 rank 写出。

# %% tags=["lesson"]
shards = WORK / "shards"
shards.mkdir()
for line in dl.spawn(recovery.shard_torch_save, args=(str(shards), True), nprocs=2, backend="gloo", quiet=True):
    print(line)
for line in dl.spawn(recovery.shard_torch_save, args=(str(shards), False), nprocs=3, backend="gloo", quiet=True):
    print(line)

# %% [markdown] lang="en" tags=["lesson"]
# One more trap when every rank calls `dcp.save`: DCP takes a key that several ranks save for
# a replicated value. Before anything is written, the coordinator keeps one copy of each such
# key and drops the others (`dedup_save_plans` in
# `torch/distributed/checkpoint/_dedup_save_plans.py`: the rank with the least storage planned
# so far keeps it). That is right for DDP's replicated weights (section 7) and silently wrong
# for state that differs per rank: `{"rng": torch.get_rng_state()}` saved by every rank keeps
# one rank's generator, the exercise's classic bug in DCP form. Per-rank state needs per-rank
# keys. Below, each rank saves its rank number under a shared key and under a key of its own,
# then loads both back. Two more points from `torch/distributed/checkpoint/state_dict_saver.py`:
# an object in the state dict that is `Stateful` (it has `state_dict()` and
# `load_state_dict()`, `stateful.py`) is saved and loaded through those methods, and
# `async_save` refuses a process group without a CPU backend ("A CPU backend must be enabled
# for async save"), so with NCCL initialise the group as `"cpu:gloo,cuda:nccl"`.

# %% [markdown] lang="zh" tags=["lesson"]
# 每个 rank 都调用 `dcp.save` 时还有一个陷阱：几个 rank 保存同一个键时，DCP 认为这是各 rank 相同
# 的副本。写出之前，协调者对每个这样的键只保留一份，其余的丢掉
# （`torch/distributed/checkpoint/_dedup_save_plans.py` 中的 `dedup_save_plans`：由目前规划的存
# 储量最少的 rank 保留）。对 DDP 那些各 rank 相同的权重，这样做是对的（第 7 节）；对每个 rank 各
# 不相同的状态，这样做就错了，而且不报错：每个 rank 都保存 `{"rng": torch.get_rng_state()}`，
# 最后只留下一个 rank 的生成器，这正是练习要防的那个典型错误，换成了 DCP 的形式。每个 rank 自己
# 的状态要用带 rank 的键。下面每个 rank 把自己的 rank 号分别存在一个共用的键和一个自己的键下，
# 再把两者加载回来。`torch/distributed/checkpoint/state_dict_saver.py` 里还有两点：状态字典中实
# 现了 `Stateful`（有 `state_dict()` 和 `load_state_dict()`，见 `stateful.py`）的对象，通过这两
# 个方法保存和加载；`async_save` 不接受没有 CPU 后端的进程组（“A CPU backend must be enabled for
# async save”），所以使用 NCCL 时，要把进程组初始化为 `"cpu:gloo,cuda:nccl"`。

# %% tags=["lesson"]
import torch.distributed.checkpoint as dcp


def per_rank_state(rank, folder):
    keys = ("rng", f"rng.rank{rank}")  # one key every rank saves, one key of its own
    dcp.save({k: torch.tensor([rank]) for k in keys}, checkpoint_id=folder)
    back = {k: torch.tensor([-1]) for k in keys}
    dcp.load(back, checkpoint_id=folder)
    return f"rank {rank} saved {rank}, loaded " + ", ".join(f"{k}={v.item()}" for k, v in back.items())


print(*dl.spawn(per_rank_state, args=(str(WORK / "dedup"),), nprocs=2, backend="gloo", quiet=True), sep="\n")

# %% [markdown] lang="en" tags=["lesson"]
# ## 4. When a collective hangs instead of failing
#
# A peer that *dies* closes its sockets, and the others' next collective fails at once
# (section 1). A peer that is alive but *stuck* (a deadlock, a slow file system, a rank that
# took another branch) sends nothing and closes nothing: the others wait. Every process
# group has a timeout (`init_process_group(timeout=...)`, `new_group(timeout=...)`; gloo's
# default is 30 minutes, `default_pg_timeout` in `torch/distributed/constants.py`); when it
# runs out, gloo raises, the worker exits with an error and torchrun can restart the group.
# Below, rank 1 sleeps while rank 0 all-reduces on a group with a 3 s timeout.
#
# With NCCL, collectives run on the GPU and the Python call returns before they finish, so
# the exception cannot come from the call. ProcessGroupNCCL's **watchdog** thread checks the
# running collectives (the default timeout is 10 minutes); one that runs out makes it act as
# `TORCH_NCCL_ASYNC_ERROR_HANDLING` says (`ErrorHandlingMode`: 0 nothing, 1 tear the process
# down, 2 only abort the communicators, 3, the default, tear the process down without
# cleaning up: `getCvarInt(TORCH_NCCL_ASYNC_ERROR_HANDLING, 3 /*SkipCleanUp*/)` in
# `ProcessGroupNCCL.cpp`), so that torchrun sees a dead worker and restarts the group. The
# **flight recorder**, a ring buffer of each rank's last collectives, is on by default:
# `TORCH_FR_BUFFER_SIZE` (formerly `TORCH_NCCL_TRACE_BUFFER_SIZE`) sets its length, 2000
# unless set, 0 turns it off (`FlightRecorder.hpp`). Writing it out on a timeout is on by
# default too (`getCvarBool(TORCH_NCCL_DUMP_ON_TIMEOUT, true)` in `ProcessGroupNCCL.cpp`;
# torch's own tests set `TORCH_NCCL_DUMP_ON_TIMEOUT=0` where the dump would slow them), one
# file per rank named by `TORCH_FR_DUMP_TEMP_FILE`, so that you can see which rank was in
# which collective. The NCCL variables and the modes are declared in
# `torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp`.
#
# The watchdog itself can get stuck, in a CUDA or NCCL call that never returns, and then
# nothing times out. A second thread, the **heartbeat monitor**, watches the watchdog's
# heartbeat; if it has not moved for `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC` (8 minutes by
# default), the monitor tries to dump the flight recorder and ends the process, so that the
# job does not sit on its GPUs. `TORCH_NCCL_ENABLE_MONITORING=0` turns it off (both declared
# in `ProcessGroupNCCL.hpp`; the defaults are in `ProcessGroupNCCL.cpp`'s `HeartbeatMonitor`).
#
# Restarting every worker is not the only way back. A living process can tear down a broken
# group and build a new one with the survivors: `ProcessGroup.abort()` and `shutdown()`
# (`_abort_process_group` in `torch/distributed/distributed_c10d.py`, experimental and
# NCCL-only, says its docstring). torchft (github.com/pytorch/torchft) builds on this: the
# job is several replica groups, a failed group restarts and catches up from a healthy one
# while the others keep training. Chapter 09 showed how to read a hang's stacks; this part
# needs GPUs and is not run here.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 4. 集合通信不报错，而是卡住
#
# *死掉*的对端会关闭它的套接字，其他 rank 的下一次集合通信会立即失败（第 1 节）。活着但*卡住*的
# 对端（死锁、很慢的文件系统、走进了另一个分支的 rank）什么也不发，什么也不关：其他 rank 只能一
# 直等下去。每个进程组都有超时
# （`init_process_group(timeout=...)`、`new_group(timeout=...)`；gloo 的默认值是 30 分钟，见
# `torch/distributed/constants.py` 中的 `default_pg_timeout`）；超时一到，gloo 抛出异常，worker
# 带着错误退出，torchrun 就可以重启整个组。下面，rank 1 睡着不动，rank 0 在一个超时为 3 秒的进
# 程组上做全归约。
#
# 使用 NCCL 时，集合通信在 GPU 上执行，Python 调用在它们完成之前就返回了，所以异常不可能从调用
# 本身抛出。ProcessGroupNCCL 的**看门狗**（watchdog）线程检查正在执行的集合通信（默认超时为 10
# 分钟）；某次通信超时后，它按 `TORCH_NCCL_ASYNC_ERROR_HANDLING` 的设置处
# 理。`ErrorHandlingMode` 的取值：0 不处理；1 结束进程；2 只中止通信器；3 结束进程但不做清理，
# 这是默认值（`ProcessGroupNCCL.cpp` 中的
# `getCvarInt(TORCH_NCCL_ASYNC_ERROR_HANDLING, 3 /*SkipCleanUp*/)`）。这样 torchrun 会看到一个
# 死掉的 worker，并重启整个组。**飞行记录器**（flight recorder）即每个 rank 最近若干次集合通信
# 的环形缓冲区，默认就是打开的：`TORCH_FR_BUFFER_SIZE`（旧名 `TORCH_NCCL_TRACE_BUFFER_SIZE`）设
# 定它的长度，不设置时为 2000，设为 0 则关闭（见 `FlightRecorder.hpp`）。超时时把记录写出来，默
# 认也是打开的（`ProcessGroupNCCL.cpp` 中的 `getCvarBool(TORCH_NCCL_DUMP_ON_TIMEOUT, true)`；
# torch 自己的测试在转储会拖慢测试的地方设了 `TORCH_NCCL_DUMP_ON_TIMEOUT=0`），每个 rank 写一个
# 文件，文件名由 `TORCH_FR_DUMP_TEMP_FILE` 指定，这样就能看到哪个 rank 停在哪次集合通信上。NCCL
# 的这些变量和取值声明在 `torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp` 中。
#
# 看门狗自己也可能卡住，比如卡在一个永远不返回的 CUDA 或 NCCL 调用里，这时什么都不会超时。另一
# 个线程，即**心跳监视器**（heartbeat monitor），盯着看门狗的心跳；如果心跳在
# `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`（默认 8 分钟）内没有变化，它会尝试转储飞行记录器，然后结束
# 进程，免得作业一直占着 GPU。`TORCH_NCCL_ENABLE_MONITORING=0` 可以关掉它（两个变量都声明在
# `ProcessGroupNCCL.hpp` 中，默认值见 `ProcessGroupNCCL.cpp` 里的 `HeartbeatMonitor`）。
#
# 重启所有 worker 并不是唯一的恢复办法。活着的进程可以拆掉出故障的进程组，再和幸存的进程建一个
# 新组：`ProcessGroup.abort()` 和 `shutdown()`（`torch/distributed/distributed_c10d.py` 中的
# `_abort_process_group`，它的文档字符串说这是实验性接口，只支持 NCCL）。torchft
# （github.com/pytorch/torchft）就建立在这个基础上：作业由若干个副本组组成，一个组出故障后重
# 启，再从健康的组追上进度，其他组照常训练。第 09 章讲过怎样阅读卡住时的调用栈；这一部分需要
# GPU，这里不运行。

# %% tags=["lesson"]
for line in dl.spawn(recovery.collective_timeout, args=(3.0,), nprocs=2, backend="gloo", quiet=True):
    print(line)

# %% [markdown] lang="en" tags=["lesson"]
# ## 5. A host leaves, a host comes back: elastic membership
#
# So far a failure restarted the same workers on the same machines. With `--nnodes=1:2`
# torchrun accepts between one and two nodes: each node's **agent** (the `torchrun` process)
# joins a **rendezvous round**, and the round completes at once when two nodes have joined, or
# `last_call_timeout` after the first (`_add_to_participants` in
# `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`; 30 s by default, 3 s here).
# Each agent sends a heartbeat every `keep_alive_interval` (5 s by default, 2 s here); a node
# whose heartbeat is `keep_alive_max_attempt` (3) intervals old is dead and leaves the round
# (`_sanitize`, same file). The c10d rendezvous keeps its state in a TCPStore served by the agent
# on the endpoint's host (`_create_tcp_store` in `c10d_rendezvous_backend.py`): lose that host and
# the job is gone, so here host1 is the one taken away.
#
# What an agent does is in `_invoke_run` (`torch/distributed/elastic/agent/server/api.py`). It
# watches its workers; when one fails and restarts are left, it spends one of
# `--max-restarts`, stops **all** its workers (the healthy ones too), joins the next round and
# starts new workers with the new `RANK` and `WORLD_SIZE`. When its workers are healthy but a
# node waits to join (`num_nodes_waiting()`), it restarts them the same way *without* spending a
# restart: "membership changes do not count as retries". So every change of membership restarts
# every worker, and a run survives it only by resuming from a checkpoint (section 1).
#
# Below, two hosts (chapter 09's network namespaces) run chapter 08's program with step
# checkpoints in a folder both see (a shared file system on a real cluster), `--max-restarts=3`.
# Mid-run host1 is taken away twice, in two runs: first everything on it is killed (the machine
# dies), then only its network link goes down (`ip link set eth0 down`) while its processes live
# on. Each time host1 then comes back. The runs start now and take about three minutes
# together; where hosts cannot be built, the stored timelines of a real run are shown instead.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 5. 节点离开，节点回来：弹性的成员变化
#
# 到目前为止，出故障后重启的是同一批机器上的同一批 worker。用 `--nnodes=1:2` 时，torchrun 接受 1
# 到 2 个节点：每个节点的**代理**（agent），也就是 `torchrun` 进程本身，
# 会加入一轮**会合**（rendezvous round）；两个节点都加入时这一轮立即完成，否则在第一个节点加入
# `last_call_timeout` 之后完成（`torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`
# 中的 `_add_to_participants`；默认 30 秒，这里设为 3 秒）。每个代理每隔 `keep_alive_interval`
# 发送一次心跳（默认 5 秒，这里 2 秒）；如果某个节点的心跳已有 `keep_alive_max_attempt`（3）个
# 间隔没有更新，就认为它已死亡，把它移出这一轮（同一文件中的 `_sanitize`）。c10d 会合把状态放在一个
# TCPStore 里，由端点（endpoint）所在主机上的代理提供服务（`c10d_rendezvous_backend.py` 中的
# `_create_tcp_store`）：失去这台主机，整个作业就没了，所以这里让下线的是 host1。
#
# 代理的行为写在 `torch/distributed/elastic/agent/server/api.py` 的 `_invoke_run` 中。它监视
# 自己的 worker：某个 worker 失败且还有重启次数时，它用掉一次 `--max-restarts`，停掉自己**所
# 有**的 worker（健康的也停），加入下一轮会合，再用新的 `RANK` 和 `WORLD_SIZE` 启动新的
# worker。如果 worker 都健康，但有节点在等待加入（`num_nodes_waiting()`），它也这样重启，但
# *不*消耗重启次数：源码注释写的是“membership changes do not count as retries”（成员变化不算
# 重试）。所以成员的每一次变化都会重启所有 worker，训练要靠从检查点恢复（第 1 节）才能继续。
#
# 下面两台主机（第 09 章用网络命名空间搭出的主机）运行第 08 章的训练程序，每隔几步写一次的检查
# 点放在两台主机都能看到的目录里（真实集群上就是共享文件系统），`--max-restarts=3`。我们分两次运行，在训练中
# 途让 host1 下线：第一次杀掉它上面的所有进程（相当于机器宕机）；第二次只断开它的网络链路
# （`ip link set eth0 down`），进程都还活着。两次之后 host1 都会回来。两次运行现在就在后台开
# 始，一共大约三分钟；无法搭建主机时，显示一次真实运行保存下来的时间线。

# %% tags=["lesson"]
from ddp_lab.labs import elastic

runs = elastic.Runs()
print(" ".join(["torchrun", *elastic.torchrun(0, "CKPT")[3:]]).replace(":0 ", ":PORT "))

# %% [markdown] lang="en" tags=["lesson"]
# The first run's timeline: seconds since the start, the host, and the lines that matter
# (the program's own, and the agents' log lines, with `LOGLEVEL=INFO`). Read it for: host0's
# worker failing at once (the connection "reset" or "closed by peer": host1's sockets went
# with its processes), host0's agent spending a restart ("3/3 attempts left"), the next round
# completing with host1 gone (`group_world_size=1`), the program resuming with world size 1,
# the fresh torchrun on host1 waiting to join, host0's agent restarting its healthy worker
# for it ("Detected 1 new nodes") with `restart_count` still 1, and world size 2 again.

# %% [markdown] lang="zh" tags=["lesson"]
# 第一次运行的时间线：从开始算起的秒数、主机，以及值得看的那些行（程序自己的输出，以及设置
# `LOGLEVEL=INFO` 后代理的日志）。要看的是：host0 的 worker 立即失败（连接被对端重置或关闭，“reset/closed
# by peer”：host1 的进程一死，它的套接字也就没了）；host0 的代理用掉一次重启（“3/3 attempts
# left”）；下一轮会合在没有 host1 的情况下完成（`group_world_size=1`）；程序以 world size 1
# 恢复；host1 上新启动的 torchrun 等待加入；host0 的代理为它重启了自己健康的 worker
# （“Detected 1 new nodes”），`restart_count` 仍然是 1；world size 又回到 2。

# %% tags=["lesson"]
agent = runs["agent"]
agent.show()

# %% [markdown] lang="en" tags=["lesson"]
# What the change does to the training: the program keeps 32 samples per rank, so the
# **global batch** follows the world size, and with linear scaling (chapter 08) so does the
# LR; an epoch takes twice as many steps on one rank. The LR needs care: the step checkpoint
# holds the schedule (`LambdaLR.state_dict()` keeps `base_lrs`) and the optimizer's groups
# with the old world's LR, and loading them would bring that LR back. So after loading, the
# program gives the schedule this world's base LR at the step it had reached
# (`train.rescale_schedule`), and the line it prints shows the optimizer's LR. The checkpoint's data position carries
# over (the sampler counts used samples, not steps), but the per-rank random state of 2 ranks
# cannot be dealt out to 1, and the program says so: an elastic run is a correct run, but no
# longer bit for bit the run that nothing interrupted. A program could keep the global batch
# fixed instead (more samples per rank, or gradient accumulation), and with it the LR. The
# rendezvous after the failure waited for the dead node's heartbeat to expire (3 × 2 s) and
# for `last_call_timeout` (3 s); the restarts each cost the program's start-up as well.

# %% [markdown] lang="zh" tags=["lesson"]
# 成员变化对训练意味着什么：程序保持每个 rank 32 个样本，所以**全局批大小**（global batch）随
# world size 变化；按线性缩放规则（第 08 章），学习率也随之变化；只剩一个 rank 时，一轮要走两倍
# 的步数。学习率要小心处理：步级检查点里存着学习率调度（`LambdaLR.state_dict()` 保存了
# `base_lrs`）和优化器的参数组，两者都是旧 world size 下的学习率，直接加载就会把那个学习率带回
# 来。所以程序加载之后，把这个 world size 的基础学习率交给调度器，并保持它已经走到的步数
# （`train.rescale_schedule`）；它打印的那一行显示的是优化器实际使用的学习率。检查点中的数据位置可以沿用（采样器记的是用掉了多少样本，而不是多少步），但 2 个 rank
# 各自的随机数状态没法分给 1 个 rank，程序也明确说了这一点：弹性运行是正确的运行，但不再与从未
# 中断的运行逐位相同。程序也可以改为固定全局批大小（每个 rank 多取样本，或者用梯度累积），学习
# 率也就不变。故障之后的那轮会合要等死去节点的心跳过期（3 × 2 秒），再等 `last_call_timeout`（3 秒）；
# 每次重启还要加上程序本身的启动时间。

# %% tags=["lesson"]
for t, world, batch, lr in agent.worlds():
    print(f"{t:5.1f} s: world size {world}, global batch {batch}, lr {lr:g}")
print("host0's restart_count at each round:", [n for _, h, n in agent.restart_counts() if h == "host0"])
print("exit codes:", agent.returncodes)

# %% [markdown] lang="en" tags=["lesson"]
# The second run: host1's link goes down and nothing is closed. Its packets are simply lost,
# so host0's worker waits inside a collective until the process group's timeout, 8 s here
# (`python -m ddp_lab.tools.train --timeout 8`, passed to `init_process_group`; section 4), and only
# then fails ("Timed out waiting 8000ms", or "Application timeout caused pair closure": the
# operation whose wait runs out first closes every pair of the group, and the others in
# flight fail with that message; `UnboundBuffer::waitRecv` in gloo's
# `gloo/transport/tcp/unbound_buffer.cc`). With torch's default of 30 minutes the job would
# sit that long. From there it goes as before. When the link is back, host1's agent reaches
# the store on host0 again: its own worker timed out too, so it spends one of its restarts
# and joins the next round, and host0's agent restarts its workers for it. How soon depends
# on TCP: while the link is down, the kernel retransmits the agent's pending request at
# growing intervals, so the next attempt may come many seconds after the link is back. If
# host1's agent has not reached the store within 40 s (its "Worker group FAILED" line is the
# sign), we kill what is left on it and start a fresh torchrun, as an operator (or the
# scheduler) would; the timeline says which happened. Once its worker
# ends, each agent waits for the others at an exit barrier ("Waiting 300 seconds for other
# agents to finish": `_exit_barrier`, same file).

# %% [markdown] lang="zh" tags=["lesson"]
# 第二次运行：host1 的链路断开，但什么都没有关闭。它的数据包只是丢了，所以 host0 的 worker 在
# 集合通信里一直等到进程组超时才失败（“Timed out waiting 8000ms”，也可能是“Application timeout
# caused pair closure”：最先等到超时的那个操作会关闭进程组的所有连接对，其他还在进行的操作就带着
# 这条消息失败；见 gloo 的 `gloo/transport/tcp/unbound_buffer.cc` 中的
# `UnboundBuffer::waitRecv`），这里超时是 8 秒
# （`python -m ddp_lab.tools.train --timeout 8`，传给 `init_process_group`；见第 4 节）。如果用
# torch 默认的 30 分钟，作业就会卡这么久。之后的过程和第一次一样。链路恢复后，host1 的代理又
# 能连上 host0 上的 store：它自己的 worker 也已经超时失败，于是它用掉一次重启，加入下一轮会
# 合，host0 的代理再为它重启自己的 worker。多久能回来取决于 TCP：链路断开期间，内核按越来越长
# 的间隔重传代理尚未送达的请求，所以下一次重传可能在链路恢复好几秒之后才发生。如果 40 秒内
# host1 的代理还没有重新连上 store（标志是它打出的那行“Worker group FAILED”），我们就像运维人员
# （或调度器）那样，杀掉它上面剩下的进程，重新启动一个 torchrun；时间线会说明实际发生的是哪一种。worker 结束后，每个代理都在退出屏障处等待其他代理
# （`Waiting 300 seconds for other agents to finish`：同一文件中的 `_exit_barrier`）。

# %% tags=["lesson"]
link = runs["link"]
link.show()
print([w[1] for w in link.worlds()], link.returncodes)

# %% [markdown] lang="en" tags=["lesson"]
# ## 6. Preemption under Slurm: a warning, a checkpoint, a requeue
#
# On a shared cluster a job ends when its time limit comes, or earlier when the scheduler
# preempts it for a job of higher priority. At the time limit Slurm sends SIGTERM to the job's
# processes and SIGKILL `KillWait` seconds later (30 by default, `man slurm.conf`); whatever
# was not saved by then is lost. A job can ask for a warning before the time limit: `#SBATCH
# --signal=USR1@60` sends SIGUSR1 to every job step about 60 s before it ("up to 60 seconds
# earlier" than asked, says `man sbatch`; `B:USR1@60` would signal only the batch shell).
# Preemption gives no such warning by default: Slurm sets the job's end time to now plus the
# partition's `GraceTime` (0 by default) and sends SIGCONT and SIGTERM at once, then SIGCONT,
# SIGTERM and SIGKILL at the new end time (slurm.schedmd.com/preempt.html); the `--signal`
# signal comes at preemption only where the site sets `PreemptParameters=send_user_signal`,
# and with `PreemptMode=REQUEUE` Slurm requeues the job itself. So a program must checkpoint
# on SIGTERM too. `#SBATCH --requeue` lets the job go back to the queue; requeued, the batch script
# starts again from its first line, with the same job id and `SLURM_RESTART_COUNT` set, and
# `--open-mode=append` keeps the output of both runs in one file.
#
# The job below puts it together. torchrun handles SIGTERM, SIGINT, SIGHUP and SIGQUIT by
# default; `--signals-to-handle` replaces that list, so the script gives all of them plus
# SIGUSR1, and the agent passes each on to its workers
# instead of dying of it (`_invoke_run`'s caller `run` in `torch/distributed/elastic/agent/
# server/api.py`: on a `SignalException` it shuts the workers down with that signal).
# `python -m ddp_lab.tools.train --preempt-signal USR1` notes SIGUSR1 or SIGTERM (it always adds
# TERM), and after every step all
# ranks all-reduce that note (`resume.StopOnSignal`), so that they stop after the same step:
# a rank that stopped alone would leave the others in a collective. Then a checkpoint, a file
# `preempted`, and the script requeues its own job with `scontrol requeue`. A second, identical
# job runs straight through for comparison. Rather than wait for the time limit, the demo sends
# the same warning with `scancel --signal=USR1 JOBID` once the job has written a checkpoint.
# Slurm holds a requeued job for `cred_expire` seconds before it may start again (120 by
# default, `AuthInfo` in `man slurm.conf`); the demo shortens the wait with
# `scontrol update JobId=… StartTime=now+2`. Not `now`: each node's slurmd refuses a credential
# created in the same second as the revocation of the job's previous run (`ctime <= revoked`,
# whole seconds, in `_credential_revoked`: `src/common/slurm_cred.c` in Slurm 22.05,
# `src/slurmd/slurmd/cred_context.c` in later releases), and the job would fail with "Job
# credential revoked" now and then. It starts now and takes about two minutes.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 6. Slurm 下的抢占：预警、检查点、重新排队
#
# 在共享集群上，作业会在时间限制到达时结束；如果调度器要给优先级更高的作业让路，还会提前抢占
# （preempt）它。到达时间限制时，Slurm 先向作业的进程发送 SIGTERM，`KillWait` 秒之后再发送
# SIGKILL（默认 30 秒，见 `man slurm.conf`）；到那时还没保存的东西就丢了。作业可以要求提前得到
# 预警：`#SBATCH --signal=USR1@60` 在时间限制前大约 60 秒向每个作业步（job step）发送
# SIGUSR1（`man sbatch` 说，信号可能比指定的时刻最多早 60 秒发出；写成 `B:USR1@60` 则只发给批处理脚本所在的 shell）。抢占默认没有这样的预警：Slurm 把作
# 业的结束时间设为当前时间加上分区的 `GraceTime`（默认为 0），立即发送 SIGCONT 和 SIGTERM，到
# 新的结束时间再依次发送 SIGCONT、SIGTERM 和 SIGKILL（slurm.schedmd.com/preempt.html）；只有
# 站点设置了 `PreemptParameters=send_user_signal`，抢占时才会发送 `--signal` 指定的信号；设置
# 了 `PreemptMode=REQUEUE` 时，Slurm 会自己把作业重新排队。所以程序在收到 SIGTERM 时也必须写检
# 查点。`#SBATCH --requeue` 允许作业回到队列中；重新排队（requeue）后，批处理脚本从第
# 一行重新开始执行，作业号不变，并设置 `SLURM_RESTART_COUNT`；`--open-mode=append` 让两次运
# 行的输出写进同一个文件。
#
# 下面的作业把这些组合在一起。torchrun 默认处理 SIGTERM、SIGINT、SIGHUP 和 SIGQUIT；
# `--signals-to-handle` 会替换这个列表，所以脚本把它们全部列出，再加上 SIGUSR1，代理就会把每个
# 信号转发给它的 worker，而不是被它杀死
# （`torch/distributed/elastic/agent/server/api.py` 中调用 `_invoke_run` 的 `run`：捕获到
# `SignalException` 时，用这个信号关闭 worker）。`python -m ddp_lab.tools.train --preempt-signal
# USR1` 记下收到的 SIGUSR1 或 SIGTERM（它总会加上 TERM），每一步之后所有 rank 对这个标记做一次
# 全归约（`resume.StopOnSignal`），
# 这样它们会在同一步之后停下：单独停下的 rank 会让其他 rank 卡在集合通信里。随后写检查点和一个
# `preempted` 文件，脚本再用 `scontrol requeue` 把自己的作业重新排队。另一个完全相同的作业一口
# 气跑完，用来对比。演示不去等时间限制，而是在作业写出检查点之后，用
# `scancel --signal=USR1 JOBID` 发出同样的预警。重新排队的作业要等 `cred_expire` 秒才能再次
# 启动（默认 120 秒，见 `man slurm.conf` 中的 `AuthInfo`）；演示用
# `scontrol update JobId=… StartTime=now+2` 省掉这段等待。不用 `now`，是因为每个节点的 slurmd
# 会拒绝与上一次运行的凭证被吊销处在同一秒内创建的凭证（`_credential_revoked` 中的
# `ctime <= revoked`，以整秒计；Slurm 22.05 在 `src/common/slurm_cred.c`，之后的版本在
# `src/slurmd/slurmd/cred_context.c`），作业偶尔会以“Job credential revoked”失败。
# 它现在开始运行，大约需要两分钟。

# %% tags=["lesson"]
from ddp_lab.labs import preemption

preempt = preemption.Runs()
print(preemption.script("preempted", "FOLDER", "CHECKPOINTS"))

# %% [markdown] lang="en" tags=["lesson"]
# What this module did and when, then the two jobs' output: the preempted job's two runs
# (`SLURM_RESTART_COUNT` 0 and 1), the step after which it stopped, the resume from that
# checkpoint, and the two final digests.

# %% [markdown] lang="zh" tags=["lesson"]
# 先看 `preemption` 模块在各个时刻做了什么，再看两个作业的输出：被抢占作业的两次运行
# （`SLURM_RESTART_COUNT` 为 0 和 1）、它在哪一步之后停下、从那个检查点恢复，以及两个最终摘要。

# %% tags=["lesson"]
job = preempt.run
print("\n".join(job.events))
job.show("straight")
job.show("preempted")
straight_sha, preempted_sha = job.digests()
print("same parameters, bit for bit:", straight_sha is not None and straight_sha == preempted_sha)

# %% [markdown] lang="en" tags=["lesson"]
# ## 7. What a checkpoint costs
#
# One run, 2 ranks, rounds that alternate: 20 training steps of chapter 08's model, one
# `torch.save` checkpoint (`resume.save_step`: gather the RNG states, rank 0 writes the full
# state atomically, barrier) and one `dcp.save` (every rank writes its part; for DDP the
# state is replicated and DCP's planner has each item written once). With a checkpoint every
# K steps, a run gets slower by checkpoint time / (K × step time); `smallest_every` finds the
# smallest K that keeps this under 10 % on this machine. On a big model the ratio is what
# matters, and it is why large runs use sharded, asynchronous saves.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 7. 一个检查点的代价
#
# 一次运行、2 个 rank，若干轮交替进行，每轮做三件事：第 08 章模型的 20 个训练步；一次
# `torch.save` 检查点；一次 `dcp.save`。`torch.save` 检查点就是 `resume.save_step`：收集随机数
# 状态，由 rank 0 原子地写出完整状态，最后过一道屏障（barrier）。`dcp.save` 则让每个 rank 写出
# 自己那部分；DDP 的状态在各 rank 上是相同的副本，DCP 的规划器让每一项只写一次。如果每 K 步写一
# 次检查点，运行时间会多出“检查点时间 / (K × 单步时间)”这个比例；`smallest_every` 找出在这台机
# 器上让这个比例低于 10% 的最小 K。对大模型来说，要紧的正是这个比例，这也是大规模训练采用分片、
# 异步保存的原因。

# %% tags=["lesson"]
cost = dl.spawn(recovery.checkpoint_cost, args=(str(WORK / "cost"),), nprocs=2, backend="gloo", quiet=True)[0]
print(f"one step {1000 * cost['step']:.1f} ms")
for kind in ("torch.save", "dcp.save"):
    k = recovery.smallest_every(cost, kind=kind)
    print(f"{kind}: {1000 * cost[kind]:.1f} ms, {cost[kind + ' bytes'] / 1e3:.0f} kB; "
          f"every {k} steps costs {100 * recovery.overhead(cost, k, kind):.1f} %")

# %% [markdown] lang="en" tags=["lesson"]
# That is half of the trade-off. A failure loses the work done since the last checkpoint,
# half an interval on average. With a checkpoint every τ seconds that cost C seconds each,
# and M the job's mean time between failures (a node's divided by the number of nodes), the
# fraction of time lost is about C/τ for writing plus τ/(2M) for redone work, smallest at
# **τ ≈ √(2·C·M)** (Young, "A first order approximation to the optimum checkpoint interval",
# 1974; Daly, 2006, refines it for when C is not small next to M). No failures were measured
# here, so the cell takes this machine's C and two assumed values of M; it also shows the
# loss at ten times fewer and ten times more checkpoints.

# %% [markdown] lang="zh" tags=["lesson"]
# 这只是取舍的一半。一次故障会丢掉上一个检查点之后做的工作，平均是半个间隔。设每 τ 秒写一个检
# 查点、每个耗时 C 秒，M 是整个作业的平均故障间隔时间（单个节点的平均故障间隔除以节点数），那么
# 损失的时间比例约为写检查点的 C/τ 加上重做工作的 τ/(2M)，在 **τ ≈ √(2·C·M)** 时最小（Young，
# “A first order approximation to the optimum checkpoint interval”，1974；Daly 在 2006 年针对 C
# 相对 M 不算小的情况做了修正）。这里没有实测过故障，所以下面的单元用这台机器上测得的 C 和两个
# 假设的 M 来算，同时给出检查点少写十倍、多写十倍时的损失。

# %% tags=["lesson"]
C = cost["dcp.save"]
for hours in (24, 2):  # assumed mean time between failures of the whole job
    M = 3600 * hours
    tau = (2 * C * M) ** 0.5
    lost = {name: 100 * (C / t + t / (2 * M)) for name, t in (("10x fewer", 10 * tau), ("optimum", tau), ("10x more", tau / 10))}
    print(f"M = {hours:2d} h: every {tau:5.1f} s = {tau / cost['step']:5.0f} steps; time lost "
          + ", ".join(f"{name} {pct:.2f} %" for name, pct in lost.items()))

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise: make a training loop resumable, bit for bit (5 points)
#
# `recovery.resumable_loop` (shown below) trains an MLP with dropout on 2 or 3 ranks, each
# epoch on inputs of its own (the data augmented afresh); every step draws noise from torch,
# its scale from numpy and a sign flip from Python's `random`, and an LR schedule lowers the
# LR at every step. Write
# `save_state(folder, model, optimizer, scheduler, sampler, step)`, called on every rank
# after the step where the run is stopped, and
# `load_state(folder, model, optimizer, scheduler, sampler)`, called on every rank of a
# fresh launch before training goes on; it returns the step. Every rank has its own random
# state: save each rank's.
#
# The graded cell stops the loop at a hidden step, resumes it in new processes, and compares
# with a run that was never stopped (hidden cases: shuffling on or off, the step, world size
# 2 or 3). The new processes start with other seeds and are not told the step: what the run
# had at the stop comes back only from your files. The final parameters must be equal bit
# for bit; if not, the feedback names the first thing that differed (the random state, the
# sampler's position, the optimizer, the LR schedule).

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习：让训练循环可以逐位精确地恢复（5 分）
#
# `recovery.resumable_loop`（源码见下）在 2 个或 3 个 rank 上训练一个带 dropout 的 MLP，每一轮
# 用一份自己的输入（数据重新做过增强）；每一步用 torch 抽取噪声，用 NumPy 抽取噪声的幅度，用
# Python 的 `random` 决定是否翻转符号；学习率调度每一步都把学习率调低一些。请编写
# `save_state(folder, model, optimizer, scheduler, sampler, step)`：运行停下的那一步结束之后，
# 每个 rank 都会调用它；以及 `load_state(folder, model, optimizer, scheduler, sampler)`：新启动
# 的各个 rank 在继续训练之前调用它，它返回保存时的步数。每个 rank 都有自己的随机数状态：每个 rank 的状态
# 都要保存。
#
# 评分单元在一个隐藏的步数处停下循环，在新的进程中恢复，再与从未停下的运行比较（隐藏用例：是否
# 打乱、停下的步数、world size 为 2 或 3）。新进程用另外的随机种子启动，也不会被告知停在哪一步：
# 停下时训练的状态只能从你保存的文件里恢复。最终参数必须逐位相同；否则反馈会指出最先出现差异的
# 部分（随机数状态、采样器位置、优化器、学习率调度）。

# %% tags=["exercise"]
dl.show_source(recovery.resumable_loop)

# %% tags=["exercise"]
import random

import numpy as np
import torch.distributed as dist


def save_state(folder, model, optimizer, scheduler, sampler, step):
    ### BEGIN SOLUTION
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": sampler.state_dict(),
        "step": step,
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }
    resume.save_atomic(state, Path(folder) / f"rank{dist.get_rank()}.pt")
    ### END SOLUTION


def load_state(folder, model, optimizer, scheduler, sampler):
    ### BEGIN SOLUTION
    state = torch.load(Path(folder) / f"rank{dist.get_rank()}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return state["step"]
    ### END SOLUTION


# %% tags=["grade"] grade_id="11.resume" points=5
dl.grade("11.resume", save_state, load_state)

# %% [markdown] lang="en"
# ## What to remember
#
# - A checkpoint that resumes exactly holds the model, the optimizer, the LR schedule, the
#   step, the sampler's epoch and position, and every rank's random state.
# - Write it to a temporary name, `fsync`, rename: complete or absent.
# - Sharded checkpoints (`dcp.save`/`dcp.load`) are written by every rank and load on
#   another world size; a rank's `torch.save` of its shard is not a checkpoint. Give each
#   DCP checkpoint a new folder (its data files are written under their final names), and
#   per-rank state per-rank keys (a key several ranks save is kept once).
# - A dead peer fails the next collective; a stuck one only fails at the group's timeout
#   (NCCL: the watchdog and the flight recorder). Then torchrun restarts from the checkpoint.
# - `--nnodes=1:2`: a node that leaves or joins restarts every worker with the new world size
#   (a failure spends one of `--max-restarts`, a join does not); the global batch and the LR
#   change with it unless the program keeps them.
# - Under Slurm: `--signal=USR1@60` (a warning before the time limit) and `--requeue`;
#   preemption sends SIGTERM, so handle it too; torchrun `--signals-to-handle` with the
#   defaults plus SIGUSR1; all ranks stop after the same step, checkpoint, `scontrol requeue`.

# %% [markdown] lang="zh"
# ## 小结
#
# - 能精确恢复的检查点包含：模型、优化器、学习率调度、步数、采样器所在的轮和位置，以及每个
#   rank 的随机数状态。
# - 先写入临时文件，`fsync` 之后再重命名：要么完整，要么没有。
# - 分片检查点（`dcp.save`/`dcp.load`）由每个 rank 写出，可以在另一个 world size 上加载；
#   一个 rank 对自己的分片调用 `torch.save` 不算检查点。每个 DCP 检查点都写进新目录（它的数据文
#   件直接以最终的名字写出）；每个 rank 自己的状态要用带 rank 的键（几个 rank 都保存的键只留一份）。
# - 死掉的对端让下一次集合通信失败；卡住的对端要等到进程组超时才会失败（NCCL：看门狗和飞行
#   记录器）。然后 torchrun 从检查点重启。
# - `--nnodes=1:2`：节点离开或加入都会以新的 world size 重启所有 worker（失败会用掉一次
#   `--max-restarts`，加入不会）；除非程序自己保持不变，全局批大小和学习率都会随之改变。
# - 在 Slurm 下：`--signal=USR1@60`（时间限制之前的预警）和 `--requeue`；抢占发送的是
#   SIGTERM，也要处理它；torchrun 的 `--signals-to-handle` 写上默认的信号再加 SIGUSR1；所有
#   rank 在同一步之后停下，写检查点，再 `scontrol requeue`。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`11.concepts`,
# 2 points when all are right).
#
# **1.** A resume restores the model and the optimizer but not the RNG states nor the sampler's position. Training goes on. Compared with the run that was never interrupted, the final parameters are:
#
# - (a) different: other data order and dropout masks after the resume
# - (b) the same, bit for bit
# - (c) resuming fails
# - (d) the same up to rounding
#
# **2.** Why write a checkpoint to a temporary file, `fsync` it, and then `os.replace` it over the final name?
#
# - (a) to save disk space
# - (b) it is faster
# - (c) `torch.save` needs it
# - (d) a crash at any moment leaves either the old complete file or the new complete one, never a torn one
#
# **3.** One training step takes 50 ms and one checkpoint 400 ms. What is the smallest K (a checkpoint every K steps) that keeps the checkpoints' cost at most 10 % of the training time? (a number)
#
# **4.** A model was saved with `dcp.save` from 2 ranks. Can 3 ranks load it?
#
# - (a) yes: each rank reads the pieces that overlap the rows it holds now (resharding), from the `.metadata` file's map
# - (b) no: the world size must match
# - (c) only rank 0 can
# - (d) only after converting it with `torch.save`


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`11.concepts`，全部答对得 2 分）。
#
# **1.** 恢复训练时还原了模型和优化器，但没有还原随机数状态和采样器的位置。训练继续进行。和从未中断的那次运行相比，最终参数：
#
# - (a) 不同：恢复之后的数据顺序和 dropout 掩码都变了
# - (b) 逐位相同
# - (c) 恢复失败
# - (d) 在舍入误差范围内相同
#
# **2.** 为什么要先把检查点写到临时文件、`fsync`，再用 `os.replace` 覆盖到最终文件名？
#
# - (a) 为了省磁盘空间
# - (b) 更快
# - (c) `torch.save` 要求这样
# - (d) 无论何时崩溃，留下的要么是完整的旧文件，要么是完整的新文件，绝不会是写了一半的
#
# **3.** 训练一步需要 50 毫秒，保存一次检查点需要 400 毫秒。要让检查点的开销不超过训练时间的 10%，最小的 K（每 K 步保存一次）是多少？（填一个数）
#
# **4.** 一个模型在 2 个 rank 上用 `dcp.save` 保存。3 个 rank 能加载它吗？
#
# - (a) 能：每个 rank 根据 `.metadata` 文件的映射，读取与它现在持有的行有重叠的那些块（重新分片）
# - (b) 不能：world size 必须一致
# - (c) 只有 rank 0 可以
# - (d) 只有先用 `torch.save` 转换之后才行


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: "a",  # a letter
    2: "d",  # a letter
    3: 80,  # a number
    4: "a",  # a letter
    ### END ANSWERS
}
dl.quiz("11", my_answers)


# %% tags=["grade"] grade_id="11.concepts" points=2
dl.grade("11.concepts", my_answers)
