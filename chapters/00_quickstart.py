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
#       en: "00 Welcome and quickstart"
#       zh: "00 欢迎与快速上手"
# ---

# %% [markdown] lang="en"
# # 00 Welcome and quickstart
#
# This course teaches PyTorch data-parallel training from the inside: you will run
# several **processes** (one per **rank**) from this notebook, watch them talk to each
# other through **collectives** such as **all-reduce**, and rebuild `DataParallel`,
# the ring all-reduce and `DistributedDataParallel` yourself. Everything runs on a laptop
# CPU with the `gloo` backend; on a machine with GPUs the same cells use `nccl`.
#
# **How to use the course.** Lessons are in `notebooks/en/`, exercises in
# `exercises/en/` (solutions in `solutions/en/`). The Chinese edition is in the `zh`
# folders; the code is the same in both. Run cells from top to bottom with
# Shift+Enter.
#
# **Setup.** `bash setup.sh` installed everything here, with the kernel "Python 3
# (ddp-lab)" that these notebooks use. The `ddp-lab` command works in JupyterLab's own
# terminals, and in any other shell after `source .venv/bin/activate`. No GPU? Then
# `TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash setup.sh` takes PyTorch's CPU
# build instead of the multi-GB CUDA one; for slow downloads (pip mirrors in mainland
# China, a shallow `git clone`) see the README, "No GPU, or a slow network". Work on a
# copy of each exercise: `ddp-lab exercise 00` copies this chapter's to `work/en/`, which
# git ignores, so that `git pull` updates the course without touching your answers.
#
# Code and its comments are in English in both editions, and so is what PyTorch prints (logs,
# errors): that is the text you will search for. The course's own messages, plots and
# tables are in your edition's language.

# %% [markdown] lang="zh"
# # 00 欢迎与快速上手
#
# 本课程带你深入 PyTorch 数据并行训练的内部机制：你将在这个 notebook 里启动多个**进程**
# （process），每个进程是一个 **rank**（进程编号）；观察它们如何通过**集合通信**
# （collective）交换数据，例如**全归约**（all-reduce），并亲手重写 `DataParallel`、
# 环形全归约（ring all-reduce）和 `DistributedDataParallel`。所有内容都能在笔记本电脑的 CPU 上用 `gloo` 后端运行；
# 在有 GPU 的机器上，同样的代码单元会使用 `nccl`。
#
# **如何使用本课程**。课程正文在 `notebooks/zh/`，练习在 `exercises/zh/`
# （参考答案在 `solutions/zh/`）。英文版在 `en` 文件夹中，两种语言的代码完全相同。
# 用 Shift+Enter 从上到下依次运行代码单元。
#
# **安装**。`bash setup.sh` 已经装好了这里用到的一切，包括这些 notebook 使用的内核
# “Python 3 (ddp-lab)”。`ddp-lab` 命令在 JupyterLab 自带的终端里可以直接使用，在其他终端里
# 先运行 `source .venv/bin/activate`。没有 GPU 时，用
# `TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash setup.sh` 安装 PyTorch 的 CPU 版，
# 而不是几个 GB 的 CUDA 版。下载很慢时（例如在中国大陆），可以改用 pip 镜像、用
# `git clone --depth 1` 浅克隆，做法见 README 的“没有 GPU，或网络较慢”一节。练习请在副本上作答：
# `ddp-lab exercise 00 --lang zh` 把本章练习复制到 `work/zh/`，git 忽略这个目录，
# `git pull` 更新课程时不会动到你的答案。
#
# 代码和注释在两种语言版本中都是英文，PyTorch 打印的日志和报错也是英文：遇到问题时，你要搜索
# 的正是这些原文。课程自己的提示信息、图和表格则使用你所选版本的语言。

# %%
import torch
import torch.distributed as dist

import ddp_lab as dl

dl.setup()  # picks this notebook's language and a font that can draw Chinese
print(torch.__version__, "| CUDA available:", torch.cuda.is_available())
print(dl.doctor.torch_check())  # the course needs torch >= 2.13: what an older one lacks

# %% [markdown] lang="en"
# ## Several processes from one notebook: `dl.spawn`
#
# `dl.spawn(fn, args=(...), nprocs=N)` works like `torch.multiprocessing.spawn`: it calls
# `fn(rank, *args)` in `N` separate processes. Unlike `mp.spawn`, it accepts functions
# defined in a notebook cell, prints each rank's output in rank order, and returns what
# each rank returned. Each rank finds `MASTER_ADDR`, `MASTER_PORT` (a free port chosen
# for this call), `RANK` and `WORLD_SIZE` in its environment, so
# `dist.init_process_group("gloo")` needs no other arguments.

# %% [markdown] lang="zh"
# ## 在一个 notebook 里启动多个进程：`dl.spawn`
#
# `dl.spawn(fn, args=(...), nprocs=N)` 的用法与 `torch.multiprocessing.spawn` 相同：
# 它在 `N` 个独立进程中调用 `fn(rank, *args)`。与 `mp.spawn` 不同的是，它可以运行在
# notebook 单元里定义的函数，按 rank 顺序打印每个 rank 的输出，并返回每个 rank 的返回值。
# 每个 rank 的环境变量中都有 `MASTER_ADDR`、`MASTER_PORT`（本次调用挑选的空闲端口）、
# `RANK` 和 `WORLD_SIZE`，所以 `dist.init_process_group("gloo")` 不需要其他参数。

# %%
def hello(rank, greeting):
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)  # every rank ends with the sum 0 + 1 + ... + (N-1)
    print(f"{greeting} from rank {rank} of {dist.get_world_size()}, sum = {t.item()}")
    return rank * 10


results = dl.spawn(hello, args=("hello",), nprocs=4)
print(results)

# %% [markdown] lang="en"
# ## The `%%ddp` cell magic
#
# For short experiments, `%%ddp -n N` runs the body of a cell on `N` ranks with the
# **process group** already initialised. Inside the cell, `rank`, `world_size` and
# `device` are defined, and names from earlier cells (like `hello` above) can be used.

# %% [markdown] lang="zh"
# ## `%%ddp` 单元魔法命令
#
# 做小实验时，`%%ddp -n N` 会在 `N` 个 rank 上运行整个单元，并且**进程组**（process group）
# 已经初始化好。单元内可以直接使用 `rank`、`world_size` 和 `device`，也可以使用前面单元里
# 定义的名字（比如上面的 `hello`）。

# %%
# %%ddp -n 2
x = torch.ones(3) * (rank + 1)
dist.all_reduce(x)
print(f"rank {rank}/{world_size} on {device}: {x.tolist()}")

# %% [markdown] lang="en"
# When a rank fails, the launcher stops the other ranks and raises one error that names
# the failing rank and shows its traceback (printed below). A deadlock (every rank waiting
# in communication, none computing) is reported after a few seconds with the line each
# rank waits at; any other hang ends at the timeout (120 s by default) with the stack of
# every stuck rank.

# %% [markdown] lang="zh"
# 当某个 rank 出错时，启动器会停止其他 rank，并抛出一个异常，指明是哪个 rank 出错，
# 附上它的 traceback（下面会打印出来）。如果发生死锁（每个 rank 都在等待通信，没有一个在
# 计算），几秒后就会报告每个 rank 卡在哪一行；其他卡住的情况要到超时（默认 120 秒）才结束，
# 并打印每个卡住的 rank 的调用栈。

# %%
def fails_on_rank_1(rank):
    if rank == 1:
        raise ValueError("something went wrong on this rank")
    return "ok"


try:
    dl.spawn(fails_on_rank_1, nprocs=2)
except dl.DistributedError as err:
    print("failed ranks:", err.ranks)
    print(err)

# %% [markdown] lang="en"
# ## Ranks that stay: `dl.start` and `%%ranks`
#
# `dl.spawn` and `%%ddp` start new processes for every call, so whatever a rank made is
# gone when the cell ends. To explore step by step, start **persistent** ranks instead:
# `dl.start(2)` launches 2 processes and initialises the process group once. Each rank
# keeps its own variables, and a cell that starts with `%%ranks` runs on every rank, so
# what one cell makes is still there in the next.

# %% [markdown] lang="zh"
# ## 常驻的 rank：`dl.start` 与 `%%ranks`
#
# `dl.spawn` 和 `%%ddp` 每次调用都会启动新的进程，所以单元结束时 rank 上创建的东西都会
# 消失。想一步一步地探索时，可以改用**常驻**的 rank：`dl.start(2)` 启动 2 个进程，并且只
# 初始化一次进程组。每个 rank 保留自己的变量；以 `%%ranks` 开头的单元会在每个 rank 上运行，
# 所以上一个单元创建的变量在下一个单元里仍然存在。

# %%
dl.start(2)

# %%
# %%ranks
x = torch.full((3,), float(rank + 1), device=device)
print(f"rank {rank} made x = {x.tolist()}")

# %%
# %%ranks
dist.all_reduce(x)  # the same processes as in the cell above: x is still there
print(f"rank {rank} after all_reduce: x = {x.tolist()}")

# %% [markdown] lang="en"
# `dl.pull("x")` brings each rank's value back into the notebook, as a list in rank order
# (tensors come back on the CPU). `dl.push(name=value)` sends a notebook value to the
# ranks, and `%%ranks -r 1` runs a cell on rank 1 only. `dl.status()` shows which ranks are
# alive, their process id, device and what they are running.

# %% [markdown] lang="zh"
# `dl.pull("x")` 把每个 rank 上的值取回 notebook，结果是按 rank 顺序排列的列表（张量会被
# 放到 CPU 上）。`dl.push(name=value)` 把 notebook 里的值发送给各个 rank，`%%ranks -r 1`
# 只在 rank 1 上运行一个单元。`dl.status()` 显示哪些 rank 还活着，以及它们的进程号、设备
# 和正在运行的内容。

# %%
values = dl.pull("x")
print(values)
dl.push(bonus=100)

# %%
# %%ranks -r 1
print(x.sum().item() + bonus)

# %%
dl.status()

# %% [markdown] lang="en"
# An exception on some ranks shows each rank's traceback and keeps the ranks and their
# variables. A hang ends at the timeout with every stuck rank's stack, and the ranks are
# restarted: then every variable on them is lost, and the message says so. When you are
# done, `dl.stop()` ends the ranks (closing the notebook or restarting the kernel does too).

# %% [markdown] lang="zh"
# 如果某些 rank 抛出异常，会显示每个 rank 的 traceback，rank 和它们的变量都会保留。如果
# 程序卡住，到达超时时间后会打印每个卡住的 rank 的调用栈，并重启这些 rank：这时它们上面的
# 变量全部丢失，报错信息会明确说明这一点。用完之后，`dl.stop()` 结束这些 rank（关闭
# notebook 或重启内核也会结束它们）。

# %%
dl.stop()

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise: the mean over ranks (2 points)
#
# Write `average_across_ranks(value)`: every rank passes its own tensor `value`, and every
# rank must get back the element-wise mean of all ranks' tensors, in their dtype, and the
# caller's tensor must be left as it was. Use `dist.all_reduce` (which sums by default) and
# `dist.get_world_size()`. The graded cell runs your function on hidden world sizes, shapes
# and dtypes and compares it with PyTorch.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习：跨 rank 求平均（2 分）
#
# 编写 `average_across_ranks(value)`：每个 rank 传入自己的张量 `value`，每个 rank
# 都要得到所有 rank 张量的逐元素平均值（数据类型与输入相同），并且不能改动调用者传入的张量。
# 请使用 `dist.all_reduce`（默认求和）和 `dist.get_world_size()`。评分单元会在隐藏的
# world size、形状和数据类型上运行你的函数，并与 PyTorch 的结果比较。

# %% tags=["exercise"]
def average_across_ranks(value: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    total = value.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
    ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 3
mine = average_across_ranks(torch.tensor([float(rank)]))
want = torch.tensor([sum(range(world_size)) / world_size])  # (0 + 1 + 2) / 3 on every rank
print(rank, mine.tolist(), dl.compare(mine, want))

# %% tags=["grade"] grade_id="00.average" points=2
dl.grade("00.average", average_across_ranks)

# %% [markdown] lang="en"
# ## What next
#
# This chapter's exercise: `ddp-lab exercise 00` in a terminal copies it to
# `work/en/00_quickstart.ipynb`. Do it there, save it, then check it with
# `ddp-lab check work/en/00_quickstart.ipynb` (the check reads the file on disk).
# Then start with chapter 01, the GPU software stack.

# %% [markdown] lang="zh"
# ## 接下来
#
# 本章的练习：在终端里运行 `ddp-lab exercise 00 --lang zh`，把它复制到
# `work/zh/00_quickstart.ipynb`。在副本里作答并保存，再运行
# `ddp-lab check work/zh/00_quickstart.ipynb` 检查（检查读取的是磁盘上的文件）。
# 然后从第 01 章（GPU 软件栈）开始学习。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`00.concepts`,
# 2 points when all are right).
#
# **1.** A `%%ddp -n 4` cell runs `x = torch.ones(3) * (rank + 1)` and then `dist.all_reduce(x)`. What is `x[0]` on rank 2 afterwards? (a number)
#
# **2.** One `%%ddp -n 2` cell runs `w = torch.zeros(1)`; the next `%%ddp -n 2` cell runs `print(w)`. The notebook itself never defined `w`. What happens?
#
# - (a) only rank 0 prints `tensor([0.])`
# - (b) both ranks print `tensor([0.])`
# - (c) the notebook's kernel prints `tensor([0.])`
# - (d) the cell fails with a `NameError` on the ranks
#
# **3.** A first try at the exercise: `dist.all_reduce(value)` then `return value / dist.get_world_size()`. Every rank returns the right mean. What is still wrong?
#
# - (a) the division may run before the all-reduce has finished
# - (b) the caller's tensor now holds the sum: `all_reduce` works in place
# - (c) nothing
# - (d) it can deadlock, because ranks divide at different times
#
# **4.** After `dl.start(2)`, a `%%ranks` cell raises `ValueError` on rank 1. What happens to the ranks and their variables?
#
# - (a) all ranks are restarted and every variable is lost
# - (b) the notebook's kernel restarts
# - (c) only rank 1 is restarted
# - (d) the ranks and their variables stay; each failing rank's traceback is shown


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`00.concepts`，全部答对得 2 分）。
#
# **1.** 一个 `%%ddp -n 4` 单元先执行 `x = torch.ones(3) * (rank + 1)`，再执行 `dist.all_reduce(x)`。之后 rank 2 上的 `x[0]` 是多少？（填一个数）
#
# **2.** 一个 `%%ddp -n 2` 单元执行 `w = torch.zeros(1)`；下一个 `%%ddp -n 2` 单元执行 `print(w)`。笔记本本身从未定义过 `w`。会发生什么？
#
# - (a) 只有 rank 0 打印 `tensor([0.])`
# - (b) 两个 rank 都打印 `tensor([0.])`
# - (c) 笔记本的内核打印 `tensor([0.])`
# - (d) 这个单元失败，rank 上报 `NameError`
#
# **3.** 练习的第一次尝试：先 `dist.all_reduce(value)`，再 `return value / dist.get_world_size()`。每个 rank 都返回了正确的平均值。还有什么问题？
#
# - (a) 除法可能在全归约完成之前就执行
# - (b) 调用者的张量现在存着和：`all_reduce` 是原地操作
# - (c) 没有问题
# - (d) 可能死锁，因为各个 rank 做除法的时间不同
#
# **4.** `dl.start(2)` 之后，一个 `%%ranks` 单元在 rank 1 上抛出 `ValueError`。rank 和它们的变量会怎样？
#
# - (a) 所有 rank 被重启，所有变量丢失
# - (b) 笔记本的内核重启
# - (c) 只有 rank 1 被重启
# - (d) rank 和变量都保留；显示每个失败 rank 的回溯


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 10,  # a number
    2: "d",  # a letter
    3: "b",  # a letter
    4: "d",  # a letter
    ### END ANSWERS
}
dl.quiz("00", my_answers)


# %% tags=["grade"] grade_id="00.concepts" points=2
dl.grade("00.concepts", my_answers)
