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
#       en: "06 DistributedSampler, exactly"
#       zh: "06 精确理解 DistributedSampler"
# ---

# %% [markdown] lang="en"
# # 06 DistributedSampler, exactly
#
# In data-parallel training every rank runs the same program on a different part of the
# data. `torch.utils.data.DistributedSampler` decides which part. Its arithmetic is short,
# and it explains four bugs you will meet sooner or later:
#
# - the order of the samples is the same in every epoch (you forgot `set_epoch`);
# - a validation accuracy that is slightly off (the sampler's **padding** repeats samples);
# - `DataLoader` refuses `shuffle=True` together with a `sampler`;
# - ranks with different numbers of batches **hang** in a collective.
#
# Two questions come up again and again, and we answer them with running code: *does each
# rank overfit its own shard, since it never sees the others?* and *why does the order
# never change between epochs?*

# %% [markdown] lang="zh"
# # 06 精确理解 DistributedSampler
#
# 数据并行训练中，每个 rank（进程编号）在不同的那部分数据上运行同一个程序。决定“哪一部分”的是
# `torch.utils.data.DistributedSampler`。它的计算只有寥寥几行，却能解释你迟早会遇到的四个问题：
#
# - 每一轮（epoch）的样本顺序都一样（忘了调用 `set_epoch`）；
# - 验证集准确率有一点点不对：采样器（sampler）的**填充**（padding）重复了一些样本；
# - `DataLoader` 不接受同时传入 `shuffle=True` 和 `sampler`；
# - 各 rank 的批数不一样时，会在集合通信里**卡住**（hang）。
#
# 还有两个经常被问到的问题，我们用可运行的代码来回答：“每个 rank 只看得到自己的分片
# （shard），会不会过拟合自己那一份？”以及“为什么每一轮的顺序都不变？”

# %%
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddp_lab as dl
from ddp_lab import sampler
from ddp_lab.labs import evaluation

dl.setup()
torch.set_num_threads(1)  # the ranks share 2 cores; extra threads only fight each other

# %% [markdown] lang="en"
# ## How many samples per rank: `num_samples` and `total_size`
#
# With `n` samples and `R` ranks (`num_replicas`), every rank must get **the same number**
# of samples, otherwise the ranks would run different numbers of steps. So:
#
# - `drop_last=False` (the default): `num_samples = ceil(n / R)`; the list is made longer
#   (padded) to `total_size = num_samples * R`;
# - `drop_last=True`: `num_samples = floor(n / R)`; the tail of the list is cut to
#   `total_size`. PyTorch writes this as `ceil((n - R) / R)` when `R` does not divide `n`,
#   which is the same number.
#
# The cell below computes the formulas and asks the real sampler.

# %% [markdown] lang="zh"
# ## 每个 rank 分到多少样本：`num_samples` 与 `total_size`
#
# 设有 `n` 个样本、`R` 个 rank（`num_replicas`）。每个 rank 必须分到**同样多**的样本，
# 否则各 rank 的步数会不同。因此：
#
# - `drop_last=False`（默认）：`num_samples = ceil(n / R)`，并把索引列表加长（填充）到
#   `total_size = num_samples * R`；
# - `drop_last=True`：`num_samples = floor(n / R)`，把列表尾部截掉，只留 `total_size` 个。
#   当 `n` 不能被 `R` 整除时，PyTorch 源码写的是 `ceil((n - R) / R)`，结果是同一个数。
#
# 下面的单元先按公式计算，再与真正的采样器核对。

# %%
print(" n  R  drop_last | ceil/floor formula | torch num_samples  total_size")
for n, R in [(10, 4), (12, 4), (2, 7), (0, 3), (13, 5)]:
    for drop_last in (False, True):
        formula = n // R if drop_last else math.ceil(n / R)
        s = DistributedSampler(range(n), num_replicas=R, rank=0, drop_last=drop_last)
        print(f"{n:2d} {R:2d}  {drop_last!s:9} | {formula:18d} | {len(s):17d}  {s.total_size:10d}")

# %% [markdown] lang="en"
# ## Padding repeats indices from the start
#
# Take 10 samples on 4 ranks without shuffling: `total_size` is 12, so two indices are
# added, and they are **copies of the first indices**, 0 and 1. Then each rank takes every
# `R`-th index starting at its rank (`indices[rank::R]`), not a contiguous block. So the
# common claim that the sampler makes sure every process gets *different* data is not quite
# true: below, ranks 2 and 3 read samples 0 and 1 again.

# %% [markdown] lang="zh"
# ## 填充：从头重复索引
#
# 取 10 个样本、4 个 rank、不打乱：`total_size` 是 12，所以要补两个索引，补的是**开头的
# 索引的副本**：0 和 1。然后每个 rank 从自己的编号开始，每隔 `R` 个取一个
# （`indices[rank::R]`），而不是取连续的一段。因此常见的“采样器确保不同进程的数据不同”的
# 说法并不完全正确：下例中 rank 2 和 rank 3 又读了一遍样本 0 和 1。

# %%
def shards(n, R, **kwargs):
    return [list(DistributedSampler(range(n), num_replicas=R, rank=r, **kwargs)) for r in range(R)]


for r, shard in enumerate(shards(10, 4, shuffle=False)):
    print(f"rank {r}: {shard}")
print("padded list before striding:",
      sampler.DistributedSampler(range(10), 4, 0, shuffle=False).padded_indices())

# %% [markdown] lang="en"
# The padding can be **longer than the dataset**: 2 samples on 7 ranks need 5 extra
# indices. The list is then repeated as many times as needed (`0, 1, 0, 1, ...`), so some
# samples are read three or four times. Our teaching version (`ddp_lab.sampler`) writes each
# step as a small function; the cell checks it against torch.

# %% [markdown] lang="zh"
# 填充的长度可以**超过数据集本身**：2 个样本分给 7 个 rank，需要补 5 个索引。这时整个列表会
# 按需要重复多次（`0, 1, 0, 1, ...`），有的样本会被读三四次。本课程的教学版实现
# （`ddp_lab.sampler`）把每一步写成一个小函数；下面的单元把它和 torch 对照。

# %%
torch_shards = shards(2, 7, shuffle=False)
ours = [list(sampler.DistributedSampler(range(2), 7, r, shuffle=False)) for r in range(7)]
print("torch:", torch_shards)
print("ours: ", ours, "| identical:", torch_shards == ours)

# %% tags=["lesson"]
dl.show_source(sampler.pad_or_trim)

# %% tags=["lesson"]
dl.show_source(sampler.DistributedSampler)

# %% [markdown] lang="en"
# Why the stride? With `rank::R`, the padded copies sit at the end of the list, so they
# land **one per rank** on the last ranks: rank 2 and rank 3 each read one duplicate above.
# With contiguous blocks, all of them would pile up on the last rank.
#
# ## Shuffling: one permutation, seeded with `seed + epoch`
#
# With `shuffle=True` every rank computes the **same** permutation on its own, without any
# communication: a fresh `torch.Generator` seeded with `seed + epoch` feeds
# `torch.randperm(n)`. Padding and striding are then applied to that permutation. The
# global random state plays no part. A consequence: `seed=0, epoch=1` gives exactly the
# order of `seed=1, epoch=0`.

# %% [markdown] lang="zh"
# 为什么要跨步取？用 `rank::R` 时，填充的副本位于列表末尾，因此会分散到最后几个 rank 上，
# **每个 rank 一个**：上面 rank 2 和 rank 3 各读到一个重复样本。如果按连续分块，所有副本都会
# 堆在最后一个 rank 上。
#
# ## 打乱：一个排列，种子是 `seed + epoch`
#
# `shuffle=True` 时，每个 rank 各自算出**同一个**排列，无需任何通信：用 `seed + epoch`
# 作为种子新建一个 `torch.Generator`，交给 `torch.randperm(n)`。随后对这个排列做填充和
# 跨步。全局随机状态不起任何作用。由此可知：`seed=0, epoch=1` 与 `seed=1, epoch=0`
# 给出完全相同的顺序。

# %%
n, R, seed, epoch = 10, 4, 0, 3
g = torch.Generator()
g.manual_seed(seed + epoch)
perm = torch.randperm(n, generator=g).tolist()
s = DistributedSampler(range(n), num_replicas=R, rank=1, seed=seed)
s.set_epoch(epoch)
print("randperm:", perm, "| padded:", perm + perm[:2])
print("rank 1 by hand:", (perm + perm[:2])[1::R], "| torch:", list(s))

torch.manual_seed(1234)  # the global RNG: changes nothing
a = DistributedSampler(range(n), num_replicas=R, rank=0, seed=0)
a.set_epoch(1)
b = DistributedSampler(range(n), num_replicas=R, rank=0, seed=1)
print("seed=0, epoch=1:", list(a), "| seed=1, epoch=0:", list(b))

# %% [markdown] lang="en"
# ## Why the order never changes: `set_epoch`
#
# A puzzle often reported: although `shuffle=True` is the default, every epoch (and every
# new run) shows the same order. It is what the code above implies: the sampler's `epoch` stays 0 unless **you** call `sampler.set_epoch(epoch)` at
# the start of each epoch, so `seed + epoch` never changes. That every *run* repeats the same
# orders is on purpose (reproducible runs; all ranks must agree). For different orders
# between runs, pass a different `seed=`, the same on every rank. Two ranks, three epochs:

# %% [markdown] lang="zh"
# ## 为什么顺序从不改变：`set_epoch`
#
# 一个常被问到的怪现象：尽管 `shuffle=True` 是默认值，每一轮（以及每次重新运行）的顺序
# 却都一样。这正是上面代码的结果：除非**你**在每一轮开始时调用
# `sampler.set_epoch(epoch)`，采样器的 `epoch` 一直是 0，`seed + epoch` 就永远不变。
# 每次*运行*得到相同顺序是有意为之（结果可复现，且所有 rank 必须一致）。如果想让不同运行的
# 顺序不同，请传入不同的 `seed=`，并保证每个 rank 相同。两个 rank、三轮：

# %%
def epochs_on_rank(rank, call_set_epoch):
    s = DistributedSampler(range(8), shuffle=True)  # rank and world size from the group
    for epoch in range(3):
        if call_set_epoch:
            s.set_epoch(epoch)
        print(f"set_epoch={call_set_epoch!s:5}  epoch {epoch}: {list(s)}")


dl.spawn(epochs_on_rank, args=(False,), nprocs=2, backend="gloo")
dl.spawn(epochs_on_rank, args=(True,), nprocs=2, backend="gloo");

# %% [markdown] lang="en"
# The seed must be the **same on every rank**. A tempting mistake is `seed=rank` (or a
# random seed per process): each rank then cuts its shard out of a *different* permutation,
# so the shards overlap and some samples are never read in that epoch.

# %% [markdown] lang="zh"
# 种子必须在**每个 rank 上相同**。一个常见的错误是 `seed=rank`（或每个进程随机一个种子）：
# 这样每个 rank 会从*不同的*排列中截取自己的分片，分片相互重叠，这一轮里有些样本根本读不到。

# %%
n, R = 20, 4
good = [DistributedSampler(range(n), R, r, seed=0) for r in range(R)]
bad = [DistributedSampler(range(n), R, r, seed=r) for r in range(R)]
for name, group in [("seed=0 on every rank", good), ("seed=rank", bad)]:
    read = [i for s in group for i in s]
    print(f"{name:22}: distinct samples read {len(set(read))} of {n}, "
          f"never read: {sorted(set(range(n)) - set(read))}")

# %% [markdown] lang="en"
# ## `DataLoader`: a sampler *or* `shuffle=True`, not both
#
# The sampler already decides the order, so `DataLoader(..., shuffle=True, sampler=s)` is
# refused. Pass the sampler and leave `shuffle` at its default `False` (the common pattern
# `shuffle=(sampler is None)` is right for code that runs with or without distribution).

# %% [markdown] lang="zh"
# ## `DataLoader`：`sampler` 与 `shuffle=True` 二选一
#
# 顺序已经由采样器决定，所以 `DataLoader(..., shuffle=True, sampler=s)` 会被拒绝。传入采样器，
# 并让 `shuffle` 保持默认的 `False`（常见的写法 `shuffle=(sampler is None)` 适用于既可
# 分布式运行、也可单进程运行的代码，是正确的）。

# %%
data = TensorDataset(torch.arange(10.0))
s = DistributedSampler(data, num_replicas=2, rank=0)
try:
    DataLoader(data, batch_size=2, shuffle=True, sampler=s)
except ValueError as err:
    print("ValueError:", err)
print([b[0].tolist() for b in DataLoader(data, batch_size=2, sampler=s)])

# %% [markdown] lang="en"
# ## Try it: who reads what
#
# Move the sliders: dataset length, number of replicas, the rank to highlight, `shuffle`,
# `drop_last`, `seed` and `epoch` (what `set_epoch` sets). Each row is what one rank reads,
# in order; hatched cells are padding (a repeated sample). The strip below is the dataset,
# coloured by the rank that reads each sample: grey `x` marks samples dropped by
# `drop_last`, `×2` a sample read twice. The grid is computed by
# `sampler.assignment_grid`, which the tests compare with torch's sampler.

# %% [markdown] lang="zh"
# ## 动手试试：谁读了哪些样本
#
# 拖动滑块：数据集长度、副本数、要高亮的 rank、`shuffle`、`drop_last`、`seed` 和 `epoch`
# （即 `set_epoch` 设置的值）。每一行是一个 rank 按顺序读取的样本；带斜线的格子是填充
# （重复的样本）。下方的长条是数据集本身，按读取它的 rank 着色：灰色 `x` 表示被
# `drop_last` 丢弃的样本，`×2` 表示被读了两次的样本。网格由 `sampler.assignment_grid`
# 计算，测试会把它与 torch 的采样器逐一对照。

# %%
sampler.sampler_widget(dataset_len=10, num_replicas=4)

# %% [markdown] lang="en"
# ## Does each rank overfit its own shard?
#
# No. Each rank computes gradients on its own shard, but DDP **averages the gradients over
# all ranks** before the optimizer step, so every rank applies the same update and the
# parameters stay identical. With equal batch sizes, one DDP step equals one
# single-process step on the union of the ranks' batches. The cell trains a linear
# classifier on scikit-learn's bundled digits for 5 steps on 2 ranks, once with DDP and once
# with each rank on its own, and replays the same batches in one process.

# %% [markdown] lang="zh"
# ## 每个 rank 会过拟合自己的分片吗？
#
# 不会。每个 rank 在自己的分片上计算梯度，但 DDP 在优化器更新之前会**对所有 rank 的梯度求
# 平均**，因此每个 rank 执行同样的更新，参数始终一致。在各 rank 批大小相同时，一步 DDP 等于
# 在所有 rank 的批合在一起上做一步单进程训练。下面的单元在 scikit-learn 自带的手写数字数据上
# 训练一个线性分类器：2 个 rank、5 步，一次用 DDP，一次让每个 rank 各练各的，再在一个进程
# 里按同样的批重放一遍。

# %%
X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X, dtype=torch.float32) / 16, torch.tensor(y)
STEPS, BATCH = 5, 16


def train_on_rank(rank, X, y):
    from torch.nn.parallel import DistributedDataParallel as DDP

    s = DistributedSampler(range(len(X)), seed=0)
    batches = [idx for idx, _ in zip(DataLoader(range(len(X)), BATCH, sampler=s), range(STEPS))]
    weights = {}
    for use_ddp in (True, False):
        torch.manual_seed(0)  # same initial parameters on every rank
        model = torch.nn.Linear(64, 10)
        net = DDP(model) if use_ddp else model
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        for idx in batches:
            opt.zero_grad()
            F.cross_entropy(net(X[idx]), y[idx]).backward()  # DDP averages the gradients here
            opt.step()
        weights[use_ddp] = model.weight.detach()
    return weights, batches


(w0, b0), (w1, b1) = dl.spawn(train_on_rank, args=(X, y), nprocs=2, backend="gloo")
for use_ddp in (True, False):
    diff = (w0[use_ddp] - w1[use_ddp]).abs().max()
    print(f"DDP={use_ddp!s:5}: max |w_rank0 - w_rank1| = {diff:.2e}")

# The oracle: one process, each step on the union of the two ranks' batches.
torch.manual_seed(0)
single = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(single.parameters(), lr=0.5)
for i0, i1 in zip(b0, b1):
    idx = torch.cat([i0, i1])
    opt.zero_grad()
    F.cross_entropy(single(X[idx]), y[idx]).backward()
    opt.step()
print(f"DDP vs single process on the union: max diff = {(w0[True] - single.weight).abs().max():.2e}")

# %% [markdown] lang="en"
# With DDP the two ranks hold the same weights (difference 0) and match the single-process
# run up to float rounding; trained alone, the ranks drift apart from the first step.
#
# ## Evaluation: padding biases a gathered accuracy
#
# A common way to evaluate: each rank predicts its shard (from a `DistributedSampler`), the
# per-sample results are gathered with `all_gather` and averaged. But the padded
# duplicates are counted too: with 10 validation samples on 4 ranks, 12 results are
# averaged and samples 0 and 1 count twice. The bias can go either way. Below, a model is
# trained for a moment in this process, then evaluated on 10 samples by 4 ranks.

# %% [markdown] lang="zh"
# 使用 DDP 时两个 rank 的权重完全相同（差为 0），并且与单进程的结果只差浮点舍入误差；各练各的
# rank 从第一步起就分道扬镳。
#
# ## 评估：填充让收集来的准确率产生偏差
#
# 一种常见的评估方法是：每个 rank 预测自己的分片（来自 `DistributedSampler`），用全收集
# （all-gather，`all_gather`）汇总每个样本的结果再取平均。但填充的重复样本也被计算在内：
# 10 个验证样本分给 4 个 rank 时，平均的是 12 个结果，样本 0 和 1 各算了两次。结果可能偏高，
# 也可能偏低。下面先在本进程里把模型简单训练一下，再用 4 个 rank 在 10 个样本上评估。

# %%
torch.manual_seed(0)
model = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for _ in range(30):
    opt.zero_grad()
    F.cross_entropy(model(X[:1500]), y[:1500]).backward()
    opt.step()
X_val, y_val = X[1510:1520], y[1510:1520]
with torch.no_grad():
    truth = (model(X_val).argmax(1) == y_val).float().mean().item()
print(f"single-process accuracy on the 10 samples: {truth:.4f}")


def evaluate_on_rank(rank, model, X_val, y_val):
    n = len(X_val)
    s = DistributedSampler(range(n), shuffle=False)
    idx = torch.tensor(list(s))
    with torch.no_grad():
        correct = model(X_val[idx]).argmax(1) == y_val[idx]  # a bool tensor
    gathered = evaluation.gather_tensor(correct)  # all_gather + cat: the common way
    biased = gathered.float().mean().item()
    fixed_order = evaluation.gather_in_index_order(correct, n).float().mean().item()
    fixed_index = evaluation.gather_by_index(correct, idx, n).float().mean().item()
    mine = list(evaluation.unpadded_shard(n, dist.get_world_size(), rank))
    with torch.no_grad():
        hits = (model(X_val[mine]).argmax(1) == y_val[mine]).sum()
    fixed_counts = evaluation.all_reduce_accuracy(hits, len(mine))
    if rank == 0:
        print(f"gathered {len(gathered)} results for {n} samples, dtype {gathered.dtype}")
        print(f"biased (cat + mean): {biased:.4f}")
        print(f"fixed, gather in index order + trim: {fixed_order:.4f}")
        print(f"fixed, gather with indices:          {fixed_index:.4f}")
        print(f"fixed, all_reduce of counts:         {fixed_counts:.4f}")


dl.spawn(evaluate_on_rank, args=(model, X_val, y_val), nprocs=4, backend="gloo");

# %% [markdown] lang="en"
# Three correct fixes, each giving the single-process accuracy:
#
# 1. **gather in index order, then trim**: with `shuffle=False`, rank `r`'s `j`-th result
#    belongs to position `j * R + r`; put the results back in that order and keep the first
#    `n` (`evaluation.gather_in_index_order`);
# 2. **gather the indices too** and write each result at its index, so a duplicate
#    overwrites itself (`evaluation.gather_by_index`; works with any sampler);
# 3. **sum counts**: each rank evaluates the unpadded shard `range(rank, n, R)` and the
#    ranks `all_reduce` the sums of correct answers and of samples
#    (`evaluation.all_reduce_accuracy`).
#
# Another common claim: `bool` tensors cannot be gathered. With the `gloo` backend of this
# PyTorch, the `correct` tensor above is `bool` and `all_gather` works; convert to `float`
# only for the mean.

# %% [markdown] lang="zh"
# 三种正确的修正方法，都得到与单进程相同的准确率：
#
# 1. **按索引顺序收集后截断**：`shuffle=False` 时，rank `r` 的第 `j` 个结果属于位置
#    `j * R + r`；按这个顺序放回，只保留前 `n` 个（`evaluation.gather_in_index_order`）；
# 2. **连同索引一起收集**，把每个结果写到它的索引位置，重复样本只会覆盖自己
#    （`evaluation.gather_by_index`，适用于任何采样器）；
# 3. **对计数求和**：每个 rank 评估不带填充的分片 `range(rank, n, R)`，各 rank 用
#    `all_reduce` 对“答对的个数”和“样本个数”求和（`evaluation.all_reduce_accuracy`）。
#
# 另一个常见说法是 `bool` 张量不能做全收集（`all_gather`）。在当前 PyTorch 的 `gloo` 后端上，上面的 `correct` 就是
# `bool` 张量，`all_gather` 可以正常工作；只在求平均时才需要转成 `float`。

# %% tags=["lesson"]
dl.show_source(evaluation.gather_by_index)

# %% [markdown] lang="en"
# ## Uneven inputs in training: hang, `drop_last`, `Join`
#
# `DistributedSampler` gives every rank the same number of samples, hence the same number
# of batches. Other ways of splitting data (the unpadded shards above, an
# `IterableDataset`, filtering bad samples on each rank) can leave one rank with more
# batches. That rank then waits in a collective that the others never call: here rank 0 runs
# a third `all_reduce` while rank 1 has moved on to the end-of-epoch `barrier`. The launcher
# stops them after 2 s.

# %% [markdown] lang="zh"
# ## 训练时输入不均：卡住、`drop_last` 与 `Join`
#
# `DistributedSampler` 让每个 rank 分到同样多的样本，因而批数相同。其他切分数据的方式
# （比如上面不带填充的分片、`IterableDataset`、在各 rank 上过滤坏样本）可能让某个 rank 的批
# 更多。这个 rank 会在一个其他 rank 永远不会调用的集合通信里等待：下例中 rank 0 执行第三次
# `all_reduce`，而 rank 1 已经进入了轮末的 `barrier`。启动器在 2 秒后停止它们。

# %%
def uneven_steps(rank):
    for _ in range(3 if rank == 0 else 2):  # rank 0 has one batch more
        grad = torch.ones(4)
        dist.all_reduce(grad)
    dist.barrier()


try:
    dl.spawn(uneven_steps, nprocs=2, backend="gloo", timeout=2, quiet=True)
except dl.DistributedTimeoutError as err:
    print(type(err).__name__, "- ranks stuck:", err.ranks)


def shortest_steps(rank):
    steps = torch.tensor([3 if rank == 0 else 2])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)  # agree on the shortest shard: drop the rest
    for _ in range(steps.item()):
        grad = torch.ones(4)
        dist.all_reduce(grad)
    dist.barrier()
    return steps.item()


steps = dl.spawn(shortest_steps, nprocs=2, backend="gloo")
print("cut to the shortest shard, steps per rank:", steps)

# %% [markdown] lang="en"
# There are two ways out. The first drops data: `drop_last=True` in the sampler, or every rank cutting
# its shard to the shortest one (the second function above agrees on it with an
# `all_reduce(op=MIN)` and finishes). The `Join` context manager
# (`torch.distributed.algorithms.Join`) keeps the data: a rank that runs out of batches
# keeps answering the others' gradient all-reduces with zeros until every rank is done. By
# default the sum is still divided by the initial world size, so those last steps are
# smaller (DDP's `join(divide_by_initial_world_size=...)` changes that).

# %% [markdown] lang="zh"
# 有两种办法。第一种是丢弃数据：在采样器里设置 `drop_last=True`，或者让每个 rank 都把分片截到
# 最短分片的长度（上面第二个函数用 `all_reduce(op=MIN)` 约定这个长度，于是顺利结束）。
# 第二种是 `Join` 上下文管理器（`torch.distributed.algorithms.Join`），它保留全部数据：先用完数据的 rank
# 会继续用零参与其他 rank 的梯度全归约，直到所有 rank 都结束。默认情况下求和结果仍然除以
# 初始的 world size（进程总数），所以最后这几步的更新更小（DDP 的 `join(divide_by_initial_world_size=...)`
# 可以改变这一点）。

# %%
def uneven_with_join(rank, X, y):
    from torch.distributed.algorithms import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    mine = list(evaluation.unpadded_shard(50, 2, rank))[: 25 - 8 * rank]  # 25 vs 17 samples
    with Join([model]):
        for start in range(0, len(mine), 8):  # rank 0: 4 batches, rank 1: 3 batches
            idx = mine[start:start + 8]
            opt.zero_grad()
            F.cross_entropy(model(X[idx]), y[idx]).backward()
            opt.step()
    print(f"{math.ceil(len(mine) / 8)} batches, weight checksum {model.module.weight.sum():.6f}")


dl.spawn(uneven_with_join, args=(X, y), nprocs=2, backend="gloo");

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: the sampler's indices (4 points)
#
# Write `distributed_indices(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,
# drop_last=False)` that returns, as a list of ints, exactly what `DistributedSampler`
# yields for that rank after `set_epoch(epoch)`. Use `torch.randperm` with your own
# `torch.Generator`, but not `DistributedSampler` nor `ddp_lab.sampler`. The hidden cases
# include `dataset_len < num_replicas`, an empty dataset, padding longer than the dataset,
# `drop_last` with divisible and non-divisible lengths, and several seeds and epochs.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：采样器的索引（4 分）
#
# 编写 `distributed_indices(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,
# drop_last=False)`，以 int 列表的形式返回 `DistributedSampler` 在调用 `set_epoch(epoch)`
# 之后为该 rank 产生的索引，必须完全一致。可以使用 `torch.randperm` 和你自己创建的
# `torch.Generator`，但不能使用 `DistributedSampler` 或 `ddp_lab.sampler`。隐藏测试用例包括
# `dataset_len < num_replicas`、空数据集、填充比数据集还长、`drop_last` 在整除与不整除时的
# 情形，以及多个种子和轮次。

# %% tags=["exercise"]
def distributed_indices(dataset_len, num_replicas, rank, epoch=0, seed=0, shuffle=True,
                        drop_last=False):
    ### BEGIN SOLUTION
    if drop_last:
        num_samples = dataset_len // num_replicas
    else:
        num_samples = math.ceil(dataset_len / num_replicas)
    total_size = num_samples * num_replicas
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=g).tolist()
    else:
        indices = list(range(dataset_len))
    if len(indices) < total_size:
        padding = total_size - len(indices)
        indices += (indices * math.ceil(padding / len(indices)))[:padding]
    indices = indices[:total_size]
    return indices[rank:total_size:num_replicas]
    ### END SOLUTION


# %% tags=["exercise"]
print(distributed_indices(10, 4, 3, shuffle=False), shards(10, 4, shuffle=False)[3])

# %% tags=["grade"] grade_id="06.indices" points=4
dl.grade("06.indices", distributed_indices)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: an evaluation without padding bias (3 points)
#
# `biased_accuracy` below is that common evaluation. Each rank passes `correct`, a float
# tensor with 1.0 where the prediction was right, for the indices its
# `DistributedSampler(shuffle=False)` gave it (so padded duplicates included), and the
# `dataset_len`. Write `gathered_accuracy(correct, dataset_len)` that returns, on every rank,
# the exact accuracy over the `dataset_len` samples, as a float. Use `dist.all_gather` or
# `dist.all_reduce` yourself (not `ddp_lab.labs.evaluation`). The hidden cases vary the dataset
# length and the world size.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：没有填充偏差的评估（3 分）
#
# 下面的 `biased_accuracy` 就是前面那种常见的评估方法。每个 rank 传入 `correct`（一个 float 张量，
# 预测正确处为 1.0，对应它的 `DistributedSampler(shuffle=False)` 给出的索引，因此包含填充的
# 重复样本）和 `dataset_len`。编写 `gathered_accuracy(correct, dataset_len)`，在每个 rank 上
# 返回这 `dataset_len` 个样本上确切的准确率（float）。请自己使用 `dist.all_gather` 或
# `dist.all_reduce`（不要用 `ddp_lab.labs.evaluation`）。隐藏测试用例会改变数据集长度和 world size。

# %% tags=["exercise"]
def biased_accuracy(correct, dataset_len):
    parts = [torch.empty_like(correct) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, correct)
    return torch.cat(parts).mean().item()  # padded duplicates are counted


def gathered_accuracy(correct, dataset_len):
    ### BEGIN SOLUTION
    parts = [torch.empty_like(correct) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, correct)
    in_order = torch.stack(parts, dim=1).flatten()  # position j * R + r
    return in_order[:dataset_len].mean().item()
    ### END SOLUTION


# %% tags=["exercise"]
def try_accuracy(rank):
    n, correct_all = 10, torch.tensor([1.0, 1, 0, 0, 0, 1, 0, 1, 0, 0])
    idx = list(DistributedSampler(range(n), shuffle=False))
    mine = correct_all[idx]
    b, g = biased_accuracy(mine, n), gathered_accuracy(mine, n)
    if rank == 0:
        print(f"true {correct_all.mean():.3f}, biased {b:.3f}, yours {g:.3f}")


dl.spawn(try_accuracy, nprocs=4, backend="gloo");

# %% tags=["grade"] grade_id="06.accuracy" points=3
dl.grade("06.accuracy", gathered_accuracy)

# %% [markdown] lang="en"
# ## Summary
#
# - `num_samples = ceil(n / R)` (padding to `total_size` by repeating from the start, as
#   often as needed) or `floor(n / R)` with `drop_last=True`; each rank reads `rank::R`.
# - The order comes from `randperm` seeded with `seed + epoch`: call `set_epoch(epoch)` every
#   epoch, and use the same `seed` on every rank.
# - No rank trains on its shard alone: DDP averages gradients, so all ranks hold the same
#   parameters.
# - For metrics, remove the padding: gather in index order and trim, gather with indices,
#   or `all_reduce` counts over unpadded shards. For uneven training inputs, use
#   `drop_last` or `Join`.

# %% [markdown] lang="zh"
# ## 小结
#
# - `num_samples = ceil(n / R)`（从头重复索引、必要时多次重复，填充到 `total_size`），
#   `drop_last=True` 时为 `floor(n / R)`；每个 rank 读取 `rank::R`。
# - 顺序来自以 `seed + epoch` 为种子的 `randperm`：每一轮都要调用 `set_epoch(epoch)`，
#   并且每个 rank 使用相同的 `seed`。
# - 没有哪个 rank 只在自己的分片上训练：DDP 对梯度求平均，所有 rank 的参数始终相同。
# - 计算指标时要去掉填充：按索引顺序收集后截断、连同索引一起收集，或在不带填充的分片上用
#   `all_reduce` 对计数求和。训练输入不均时，使用 `drop_last` 或 `Join`。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`06.concepts`,
# 2 points when all are right).
#
# **1.** `DistributedSampler` over 10 samples on 4 ranks (`drop_last=False`). How many indices does each rank get? (a number)
#
# **2.** Same sampler, `shuffle=False`: what is the last index rank 3 reads? (a number)
#
# **3.** A training loop never calls `sampler.set_epoch(epoch)` (`shuffle=True`). What order does each rank see across epochs?
#
# - (a) a new shuffle every epoch
# - (b) different shards that overlap
# - (c) the same shuffled order every epoch
# - (d) unshuffled order
#
# **4.** Evaluation runs over 10 samples on 4 ranks with `DistributedSampler`, and the accuracy is gathered over everything the ranks saw. Why can it differ from the true accuracy?
#
# - (a) two samples are counted twice (padding)
# - (b) the sampler drops the last two samples
# - (c) floating-point rounding
# - (d) each rank evaluates a different model


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`06.concepts`，全部答对得 2 分）。
#
# **1.** `DistributedSampler` 在 4 个 rank 上划分 10 个样本（`drop_last=False`）。每个 rank 得到多少个索引？（填一个数）
#
# **2.** 同一个采样器，`shuffle=False`：rank 3 读到的最后一个索引是多少？（填一个数）
#
# **3.** 训练循环从不调用 `sampler.set_epoch(epoch)`（`shuffle=True`）。各 rank 在不同 epoch 里看到的顺序是什么样的？
#
# - (a) 每个 epoch 都重新打乱
# - (b) 互相重叠的不同分片
# - (c) 每个 epoch 都是同一个打乱后的顺序
# - (d) 没打乱的顺序
#
# **4.** 在 4 个 rank 上用 `DistributedSampler` 评估 10 个样本，并对各 rank 看到的全部结果汇总准确率。为什么它可能和真实准确率不同？
#
# - (a) 有两个样本被统计了两次（填充）
# - (b) 采样器丢掉了最后两个样本
# - (c) 浮点舍入
# - (d) 每个 rank 评估的模型不同


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 3,  # a number
    2: 1,  # a number
    3: "c",  # a letter
    4: "a",  # a letter
    ### END ANSWERS
}
dl.quiz("06", my_answers)


# %% tags=["grade"] grade_id="06.concepts" points=2
dl.grade("06.concepts", my_answers)
