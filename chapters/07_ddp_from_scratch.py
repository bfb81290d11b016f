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
#       en: "07 DDP from scratch"
#       zh: "07 从零实现 DDP"
# ---

# %% [markdown] lang="en"
# # 07 DDP from scratch
#
# `DistributedDataParallel` (DDP) rests on two ideas. Every rank holds a full **replica**
# of the model, and the replicas start identical because rank 0's parameters and buffers
# are **broadcast** when the wrapper is built. They stay identical because, after each
# backward, every rank replaces its **gradients** by their mean over the ranks
# (an **all-reduce**) and then takes the same optimizer step. First you do one iteration
# by hand, one step per cell, and look at every rank's tensors after each step. Then you
# build it twice: a naive version in a few lines, then a version with **buckets** whose
# communication **overlaps** the backward computation, the way PyTorch does it. The
# oracle is always torch's own `DistributedDataParallel`.

# %% [markdown] lang="zh"
# # 07 从零实现 DDP
#
# `DistributedDataParallel`（DDP）建立在两个想法之上。每个 rank（进程编号）都持有模型的完整
# **副本**（replica）；构造包装器时，rank 0 的参数和缓冲区会被**广播**（broadcast）到所有
# rank，所以各副本一开始完全相同。之后每次反向传播结束，每个 rank 都把自己的**梯度**
# （gradient）换成所有 rank 上的平均值，这一步是一次**全归约**（all-reduce），然后各 rank
# 执行相同的优化器步骤，所以各副本始终保持相同。本章先手动走完一次迭代：每个单元做一步，
# 每步之后查看每个 rank 上的张量。然后把 DDP 实现两遍：先写一个只有几行的朴素版本，再像
# PyTorch 那样写一个带**桶**（bucket）的版本，让通信与反向计算**重叠**（overlap）。对照标准
# 始终是 torch 自己的 `DistributedDataParallel`。

# %%
import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab as dl
from ddp_lab.bucketed_ddp import BucketedDDP, bucket_widget, plot_timeline
from ddp_lab.buckets import assign_buckets
from ddp_lab.ddp import NaiveDDP, max_difference_across_ranks

dl.setup()
print(torch.__version__, "| CUDA GPUs:", torch.cuda.device_count())

# %% [markdown] lang="en"
# ## 1. One DDP iteration, cell by cell
#
# Before any wrapper, do by hand what DDP does in one training step, on 2 ranks that stay
# alive between cells: `dl.start(2)` starts them and initialises the **process group**
# once, a cell that begins with `%%ranks` runs on both ranks and keeps their variables for
# the next cell, and `dl.pull("expr")` brings each rank's value of `expr` into this
# notebook as a list in rank order. So after every step you can look at every rank's
# tensors.

# %% [markdown] lang="zh"
# ## 1. 逐个单元走一遍 DDP 的一次迭代
#
# 先不用任何包装器，在 2 个常驻的 rank 上手动完成 DDP 在一个训练步里做的事：`dl.start(2)`
# 启动它们，并只初始化一次**进程组**（process group）；以 `%%ranks` 开头的单元在两个 rank 上
# 运行，变量会保留到下一个单元；`dl.pull("expr")` 把每个 rank 上 `expr` 的值取回本 notebook，
# 得到一个按 rank 顺序排列的列表。这样每做一步，你都能查看每个 rank 上的张量。

# %%
dl.start(2, backend="gloo")

# %% [markdown] lang="en"
# **Step 1: a replica on every rank.** Each rank builds the model and its optimizer. We
# seed each rank differently on purpose, so the replicas start different.

# %% [markdown] lang="zh"
# **第 1 步：每个 rank 一个副本**。每个 rank 构建模型和优化器。这里故意给每个 rank 设定不同的
# 随机种子，让各副本一开始就不相同。

# %%
# %%ranks
torch.manual_seed(rank)  # a different initialisation on each rank, on purpose
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print("weight", model.weight.data, "bias", model.bias.data)

# %% [markdown] lang="en"
# **Step 2: broadcast.** Building `DistributedDataParallel(model)` **broadcasts** rank 0's
# parameters (and buffers) to every rank. Do it by hand, then pull the weights: one entry
# per rank, and now they are equal.

# %% [markdown] lang="zh"
# **第 2 步：广播**。构造 `DistributedDataParallel(model)` 时，rank 0 的参数（和缓冲区）会被
# **广播**到每个 rank。这里手动做一遍，再把权重取回来：每个 rank 一项，现在它们相等了。

# %%
# %%ranks
for p in model.parameters():
    dist.broadcast(p.data, src=0)

# %%
weights = dl.pull("model.weight")
print(weights)
print("identical on every rank:", all(torch.equal(w, weights[0]) for w in weights))

# %% [markdown] lang="en"
# **Step 3: forward, each rank on its own data.** A `DistributedSampler` gives each rank a
# different part of the dataset; here each rank draws its own batch of 4 samples. Same
# model, different data: the losses differ.

# %% [markdown] lang="zh"
# **第 3 步：前向传播，每个 rank 用自己的数据**。`DistributedSampler` 会给每个 rank 分配数据集
# 的不同部分；这里每个 rank 自己抽取一个 4 个样本的批。模型相同、数据不同，所以损失（loss）
# 也不同。

# %%
# %%ranks
gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
x, y = torch.randn(4, 3, generator=gen), torch.randn(4, 1, generator=gen)
loss = nn.functional.mse_loss(model(x), y)
print(f"loss {loss.item():.4f}")

# %% [markdown] lang="en"
# **Step 4: backward.** Each rank computes the **gradient** of its own loss. Pull the
# gradients and compare them: they differ, so if each rank took its optimizer step now, the
# replicas would drift apart.

# %% [markdown] lang="zh"
# **第 4 步：反向传播**。每个 rank 计算自己损失的**梯度**。把梯度取回来比较：它们不同；如果
# 每个 rank 现在就执行优化器步骤，各副本就会彼此偏离。

# %%
# %%ranks
opt.zero_grad()
loss.backward()

# %%
local = dl.pull("model.weight.grad")
for r, g in enumerate(local):
    print(f"rank {r}: {g}")
print("identical on every rank:", torch.equal(local[0], local[1]))

# %% [markdown] lang="en"
# **Step 5: all-reduce the gradients.** This is what DDP adds to a training step: sum each
# gradient over the ranks with `all_reduce`, then divide by the world size.

# %% [markdown] lang="zh"
# **第 5 步：对梯度做全归约**。这正是 DDP 给训练步增加的东西：用 `all_reduce` 把每个梯度在所有
# rank 上求和，再除以 world size（进程总数）。

# %%
# %%ranks
for p in model.parameters():
    dist.all_reduce(p.grad)  # the sum over the ranks ...
    p.grad /= world_size  # ... divided by their number: the mean
print("weight grad", model.weight.grad)

# %%
synced = dl.pull("model.weight.grad")
print("identical on every rank:", torch.equal(synced[0], synced[1]))
print("the mean of the local gradients:", torch.allclose(synced[0], (local[0] + local[1]) / 2))

# %% [markdown] lang="en"
# Why the mean is the right gradient: with a mean loss and the same batch size on every
# rank, the mean of the ranks' gradients is the gradient of the loss over all 8 samples.
# Check it in this notebook with one process, using rank 0's model and every rank's data,
# all pulled from the ranks.

# %% [markdown] lang="zh"
# 为什么平均值就是正确的梯度：当损失取平均、每个 rank 的批大小相同时，各 rank 梯度的平均值
# 就是全部 8 个样本上损失的梯度。在本 notebook 里用单个进程验证一下：模型用从 rank 0 取回的
# 参数，数据用从所有 rank 取回的批。

# %%
single = nn.Linear(3, 1)
single.load_state_dict(dl.pull("model.state_dict()", ranks=[0])[0])
xs, ys = dl.pull("x"), dl.pull("y")
nn.functional.mse_loss(single(torch.cat(xs)), torch.cat(ys)).backward()
print("one process, all 8 samples:", single.weight.grad)
print("equal to the all-reduced gradient:", torch.allclose(single.weight.grad, synced[0]))

# %% [markdown] lang="en"
# **Step 6: the optimizer step.** Every rank applies the same gradient to the same
# parameters, so the replicas are still identical after the step. That is why DDP never
# has to synchronise parameters again after the first broadcast.

# %% [markdown] lang="zh"
# **第 6 步：优化器步骤**。每个 rank 把相同的梯度应用到相同的参数上，所以这一步之后各副本仍然
# 相同。这就是为什么 DDP 在第一次广播之后再也不需要同步参数。

# %%
# %%ranks
opt.step()

# %%
after = dl.pull("model.weight")
print(after)
print("identical on every rank:", torch.equal(after[0], after[1]))
print("changed by the step:", not torch.equal(after[0], weights[0]))

# %% [markdown] lang="en"
# That is one whole iteration of DDP. `dl.status()` shows the two rank processes; stop them
# when you are done (closing the notebook or restarting the kernel stops them too). The
# next sections wrap these steps in a class, then make the all-reduce overlap the backward.

# %% [markdown] lang="zh"
# 这就是 DDP 的一次完整迭代。`dl.status()` 显示这两个 rank 进程；用完之后把它们停掉（关闭
# notebook 或重启内核也会停掉它们）。接下来几节先把这些步骤包装成一个类，再让全归约与反向
# 传播重叠。

# %%
dl.status()

# %%
dl.stop()

# %% [markdown] lang="en"
# ## 2. Naive DDP
#
# Here is the whole naive wrapper from the package. Read `__init__` (the broadcast),
# `forward` (rank 0's buffers, as torch does with `forward_sync_buffers=True`, the default)
# and `sync_gradients` (divide by the world size, then sum with `all_reduce`).
#
# torch 2.13 renamed the buffer flag: `broadcast_buffers` is deprecated (a FutureWarning)
# in favour of `forward_sync_buffers`, and the two `False`s differ. `forward_sync_buffers=
# False` stops the copy before each forward but **still** syncs the buffers at
# construction; the old `broadcast_buffers=False` also left them out of the construction
# sync (`torch/nn/parallel/distributed.py`, `__init__`). `NaiveDDP` and `BucketedDDP`
# take both names with torch's meaning; the cell after the source shows the difference.

# %% [markdown] lang="zh"
# ## 2. 朴素 DDP
#
# 下面是包里朴素包装器的全部代码。请读 `__init__`（广播）、`forward`（使用 rank 0 的缓冲区，
# 与 torch 在默认的 `forward_sync_buffers=True` 下的做法相同）和 `sync_gradients`（先除以
# world size，再用 `all_reduce` 求和）。
#
# torch 2.13 给缓冲区开关改了名：`broadcast_buffers` 已弃用（会给出 FutureWarning），改用
# `forward_sync_buffers`，而且两者取 `False` 时含义不同。`forward_sync_buffers=False` 只是不再在
# 每次前向传播前复制缓冲区，构造时**仍然**会同步；旧的 `broadcast_buffers=False` 则连构造时也
# 不同步缓冲区（见 `torch/nn/parallel/distributed.py` 的 `__init__`）。`NaiveDDP` 和
# `BucketedDDP` 两个名字都接受，含义与 torch 相同；源码后面的单元展示了两者的区别。

# %%
dl.show_source(NaiveDDP)


# %%
def buffers_after_wrapping(rank):
    import warnings

    rows = []
    for kwargs in [{"forward_sync_buffers": False}, {"broadcast_buffers": False}]:
        for wrap in (DDP, NaiveDDP):
            bn = nn.BatchNorm1d(2)
            bn.running_mean.fill_(float(rank))  # a rank-local buffer
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                wrap(bn, **kwargs)
            rows.append(f"{wrap.__name__:>23}({list(kwargs)[0]}=False): "
                        f"rank {rank} running_mean {bn.running_mean.tolist()}")
    return rows


if dl.doctor.has("DDP(forward_sync_buffers=)"):  # torch >= 2.13; older: one line says so
    for line in sum(dl.spawn(buffers_after_wrapping, nprocs=2, backend="gloo"), []):
        print(line)


# %% [markdown] lang="en"
# Now the check. Each rank builds its model from a **different** random seed (as many
# training scripts do with an `init_seeds(1 + rank)` helper), once with a frozen layer and once with
# BatchNorm buffers. We wrap one copy in `NaiveDDP` and one in torch's `DDP`, train both
# for five steps on each rank's own data, and compare.

# %% [markdown] lang="zh"
# 现在来验证。每个 rank 用**不同**的随机种子构建模型（很多训练脚本用 `init_seeds(1 + rank)`
# 这样的辅助函数也是这样做的），一次带冻结层，一次带 BatchNorm 缓冲区。一份副本用 `NaiveDDP` 包装，另一份用
# torch 的 `DDP` 包装，在每个 rank 自己的数据上各训练 5 步，然后比较。

# %% tags=["lesson"]
def frozen_mlp() -> nn.Module:
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    net[0].requires_grad_(False)  # a frozen layer: no gradient, still broadcast
    return net


def bn_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def naive_vs_torch(rank, steps=5):
    rows = []
    for name, make in [("frozen layer", frozen_mlp), ("BatchNorm", bn_mlp)]:
        torch.manual_seed(100 + rank)  # a different model on every rank
        net = make()
        spread_before = max_difference_across_ranks(net)
        ours, theirs = NaiveDDP(net), DDP(copy.deepcopy(net))
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, theirs)]
        gen = torch.Generator().manual_seed(rank)  # each rank its own data
        for _ in range(steps):
            x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)
            for model, opt in zip((ours, theirs), opts):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                if model is ours:
                    ours.sync_gradients()
                opt.step()
        ours_p = torch.cat([p.reshape(-1) for p in ours.module.parameters()])
        theirs_p = torch.cat([p.reshape(-1) for p in theirs.module.parameters()])
        diff = (ours_p - theirs_p).abs().max().item()
        params_only = nn.ParameterList(ours.module.parameters())
        rows.append((name, spread_before, max_difference_across_ranks(params_only), diff))
    if rank == 0:
        print(f"{'model':13s} {'ranks differ before':>20s} {'after 5 steps':>14s} {'NaiveDDP - DDP':>15s}")
        for name, before, after, diff in rows:
            print(f"{name:13s} {before:20.4f} {after:14.1e} {diff:15.1e}")


dl.spawn(naive_vs_torch, nprocs=2, backend="gloo");

# %% [markdown] lang="en"
# The replicas differ before wrapping, are bitwise identical after five steps, and
# `NaiveDDP` lands on exactly torch's parameters (0.0). With 2 ranks the division by 2 is
# exact; `tests/test_ddp.py` also checks 4 ranks, where the order in which gloo adds four
# numbers may change the last bit, so it allows 1e-6. (We compare parameters across
# ranks, not buffers: after the broadcast, each rank's BatchNorm updates its running
# statistics with its own batch, under torch's DDP too.)
#
# Frozen parameters are broadcast too (they are part of the model), but get no gradient
# and are not averaged.

# %% [markdown] lang="zh"
# 包装之前各副本不同；训练 5 步之后逐位相同，而且 `NaiveDDP` 得到的参数与 torch 的完全一样
# （差为 0.0）。2 个 rank 时除以 2 是精确的；`tests/test_ddp.py` 还检查了 4 个 rank，这时 gloo
# 把四个数相加的顺序可能改变最后一位，所以允许 1e-6 的误差。这里只比较各 rank 的参数，不比较
# 缓冲区：广播之后，每个 rank 的 BatchNorm 都用自己的批更新运行统计量（running statistics），
# torch 的 DDP 也是这样。
#
# 冻结的参数也会被广播（它们是模型的一部分），但它们没有梯度，也不参与平均。

# %% [markdown] lang="en"
# ## 3. DDP = gradient accumulation? Only under conditions
#
# A common claim in notes and blog posts: DDP on N ranks "equals" single-process gradient
# accumulation over N micro-batches "when there is no BN". The cell below tests the claim, comparing the
# averaged DDP gradient with accumulation (each micro-batch loss divided by N) on the same
# data:
#
# - plain MLP, `reduction="mean"`: equal;
# - `reduction="sum"`: accumulated sums give the full-batch sum, but DDP averages over the
#   ranks, so its gradient is N times smaller;
# - dropout: each rank draws its own mask from its own generator; one process draws
#   different masks, so the gradients differ bit for bit. Both are the same estimator (the
#   masks have the same distribution): DDP with dropout is not wrong, only not bitwise
#   equal to accumulation;
# - BatchNorm: the gradients are equal (each micro-batch is normalised by its own
#   statistics in both cases) but the running statistics are not: accumulation updates
#   them N times, DDP keeps rank 0's. The cell prints how far `running_mean` and
#   `running_var` differ, and the counter `num_batches_tracked` (1 under DDP, 2 after
#   accumulation).

# %% [markdown] lang="zh"
# ## 3. DDP 等于梯度累积吗？有条件
#
# 常见说法：N 个 rank 上的 DDP“在没有 BN 时”与单进程对 N 个微批（micro-batch）做梯度
# 累积（gradient accumulation）“完全一致”。下面的单元用同一份数据，比较 DDP 平均后的梯度和
# 梯度累积（每个微批的损失除以 N）的结果：
#
# - 普通 MLP，`reduction="mean"`：相等；
# - `reduction="sum"`：把各微批的和累积起来，得到的是整批的和，而 DDP 会在 rank 之间取平均，
#   所以 DDP 的梯度只有累积结果的 1/N；
# - dropout：每个 rank 用自己的随机数生成器抽取掩码，单进程抽到的是另一组掩码，所以梯度不会
#   逐位相同。但两者是同一个估计量（掩码的分布相同）：带 dropout 的 DDP 并没有错，只是与梯度
#   累积不逐位相等；
# - BatchNorm：梯度相等（两种做法都用每个微批自己的统计量做归一化），但运行统计量不同：梯度
#   累积会更新 N 次，DDP 保留的是 rank 0 的。单元分别打印 `running_mean` 和 `running_var` 的
#   差，以及计数器 `num_batches_tracked`（DDP 下是 1，梯度累积之后是 2）。

# %% tags=["lesson"]
def ddp_vs_accumulation(rank, world_size=2, per_rank=8):
    cases = {
        "MLP, mean": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), "mean"),
        "MLP, sum": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), "sum"),
        "dropout": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)), "mean"),
        "BatchNorm": (lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)), "mean"),
    }
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(world_size * per_rank, 4, generator=gen), torch.randn(world_size * per_rank, 1, generator=gen)
    for name, (make, reduction) in cases.items():
        torch.manual_seed(1)
        single = make()
        ddp = NaiveDDP(copy.deepcopy(single))
        torch.manual_seed(10 + rank)  # dropout masks: each rank its own stream
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        nn.functional.mse_loss(ddp(x[mine]), y[mine], reduction=reduction).backward()
        ddp.sync_gradients()
        torch.manual_seed(10)
        # Accumulation as usually written: mean losses divided by N, sum losses added up.
        scale = world_size if reduction == "mean" else 1
        for k in range(world_size):
            part = slice(k * per_rank, (k + 1) * per_rank)
            (nn.functional.mse_loss(single(x[part]), y[part], reduction=reduction) / scale).backward()
        grad = max((a.grad - b.grad).abs().max().item()
                   for a, b in zip(ddp.module.parameters(), single.parameters()))
        ratio = single[-1].weight.grad.norm() / ddp.module[-1].weight.grad.norm()
        stats = {n: (a - b).abs().max().item() for (n, a), b in zip(ddp.module.named_buffers(), single.buffers())
                 if n.endswith(("running_mean", "running_var"))}
        counts = [f"num_batches_tracked: DDP {a.item()}, accumulation {b.item()}"
                  for (n, a), b in zip(ddp.module.named_buffers(), single.buffers())
                  if n.endswith("num_batches_tracked")]
        if rank == 0:
            print(f"{name:10s} max |grad DDP - grad accumulation| = {grad:.2e}  (norm ratio {ratio:.2f})  "
                  + " ".join([f"{n.split('.')[-1]} differs by {d:.3g}" for n, d in stats.items()] + counts))


dl.spawn(ddp_vs_accumulation, nprocs=2, backend="gloo");

# %% [markdown] lang="en"
# So the claim holds for a deterministic model with a mean loss and the same data split.
# BatchNorm's running statistics and a `sum` loss break it (divide a sum loss by the
# number of micro-batches and by nothing under DDP, or use `mean`); dropout breaks only
# the bitwise equality.

# %% [markdown] lang="zh"
# 所以，只有当模型是确定性的、损失取平均、数据的切分方式相同时，这个说法才成立。BatchNorm 的
# 运行统计量和 `sum` 损失会破坏它（对 `sum` 损失，可以在梯度累积时把它除以微批数、在 DDP 下
# 不除，或者直接改用 `mean`）；dropout 只破坏逐位相等。

# %% [markdown] lang="en"
# ## 4. Buckets and overlap
#
# The naive version waits for the whole backward, then sends one message per parameter.
# Torch does better: it groups parameters into **buckets** and all-reduces a bucket as
# soon as all its gradients are ready, while backward goes on with earlier layers. A
# **hook** on each parameter's gradient accumulator does it
# (`torch/csrc/distributed/c10d/reducer.cpp`): `Reducer::mark_variable_ready_dense`
# copies each gradient into its slot of the bucket's flat buffer the moment it is ready,
# **already multiplied by 1/world_size** (`at::mul_out(bucket_view, grad, wrapped)`, where
# `wrapped` is the scalar `1. / div_factor_`), and when the bucket's last gradient is in, it
# launches one asynchronous `all_reduce` (a sum) on that buffer. There is no separate
# "flatten when complete" step. In torch 2.13 the docstring of the new `batched_grad_copy`
# flag (`torch/nn/parallel/distributed.py`) calls this default the "per-parameter
# gradient-to-bucket copy and division".
#
# Which parameters share a bucket is less simple than "reverse order, 25 MiB, 1 MiB first"
# (`_ddp_init_helper` and `_BucketCapacityConfig` in `torch/nn/parallel/distributed.py`,
# `Reducer::rebuild_buckets` in `reducer.cpp`, torch 2.13):
#
# - the **first iteration** uses **one bucket of unbounded size** (limit `sys.maxsize`):
#   torch does not yet know the order gradients arrive in;
# - during that backward the reducer records the arrival order, and before the next
#   forward it **rebuilds** the buckets by walking the parameters in that order: the first
#   bucket closed, the first one reduced (the **output** layers), has a 1 MiB cap
#   (`dist._DEFAULT_FIRST_BUCKET_BYTES`), the others `bucket_cap_mb` = 25 MiB;
# - an explicit `bucket_cap_mb` (even `25`) gives every bucket that cap: no 1 MiB bucket;
# - with `find_unused_parameters=True` the buckets are never rebuilt: the construction plan
#   stays, walked in **definition** order and reversed, so its 1 MiB bucket holds the
#   **input** layers and is reduced last;
# - two newer arguments: `bucket_cap_mb_list` (torch 2.11 has it) gives each bucket its own
#   cap in MiB, and `batched_grad_copy=True` (torch 2.13; not in 2.11) defers the per-parameter copy and division until
#   the bucket is ready, then does them as one `_foreach_copy_` and one `div_` (fewer
#   kernel launches for many small parameters; the default is `False`).
#
# The cell below counts the model's size, then asks torch's DDP on 2 ranks what it did
# (`_get_ddp_logging_data()`, a prototype debugging interface) and compares with the
# package's `assign_buckets`, which computes the rebuilt plan assuming gradients arrive in
# reverse definition order (true for an `nn.Sequential`; inside a `Linear` the bias comes
# before the weight). Its test is `tests/test_bucketed_ddp.py`.

# %% [markdown] lang="zh"
# ## 4. 桶与重叠
#
# 朴素版本要等整个反向传播结束，然后每个参数发一次消息。torch 做得更好：它把参数分组装进
# **桶**，一个桶的梯度全部就绪，就立即对它做全归约，同时反向传播继续计算前面的层。这件事由每个
# 参数的梯度累加器上的**钩子**（hook）完成（`torch/csrc/distributed/c10d/reducer.cpp`）：梯度
# 一就绪，`Reducer::mark_variable_ready_dense` 就把它复制到桶的扁平缓冲区里属于它的位置，复制时
# **已经乘以 1/world_size**（`at::mul_out(bucket_view, grad, wrapped)`，其中 `wrapped` 是标量
# `1. / div_factor_`）；桶里最后一个梯度到齐时，再对这块缓冲区发起一次异步 `all_reduce`（求和）。
# 并不存在“桶凑齐后再展平”这一步。torch 2.13 的 `torch/nn/parallel/distributed.py` 里，新参数
# `batched_grad_copy` 的文档字符串把这种默认做法称为“逐个参数把梯度复制进桶并做除法”。
#
# 哪些参数共用一个桶，并不像“倒序、25 MiB、第一个桶 1 MiB”那么简单（见 torch 2.13 的
# `torch/nn/parallel/distributed.py` 中的 `_ddp_init_helper` 和 `_BucketCapacityConfig`，以及
# `reducer.cpp` 中的 `Reducer::rebuild_buckets`）：
#
# - **第一次迭代**只用**一个大小不设上限的桶**（上限为 `sys.maxsize`）：torch 还不知道梯度到达
#   的顺序；
# - 在这次反向传播中，归约器记下梯度到达的顺序，并在下一次前向传播之前按这个顺序遍历参数，
#   **重建**各个桶：最先封口、也最先归约的那个桶（装的是**输出**层）上限为 1 MiB
#   （`dist._DEFAULT_FIRST_BUCKET_BYTES`），其余的桶为 `bucket_cap_mb` = 25 MiB；
# - 显式给出 `bucket_cap_mb`（哪怕是 `25`）时，每个桶都用这个上限，不再有 1 MiB 的桶；
# - 设置 `find_unused_parameters=True` 时，桶永远不会重建：构造时的分法保持不变，即按**定义**
#   顺序遍历再反转，所以其中 1 MiB 的那个桶装的是**输入**层，最后才被归约；
# - 还有两个较新的参数：`bucket_cap_mb_list`（torch 2.11 已有）给每个桶单独设上限（单位 MiB）；
#   `batched_grad_copy=True`（torch 2.13 才有，2.11 没有）把逐个参数的复制和除法推迟到桶就绪时，合并成一次 `_foreach_copy_`
#   和一次 `div_`（参数又多又小时，能少启动很多核函数；默认为 `False`）。
#
# 下面的单元先数一数模型的大小，再在 2 个 rank 上读出 torch 的 DDP 实际的分法（通过原型阶段的
# 调试接口 `_get_ddp_logging_data()`），并与本包的 `assign_buckets` 比较。`assign_buckets` 算的是
# 重建后的分法，它假设梯度按定义的逆序到达（对 `nn.Sequential` 成立；在一个 `Linear` 内部，偏置
# 先于权重）。它的测试在 `tests/test_bucketed_ddp.py`。

# %%
def wide_mlp(width=512, depth=4):
    layers = [nn.Linear(128, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def numel_mib(model):
    n = sum(p.numel() for p in model.parameters())
    return n, n * 4 / 2**20  # float32: 4 bytes per gradient element


n, mib = numel_mib(wide_mlp())
print(f"wide_mlp(): {n:,} parameters, {mib:.2f} MiB of float32 gradients, "
      f"{len(list(wide_mlp().parameters()))} parameter tensors")


def ddp_buckets(rank):
    import warnings

    rows = []
    for kwargs in [{}, {"bucket_cap_mb": 1}, {"bucket_cap_mb": 25}, {"find_unused_parameters": True}]:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # meant to hide DDP's warning (see below)
            model = DDP(wide_mlp(), **kwargs)
            first = model._get_ddp_logging_data()["bucket_sizes"]
            for _ in range(3):  # rebuilt before forward 2, logged in forward 3
                model(torch.randn(4, 128)).sum().backward()
        data = model._get_ddp_logging_data()
        rows.append((kwargs, first, data.get("rebuilt_per_bucket_param_indices", "(not rebuilt)")))
    return rows


params = list(wide_mlp().parameters())
for kwargs, first, rebuilt in dl.spawn(ddp_buckets, nprocs=2, backend="gloo")[0]:
    ours = assign_buckets(params, kwargs.get("bucket_cap_mb"),
                          find_unused_parameters=kwargs.get("find_unused_parameters", False))
    print(f"DDP(wide_mlp(), {', '.join(f'{k}={v}' for k, v in kwargs.items())})")
    print(f"   bucket bytes, 1st iteration: {first}")
    print(f"   parameter indices per bucket after the rebuild: {rebuilt}")
    print(f"   assign_buckets: {', '.join(' '.join(map(str, b)) for b in ours)}")

# %% [markdown] lang="en"
# Read it: by default the first iteration has one bucket of all 4.28 MiB; after the
# rebuild, bucket 0 is `11 10 9 8` (the last two layers, the first > 1 MiB in arrival
# order) and the rest share one 25 MiB bucket. `bucket_cap_mb=25` keeps everything in one
# bucket; `find_unused_parameters=True` keeps the construction plan, whose small bucket is
# the first layers' (sizes in the order they are reduced).
#
# Each rank also printed a warning: `find_unused_parameters=True` found no unused parameter,
# so the flag only costs an extra walk over the autograd graph every iteration. A common
# claim is that `warnings.simplefilter("ignore")` silences a library's warnings; the cell
# ran DDP inside exactly that, and the line still came. DDP's C++ reducer issues it
# (`TORCH_WARN_ONCE` in `Reducer::search_unused_parameters`,
# `torch/csrc/distributed/c10d/reducer.cpp`, once per process), and c10 writes it to the
# process's stderr itself: Python's `warnings` module never sees it.
#
# Move the slider to see which parameters share a bucket for other caps.

# %% [markdown] lang="zh"
# 读一下结果：默认情况下，第一次迭代只有一个桶，装下全部 4.28 MiB；重建之后，桶 0 是
# `11 10 9 8`（最后两层：按到达顺序累加，第一次超过 1 MiB 时封口），其余参数共用一个 25 MiB 的
# 桶。`bucket_cap_mb=25` 让所有参数都在同一个桶里；`find_unused_parameters=True` 保留构造时的
# 分法，其中那个小桶装的是最前面几层（各桶的大小按归约顺序列出）。
#
# 每个 rank 还打印了一条警告：`find_unused_parameters=True` 没有找到未使用的参数，所以这个开关
# 只会让每次迭代白白多遍历一次 autograd 图。常见的说法是 `warnings.simplefilter("ignore")` 能
# 屏蔽库发出的警告；上面的单元正是在它的作用范围内运行 DDP 的，这行警告照样出现。它来自 DDP 的
# C++ reducer（`torch/csrc/distributed/c10d/reducer.cpp` 中 `Reducer::search_unused_parameters`
# 里的 `TORCH_WARN_ONCE`，每个进程一次），由 c10 直接写到进程的 stderr，Python 的 `warnings`
# 模块根本看不到它。
#
# 拖动滑块，看看换成其他上限时哪些参数共用一个桶。

# %%
bucket_widget(wide_mlp(), caps_mb=(0.5, 1, 2, 4, 25))

# %% [markdown] lang="en"
# The hook and the launch, from `BucketedDDP`. Note that buckets are launched strictly in
# index order: every rank must issue the same collectives in the same order.

# %% [markdown] lang="zh"
# 下面是 `BucketedDDP` 中的钩子和发起通信的部分。注意各个桶严格按编号顺序发起：每个 rank 都必须
# 以相同的顺序发起相同的集合通信（collective）。

# %%
dl.show_source(BucketedDDP._on_grad_ready)

# %%
dl.show_source(BucketedDDP._launch)


# %% [markdown] lang="en"
# Now a measured **timeline** on 2 ranks with `wide_mlp(1024, 2)` (the cell prints its size;
# `bucket_cap_mb=2`), and, in the same run, the median step time of `BucketedDDP`,
# torch's `DDP` and `NaiveDDP` on the same model (interleaved, so that load affects all
# alike). The benchmark `benchmarks/bench_ddp.py` does the same with more steps.

# %% [markdown] lang="zh"
# 现在用 `wide_mlp(1024, 2)`（单元会打印它的大小）和 `bucket_cap_mb=2`，在 2 个 rank 上实测
# 一条**时间线**；同一次运行里，还在这个模型上测出 `BucketedDDP`、torch 的 `DDP` 和 `NaiveDDP`
# 每一步耗时的中位数（三者交替运行，让机器负载对它们的影响相同）。基准脚本
# `benchmarks/bench_ddp.py` 做的是同一件事，只是步数更多。

# %% tags=["lesson"]
def timeline_and_step_times(rank, steps=6):
    import statistics
    import time

    torch.manual_seed(0)
    models = {"BucketedDDP": BucketedDDP(wide_mlp(1024, 2), bucket_cap_mb=2, record_timeline=True),
              "torch DDP": DDP(wide_mlp(1024, 2), bucket_cap_mb=2),
              "NaiveDDP": NaiveDDP(wide_mlp(1024, 2))}
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    times = {k: [] for k in models}
    for step in range(steps + 1):
        for name, model in models.items():
            start = time.perf_counter()
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            if name == "NaiveDDP":
                model.sync_gradients()
            if step:  # the first step warms up
                times[name].append(time.perf_counter() - start)
    return models["BucketedDDP"].timeline[-1], {k: statistics.median(v) for k, v in times.items()}


print("wide_mlp(1024, 2): {:,} parameters, {:.2f} MiB of gradients".format(*numel_mib(wide_mlp(1024, 2))))
step, medians = dl.spawn(timeline_and_step_times, nprocs=2, backend="gloo")[0]
for name, t in medians.items():
    print(f"{name:12s} median forward+backward {t * 1000:6.1f} ms  ({t / medians['torch DDP']:.2f}x torch DDP)")
plot_timeline(step);

# %% [markdown] lang="en"
# Each orange bar is one bucket's all-reduce; most start while backward (blue) is still
# running, and the title gives the share of communication time hidden behind it. On a
# machine with few CPU cores (2 in CI) the gloo threads compete with backward for the same
# cores, so the saving is small; on GPUs with NCCL, communication runs on its own stream and the overlap is what
# lets DDP scale. The step-time ratio printed above is measured, not assumed: the goal for
# `BucketedDDP` is at most 1.3× torch's DDP.

# %% [markdown] lang="zh"
# 每个橙色条是一个桶的全归约；大多数橙色条在反向传播（蓝色）还没结束时就开始了，标题给出了被
# 反向计算掩盖掉的通信时间所占的比例。在 CPU 核很少的机器上（CI 只有 2 个核），gloo 的线程要和反
# 向计算抢同样的核，所以省下的时间不多；在 GPU 上用 NCCL 时，通信在单独的流上运行，正是这种重叠让 DDP 能
# 随 GPU 数量扩展。上面打印的单步耗时之比是实测出来的，不是假设的：`BucketedDDP` 的目标是单步耗时不
# 超过 torch DDP 的 1.3 倍。

# %% [markdown] lang="en" tags=["lesson"]
# ### The same overlap, measured by the profiler
#
# The timeline above is `BucketedDDP`'s own record (`record_timeline=True`). The profiler
# gives the same picture without any help from the model: `dl.spawn(..., trace=...)` runs
# each rank under `torch.profiler` and merges the ranks' traces (chapter 05). Below, two
# steps of `NaiveDDP` and two of `BucketedDDP` run in one traced launch, each step inside
# a `record_function` range named after it, and `trace_analysis.summarize(..., within=name)`
# measures each range per rank:
#
# - **communication**: time in Gloo's collectives (on Gloo's worker thread);
# - **exposed communication**: the part of it during which the rank's main thread ran no
#   operator;
# - **overlap %** = (communication - exposed) / communication: the measure Holistic Trace
#   Analysis reports for GPU traces (`get_comm_comp_overlap` in
#   `hta/analyzers/communication_analysis.py`), here with the main thread's operators in
#   place of compute kernels.
#
# `NaiveDDP` starts communicating only after backward has finished and waits for each
# all-reduce: its overlap is near 0. `BucketedDDP` launches each bucket during backward.

# %% [markdown] lang="zh" tags=["lesson"]
# ### 用性能分析器测量同样的重叠
#
# 上面的时间线是 `BucketedDDP` 自己记录的（`record_timeline=True`）。性能分析器（profiler）
# 不需要模型的任何配合就能给出同样的图景：`dl.spawn(..., trace=...)` 在每个 rank 里用
# `torch.profiler` 运行，并把各 rank 的追踪记录合并起来（见第 05 章）。下面在一次带追踪的启动中
# 先跑 `NaiveDDP` 的两步，再跑 `BucketedDDP` 的两步，每一步都放在以它命名的 `record_function`
# 区间里，再用 `trace_analysis.summarize(..., within=name)` 按 rank 分别统计每种区间：
#
# - **通信**：花在 Gloo 集合通信上的时间（在 Gloo 的工作线程上）；
# - **未被掩盖的通信**：其中 rank 主线程没有运行任何算子的那部分时间；
# - **重叠 %** = (通信 - 未被掩盖的通信) / 通信：这正是 Holistic Trace Analysis 对 GPU 追踪
#   记录给出的指标（`hta/analyzers/communication_analysis.py` 中的 `get_comm_comp_overlap`），
#   这里用主线程上的算子代替 GPU 上的计算核函数。
#
# `NaiveDDP` 要等反向传播全部结束才开始通信，而且逐个等待每次全归约：它的重叠接近 0。
# `BucketedDDP` 则在反向传播进行中就发起每个桶的通信。

# %% tags=["lesson"]
from ddp_lab.tools import trace_analysis  # noqa: E402


def naive_then_bucketed(rank, steps=2):
    from torch.profiler import record_function

    torch.manual_seed(0)
    models = {"naive": NaiveDDP(wide_mlp(1024, 2)),
              "bucketed": BucketedDDP(wide_mlp(1024, 2), bucket_cap_mb=2)}
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    for name, model in models.items():
        nn.functional.cross_entropy(model(x), y).backward()  # warm-up, not measured
        for _ in range(steps):
            with record_function(name):
                model.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                if name == "naive":
                    model.sync_gradients()


ddp_trace = str(dl.scratch("ch07") / "ddp.json")
dl.spawn(naive_then_bucketed, nprocs=2, backend="gloo", trace=ddp_trace)
runs = trace_analysis.load(ddp_trace)
for name in ("naive", "bucketed"):
    print(name)
    print(trace_analysis.format_summary(trace_analysis.summarize(runs, within=name)))
trace_analysis.draw(runs);

# %% [markdown] lang="en" tags=["lesson"]
# The thin black bars on top of each rank are the `record_function` ranges: first the
# two naive steps, then the two bucketed ones. In the naive steps the all-reduces
# (blue) come after the grey backward, one after another; in the bucketed steps they sit
# under it. How much of that shows as overlap depends on the machine: with few CPU cores,
# Gloo's thread and backward share them. The file `ddp_trace` also opens in Perfetto, where each rank's
# main thread and Gloo thread are separate rows.

# %% [markdown] lang="zh" tags=["lesson"]
# 每个 rank 上方的细黑条是 `record_function` 区间：先是两个朴素步，再是两个分桶步。朴素步里，
# 全归约（蓝色）在灰色的反向计算之后一个接一个地出现；分桶步里，它们位于反向计算的下方、与之
# 同时进行。其中有多少能体现为重叠取决于机器：CPU 核很少时，Gloo 的线程和反向计算只能共用这几个核。
# `ddp_trace` 这个文件也可以在 Perfetto 中打开，那里每个 rank 的主线程和 Gloo 线程各占一行。

# %% [markdown] lang="en"
# ## 5. Four facts about torch's DDP, each checked on 2 ranks
#
# 1. **`no_sync()`**: backward passes inside it only accumulate local gradients; the next
#    one outside syncs the sum. Two micro-batches with `no_sync` give the same gradients
#    as one step on both micro-batches at once (up to float32 rounding). What counts is
#    where the **forward** runs: DDP decides in `forward` (`_post_forward` calls
#    `reducer.prepare_for_backward` only outside `no_sync`,
#    `torch/nn/parallel/distributed.py`; `Reducer::autograd_hook` in
#    `torch/csrc/distributed/c10d/reducer.cpp` returns early otherwise). A forward outside
#    with the backward inside still syncs; a forward inside with the backward outside does
#    not. The cell after the four facts runs both mixed cases, for torch's DDP and for
#    `BucketedDDP`, which follows the same rule.
# 2. **Load a checkpoint on rank 0 only** before wrapping: DDP broadcasts at construction,
#    so every rank ends up with it (no `torch.manual_seed(42)` needed either, contrary to
#    a common claim that every rank must seed alike before building the model).
# 3. **Different seeds per rank** for data augmentation are fine (and wanted): the model
#    is still identical after wrapping.
# 4. **`find_unused_parameters`**: a parameter that gets no gradient leaves its bucket
#    incomplete; without the flag, DDP raises an error on the next iteration.

# %% [markdown] lang="zh"
# ## 5. 关于 torch DDP 的四个事实，各在 2 个 rank 上验证
#
# 1. **`no_sync()`**：在它里面执行的反向传播只在本地累积梯度；之后在它外面的下一次反向传播
#    再同步累积下来的和。用 `no_sync` 分两次处理两个微批，与一步同时处理这两个微批得到的梯度
#    相同（差别在 float32 舍入误差以内）。起决定作用的是**前向传播**在哪里运行：DDP 在
#    `forward` 中做决定（`torch/nn/parallel/distributed.py` 的 `_post_forward` 只在 `no_sync`
#    之外调用 `reducer.prepare_for_backward`；否则 `torch/csrc/distributed/c10d/reducer.cpp` 的
#    `Reducer::autograd_hook` 直接返回）。前向在 `no_sync` 外、反向在内，仍然会同步；前向在内、
#    反向在外，则不会同步。四个事实之后的单元对 torch 的 DDP 和 `BucketedDDP`（它遵循同一规则）
#    运行这两种混合情况。
# 2. **只在 rank 0 加载检查点**（checkpoint），再包装：DDP 在构造时广播，所以每个 rank 都会得到
#    它（也不需要 `torch.manual_seed(42)`；常见说法认为每个 rank 建模型前都必须设相同的种子，
#    其实不必）。
# 3. 为数据增强给**每个 rank 设不同的随机种子**没有问题（而且本该如此）：包装之后模型仍然相同。
# 4. **`find_unused_parameters`**：没有得到梯度的参数会让它所在的桶一直凑不齐；不设这个参数时，
#    DDP 会在下一次迭代时报错。

# %% tags=["lesson"]
class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        return self.used(self.body(x))  # self.unused takes no part in the loss


def four_facts(rank, ckpt):
    world = dist.get_world_size()
    # 1. no_sync: two micro-batches, synced once == one step on the concatenation
    torch.manual_seed(0)
    a = DDP(nn.Linear(4, 1))
    b = DDP(copy.deepcopy(a.module))
    x = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(rank))
    with a.no_sync():
        (a(x[0]).pow(2).mean() / 2).backward()
    (a(x[1]).pow(2).mean() / 2).backward()
    b(x.reshape(12, 4)).pow(2).mean().backward()
    diff = (a.module.weight.grad - b.module.weight.grad).abs().max().item()
    print(f"1. no_sync + sync vs one big step: max grad difference {diff:.1e}")
    # 2. checkpoint loaded on rank 0 only
    torch.manual_seed(1000 + rank)
    net = nn.Linear(4, 1)
    if rank == 0:
        net.load_state_dict(torch.load(ckpt, map_location="cpu"))
    model = DDP(net)
    saved = torch.load(ckpt, map_location="cpu")["weight"]
    print(f"2. rank-0-only load, after DDP(...): equals the checkpoint: {torch.equal(model.module.weight, saved)}")
    # 3. per-rank augmentation seeds, same model
    torch.manual_seed(2000 + rank)
    noise = torch.randn(3)
    model = DDP(nn.Linear(4, 1))
    print(f"3. augmentation noise {noise.tolist()[:2]}..., model spread after wrapping: "
          f"{max_difference_across_ranks(model.module):.1f}")
    # 4. an unused parameter
    for flag in (False, True):
        model = DDP(TwoHeads(), find_unused_parameters=flag)
        try:
            for _ in range(2):
                model(torch.randn(3, 4)).sum().backward()
            print(f"4. find_unused_parameters={flag}: two iterations ran")
        except RuntimeError as err:
            print(f"4. find_unused_parameters={flag}: RuntimeError: {str(err).splitlines()[0][:110]}...")


ckpt = str(dl.scratch("ch07") / "linear.pt")
torch.manual_seed(42)
torch.save(nn.Linear(4, 1).state_dict(), ckpt)
dl.spawn(four_facts, args=(ckpt,), nprocs=2, backend="gloo");


# %% tags=["lesson"]
def mixed_no_sync(rank):
    """Forward and backward on different sides of no_sync(): are the gradients synced?"""
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    x = torch.randn(3, 4) * (rank + 1)  # different data per rank
    for case in ["forward outside, backward inside", "forward inside, backward outside"]:
        row = []
        for wrap in (DDP, BucketedDDP):
            model = wrap(copy.deepcopy(net))
            if case.startswith("forward outside"):
                loss = model(x).sum()
                with model.no_sync():
                    loss.backward()
            else:
                with model.no_sync():
                    loss = model(x).sum()
                loss.backward()
            grads = [torch.empty(2, 4) for _ in range(2)]
            dist.all_gather(grads, model.module.weight.grad)
            row.append(f"{wrap.__name__}: synced={torch.equal(*grads)}")
        if rank == 0:
            print(f"{case:34s} ->", " | ".join(row))


dl.spawn(mixed_no_sync, nprocs=2, backend="gloo");

# %% [markdown] lang="en"
# ## 6. SyncBatchNorm: assign the result
#
# Plain BatchNorm normalises with each rank's own batch statistics; `SyncBatchNorm`
# normalises as BatchNorm on the global batch would. How, in torch 2.13
# (`torch/nn/modules/_functions.py`, class `SyncBatchNorm`): the **forward** computes each
# rank's per-channel (mean, invstd, count) and **all-gathers** them (an all-gather, not an
# all-reduce, "because count could be different across ranks"), then
# `torch.batch_norm_gather_stats_with_counts` combines them into the global mean and
# inverse standard deviation and updates the running statistics. The **backward**
# **all-reduces** (sum) two per-channel sums, `sum_dy` and `sum_dy_xmu`, to get the input
# gradient; the weight and bias gradients are left to DDP's own all-reduce.
#
# `nn.SyncBatchNorm.convert_sync_batchnorm(model)` *returns* the converted model. A line
# often seen in notes and blog posts, `nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda()`,
# drops the result. For a container such as `nn.Sequential` the children happen to be replaced in
# place, so it works by luck; for a model that *is* a BatchNorm layer, nothing changes.
# Always write `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`.

# %% [markdown] lang="zh"
# ## 6. SyncBatchNorm：记得接住返回值
#
# 普通 BatchNorm 用每个 rank 自己那一批的统计量做归一化；`SyncBatchNorm` 的归一化结果则与在
# 全局批上做 BatchNorm 相同。torch 2.13 里它是这样做的（`torch/nn/modules/_functions.py` 中的
# `SyncBatchNorm` 类）：**前向**传播先算出本 rank 每个通道的均值、invstd（标准差的倒数）和
# 样本数，再对它们做**全收集**（all-gather）。之所以用全收集而不用全归约，源码注释给出的理由是
# “各 rank 的样本数可能不同”。然后 `torch.batch_norm_gather_stats_with_counts` 把它们合成全局的
# 均值和标准差的倒数，并更新运行统计量。**反向**传播对两个按通道求的和 `sum_dy`、`sum_dy_xmu`
# 做**全归约**（求和），用来算输入的梯度；权重和偏置的梯度则交给 DDP 自己的全归约。
#
# `nn.SyncBatchNorm.convert_sync_batchnorm(model)` **返回**转换后的模型。网上常见的写法
# `nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda()` 丢掉了返回值。对 `nn.Sequential`
# 这样的容器，子模块恰好被原地（in-place）替换，所以碰巧能用；而如果模型本身就是一个
# BatchNorm 层，什么都不会改变。请始终写 `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`。

# %%
seq = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
nn.SyncBatchNorm.convert_sync_batchnorm(seq)  # result dropped
bare = nn.BatchNorm1d(3)
nn.SyncBatchNorm.convert_sync_batchnorm(bare)  # result dropped
print("Sequential, result dropped:", type(seq[1]).__name__)
print("bare BatchNorm, result dropped:", type(bare).__name__)
print("bare BatchNorm, result assigned:", type(nn.SyncBatchNorm.convert_sync_batchnorm(bare)).__name__)


# %% [markdown] lang="en"
# Torch's DDP refuses `SyncBatchNorm` in a CPU module ("SyncBatchNorm layers only work
# with GPU modules", `_passing_sync_batchnorm_handle` in `torch/nn/parallel/distributed.py`),
# and its kernels (`torch.batch_norm_stats`) have no CPU version: on a CPU tensor torch raises
# `NotImplementedError`. So that the effect can be seen here, the
# next cell does the forward's statistics the same way on CPU: each rank all-gathers its
# (mean, invstd, count), combines them into the global mean and variance, and compares both
# per-rank BatchNorm and this with BatchNorm on the global batch (the two ranks get
# different numbers of rows on purpose). The GPU cell after it runs the real
# `SyncBatchNorm` when 2 GPUs are present.

# %% [markdown] lang="zh"
# torch 的 DDP 不接受放在 CPU 模块里的 `SyncBatchNorm`（`torch/nn/parallel/distributed.py` 中
# `_passing_sync_batchnorm_handle` 报错 “SyncBatchNorm layers only work with GPU modules”），
# 而且它调用的 `torch.batch_norm_stats` 等核函数（kernel）没有 CPU 版本：对 CPU 张量调用时 torch
# 抛出 `NotImplementedError`。为了在这里也能看到效果，下一个单元在 CPU 上按同样的方法计算
# 前向传播的统计量：每个 rank 全收集各 rank 的均值、invstd 和样本数，合成全局的均值和方差；
# 然后把“每个 rank 各自做的普通 BatchNorm”和“用合成的统计量做的归一化”分别与全局批上的
# BatchNorm 比较（两个 rank 故意分到不同的行数）。再下一个单元在有 2 块 GPU 时运行真正的
# `SyncBatchNorm`。

# %% tags=["lesson"]
def sync_bn_by_hand(rank, world_size=2, eps=1e-5):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 3, generator=gen) * torch.tensor([1.0, 5.0, 0.2]) + 3
    rows = [slice(0, 4), slice(4, 10)][rank]  # 4 rows on rank 0, 6 on rank 1
    mine = x[rows]
    var, mean = torch.var_mean(mine, dim=0, unbiased=False)
    stats = torch.cat([mean, 1 / torch.sqrt(var + eps), torch.tensor([float(len(mine))])])
    gathered = [torch.empty_like(stats) for _ in range(world_size)]
    dist.all_gather(gathered, stats)  # (mean, invstd, count) of every rank, as torch does
    means, invstds, counts = torch.stack(gathered).split([3, 3, 1], dim=1)
    variances = 1 / invstds**2 - eps
    g_mean = (counts * means).sum(0) / counts.sum()  # what batch_norm_gather_stats_with_counts
    g_var = (counts * (variances + (means - g_mean) ** 2)).sum(0) / counts.sum()  # computes
    synced = (mine - g_mean) / torch.sqrt(g_var + eps)
    reference = nn.functional.batch_norm(x, None, None, training=True)[rows]
    plain = nn.functional.batch_norm(mine, None, None, training=True)
    if rank == 0:
        print(f"plain per-rank BN vs global-batch BN: {(plain - reference).abs().max():.3f}")
        print(f"gathered statistics vs global-batch BN: {(synced - reference).abs().max():.1e}")


dl.spawn(sync_bn_by_hand, nprocs=2, backend="gloo");

# %% tags=["lesson"]
if torch.cuda.device_count() >= 2:
    def real_sync_bn(rank):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
        device = dl.this_rank_device()  # nccl: this rank's own GPU (ddp_lab/runtime/device.py)
        model = DDP(model.to(device), device_ids=[device])
        model(torch.randn(4, 3, device=device)).sum().backward()
        print(type(model.module[1]).__name__, model.module[1].running_mean.tolist())

    dl.spawn(real_sync_bn, nprocs=2, backend="nccl")
else:
    print(dl.tr(en="Skipped: no 2 GPUs here. On 2 GPUs this cell wraps a SyncBatchNorm model in DDP with nccl "
                   "and prints identical running means on both ranks.",
                zh="已跳过：这里没有 2 块 GPU。在 2 块 GPU 上，本单元会用 nccl 把含 SyncBatchNorm 的模型包装进 "
                   "DDP，并打印两个 rank 上相同的运行均值。"))

# %% [markdown] lang="en"
# ## 7. The other way: one model in shared memory (Hogwild)
#
# DDP gives every process its **own** replica and keeps them identical by all-reducing
# gradients. `torch.multiprocessing` offers the opposite on one machine: one model in
# **shared memory**, written by every process. A CPU tensor sent to another process
# (through a `torch.multiprocessing` queue, or as an argument of a process it starts) is
# not copied: its storage is moved to shared memory (`share_memory_()`) and the receiver
# gets a handle to the same bytes (`torch/multiprocessing/reductions.py`). The handle
# travels as a file descriptor (strategy `file_descriptor`, the Linux default) or as a
# file name (`file_system`, for when too many descriptors would be open); CUDA tensors go
# through CUDA IPC and the sender must keep them alive. The first cell sends a tensor to a
# child that adds 1 in place: the parent sees it.
#
# **Hogwild** (Recht et al., 2011; pytorch/examples `mnist_hogwild`) builds training on
# this: `model.share_memory()`, then several processes each run their own optimizer on
# their own data and write into the same parameters **without a lock or an all-reduce**.
# Updates can overwrite each other, the processes are never in step, and it works only
# within one machine; DDP is synchronous, exact (the mean gradient) and spans machines.
# The second cell trains a shared `nn.Linear(2, 1)` towards the weights (2, -3) from two
# processes. Both cells run functions of `ddp_lab/labs/shared_memory.py` in children started
# with "spawn" (each imports torch, a few seconds).

# %% [markdown] lang="zh"
# ## 7. 另一种做法：共享内存里的同一个模型（Hogwild）
#
# DDP 让每个进程持有**自己的**副本，并通过对梯度做全归约让它们保持一致。`torch.multiprocessing`
# 在单机上提供了相反的做法：模型只有一份，放在**共享内存**里，所有进程都往里写。发给另一个进程的
# CPU 张量（经由 `torch.multiprocessing` 的队列，或者作为参数传给新启动的进程）不会被复制：它的
# 存储被移到共享内存（`share_memory_()`），接收方拿到的是指向同一块内存的句柄
# （`torch/multiprocessing/reductions.py`）。句柄以文件描述符的形式传递（共享策略
# `file_descriptor`，Linux 上的默认值），或者以文件名的形式传递（`file_system`，在打开的描述符
# 太多时使用）；CUDA 张量走 CUDA IPC，发送方必须保证它们一直存活。第一个单元把一个张量发给
# 子进程，子进程原地给它加 1：父进程能看到这个变化。
#
# **Hogwild**（Recht 等，2011；pytorch/examples 中的 `mnist_hogwild`）就是建立在这一点上的训练
# 方法：调用 `model.share_memory()` 之后，几个进程各自用自己的优化器、在自己的数据上训练，
# **不加锁、也不做全归约**，直接写同一份参数。更新可能互相覆盖，各进程的步调从不一致，而且只能
# 在一台机器内使用；DDP 则是同步的、精确的（用的是平均梯度），还能跨机器。第二个单元用两个进程
# 把一个共享的 `nn.Linear(2, 1)` 朝权重 (2, -3) 训练。两个单元运行的都是
# `ddp_lab/labs/shared_memory.py` 中的函数，子进程以 `"spawn"` 方式启动（每个子进程都要重新导入
# torch，需要几秒）。

# %%
from ddp_lab.labs import shared_memory  # noqa: E402

for key, value in shared_memory.send_tensor().items():
    print(f"{key:30s} {value}")

# %%
dl.show_source(shared_memory._hogwild_worker)
print(shared_memory.hogwild(nprocs=2, steps=200))

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: a naive DDP wrapper (3 points)
#
# Write `MyDDP(module)`, an `nn.Module` with:
# - `__init__`: keep `module` as `self.module` and broadcast rank 0's parameters (frozen
#   ones too) and buffers to every rank;
# - `forward(*args)`: broadcast rank 0's buffers, then call the module (torch's DDP does
#   this before each training forward);
# - `sync_gradients()`: replace every existing `param.grad` by its mean over the ranks.
#
# The graded cell trains your wrapper on hidden models and data, every rank starting from
# a different model, and compares it with a single-process model trained on the full batch
# and with torch's DDP. It fails a wrapper that sums instead of averaging, skips the
# initial broadcast, or forgets buffers.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：朴素 DDP 包装器（3 分）
#
# 编写 `MyDDP(module)`，它是一个 `nn.Module`，包含：
# - `__init__`：把 `module` 保存为 `self.module`，并把 rank 0 的参数（包括冻结的参数）和缓冲区
#   广播到每个 rank；
# - `forward(*args)`：先广播 rank 0 的缓冲区，再调用模块（torch 的 DDP 在每次训练的前向传播之前
#   都这样做）；
# - `sync_gradients()`：把每个已有的 `param.grad` 替换为它在所有 rank 上的平均值。
#
# 评分单元会在隐藏的模型和数据上训练你的包装器（每个 rank 从不同的模型开始），并与在全批上训练
# 的单进程模型以及 torch 的 DDP 比较。如果实现求的是和而不是平均、跳过了初始广播或者漏掉了
# 缓冲区，都无法通过。

# %% tags=["exercise"]
class MyDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        ### BEGIN SOLUTION
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        ### END SOLUTION

    def forward(self, *args):
        ### BEGIN SOLUTION
        for b in self.module.buffers():
            dist.broadcast(b, src=0)
        return self.module(*args)
        ### END SOLUTION

    def sync_gradients(self):
        ### BEGIN SOLUTION
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 2
torch.manual_seed(rank)  # every rank starts from another model
m = MyDDP(nn.Linear(3, 1))
m(torch.ones(2, 3) * (rank + 1)).sum().backward()  # rank r's gradient: 2 (r + 1) per weight
m.sync_gradients()
torch.manual_seed(0)
want_weight = nn.Linear(3, 1).weight.detach()  # rank 0's model, on every rank
want_grad = torch.full((1, 3), sum(2.0 * (r + 1) for r in range(world_size)) / world_size)  # the mean
print("weight:", dl.compare(m.module.weight.detach(), want_weight),
      "| grad:", m.module.weight.grad.tolist(), dl.compare(m.module.weight.grad, want_grad))

# %% tags=["grade"] grade_id="07.naive_ddp" points=3
dl.grade("07.naive_ddp", MyDDP)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: bucketed gradient hooks (3 points)
#
# Complete `GradBuckets`. The constructor (given) splits the trainable parameters into
# buckets with `assign_buckets` and registers `on_grad_ready` as a post-accumulate-grad
# hook on each. Write:
# - `on_grad_ready(param)`: count the ready gradients of `param`'s bucket; then launch, in
#   index order, every complete bucket from `self.next` on (a bucket that fills before the
#   ones in front of it waits for them, as in `BucketedDDP`): flatten its gradients into
#   one tensor divided by the world size, start `dist.all_reduce(flat, async_op=True)`, and
#   keep the work, the tensor and the bucket index;
# - `wait()` (called after `backward()`): wait for each work, copy the averaged values back
#   into `param.grad`, and reset the counters for the next step.
#
# The graded cell compares the parameters after a few steps with a single-process model on
# the full batch, and watches the last backward: at least two `all_reduce` calls, in bucket
# index order, and none waited for before `backward()` returns (a blocking call waits too, and
# so does a loop that polls `work.is_completed()` until it is done).
# Its hidden models are of two kinds. In one, bucket 0 fills first, so an all-reduce must
# start before the last gradient is ready; in the other, a layer defined last but used first
# makes bucket 0 the last to fill.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：分桶的梯度钩子（3 分）
#
# 补全 `GradBuckets`。构造函数（已给出）用 `assign_buckets` 把可训练参数分到各个桶里，并在每个
# 参数上把 `on_grad_ready` 注册为梯度累加完成后调用的钩子（`register_post_accumulate_grad_hook`）。
# 你需要编写：
# - `on_grad_ready(param)`：统计 `param` 所在桶中已就绪的梯度；然后从 `self.next` 开始，按编号
#   顺序发起所有已凑齐的桶（比前面的桶先凑齐的桶要等前面的桶，与 `BucketedDDP` 一样）：把桶里
#   的梯度展平成一个张量并除以 world size，启动 `dist.all_reduce(flat, async_op=True)`，并保存
#   返回的 `Work` 对象、这个张量和桶编号；
# - `wait()`（在 `backward()` 之后调用）：逐个等待 `Work` 完成，把平均后的值复制回 `param.grad`，
#   再重置计数，为下一步做准备。
#
# 训练几步之后，评分单元会把参数与在全批上训练的单进程模型比较，并观察最后一次反向传播：至少
# 调用两次 `all_reduce`，按桶的编号顺序发起，而且在 `backward()` 返回之前一个都没有等待（阻塞
# 调用也算等待，反复调用 `work.is_completed()` 直到完成的循环同样算）。隐藏模型有两种：一种的
# 桶 0 最先凑齐，所以在最后一个梯度就绪之前就必须发起全归约；另一种里有一层最后定义、最先使用，
# 所以桶 0 最后才凑齐。

# %% tags=["exercise"]
class GradBuckets:
    def __init__(self, module, bucket_cap_mb):
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [[self.params[i] for i in idx] for idx in assign_buckets(self.params, bucket_cap_mb)]
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)  # ready gradients per bucket
        self.next = 0  # the next bucket to launch: buckets go out in index order
        self.works = []  # (work, flat tensor, bucket index) per launched bucket
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def on_grad_ready(self, param):
        ### BEGIN SOLUTION
        self.ready[self.bucket_of[id(param)]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            b = self.next
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]]) / dist.get_world_size()
            self.works.append((dist.all_reduce(flat, async_op=True), flat, b))
            self.next += 1
        ### END SOLUTION

    def wait(self):
        ### BEGIN SOLUTION
        for work, flat, b in self.works:
            work.wait()
            offset = 0
            for p in self.buckets[b]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.works.clear()
        self.ready = [0] * len(self.buckets)
        self.next = 0
        ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 2
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
x = torch.randn(4, 8)
hooks = GradBuckets(net, bucket_cap_mb=1e-4)
net(x + rank).sum().backward()  # rank r's data: x + r
hooks.wait()
want = 0  # the mean of every rank's gradient, each computed here without hooks
for r in range(world_size):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    ref(x + r).sum().backward()
    want = want + ref[2].weight.grad / world_size
print("buckets:", len(hooks.buckets), "| last layer's grad:", dl.compare(net[2].weight.grad, want))

# %% tags=["grade"] grade_id="07.bucketed" points=3
dl.grade("07.bucketed", GradBuckets)

# %% [markdown] lang="en"
# ## Summary
#
# - One DDP iteration, step by step on persistent ranks: broadcast, forward and backward on
#   each rank's own data (the gradients differ), all-reduce and average them (identical,
#   and equal to the full-batch gradient), step (the replicas stay identical).
# - DDP = broadcast at construction + averaged gradients after backward; `NaiveDDP`
#   reproduces torch's parameters bitwise on 2 ranks.
# - Buckets, hooks and asynchronous all-reduce let communication overlap backward;
#   `BucketedDDP` is a ~100-line Python reducer whose step time was measured above against
#   torch's C++ one. Torch reduces the first iteration in one bucket, then rebuilds the
#   buckets in the order gradients arrived, the output layers first (1 MiB by default).
# - Hogwild shares one model between processes instead; DDP keeps identical replicas.
# - DDP equals gradient accumulation only for deterministic models with a mean loss;
#   `no_sync()`, rank-0 checkpoint loading, per-rank augmentation seeds,
#   `find_unused_parameters` and `SyncBatchNorm` follow from the two ideas above.
#
# Next, chapter 08 uses all of this in a full training run.

# %% [markdown] lang="zh"
# ## 小结
#
# - 在常驻的 rank 上一步一步走完了 DDP 的一次迭代：广播；每个 rank 在自己的数据上做前向和反向
#   传播（梯度各不相同）；对梯度做全归约并取平均（各 rank 相同，且等于整批的梯度）；优化器步骤
#   （各副本仍然相同）。
# - DDP = 构造时广播 + 反向传播后平均梯度；`NaiveDDP` 在 2 个 rank 上逐位复现了 torch 的参数。
# - 桶、钩子和异步全归约让通信与反向计算重叠；`BucketedDDP` 是一个约 100 行的 Python 归约器，
#   上面实测比较了它和 torch 的 C++ 归约器的单步耗时。torch 在第一次迭代时只用一个桶，之后按梯度
#   实际到达的顺序重建各个桶，输出层所在的桶在最前（默认 1 MiB）。
# - Hogwild 则让多个进程共享同一个模型；DDP 保持各副本相同。
# - 只有模型是确定性的、损失取平均时，DDP 才等于梯度累积；`no_sync()`、只在 rank 0 加载
#   检查点、每个 rank 不同的数据增强种子、`find_unused_parameters` 和 `SyncBatchNorm`，都可以从
#   开头的两个想法推出来。
#
# 下一章（第 08 章）会在一次完整的训练中用到这些内容。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`07.concepts`,
# 2 points when all are right).
#
# **1.** Each rank calls `torch.manual_seed(rank)` before building its model, then wraps it in `DistributedDataParallel`. Right after construction, the ranks' parameters are:
#
# - (a) an error: the parameters differ
# - (b) the mean of all ranks' initialisations
# - (c) rank 0's, on every rank
# - (d) each rank's own initialisation: they will drift apart
#
# **2.** When is DDP's averaged gradient on N ranks equal to the gradient of one process on the whole global batch?
#
# - (a) when each rank's loss is a mean over the same number of samples and nothing couples samples across the batch (no BatchNorm statistics)
# - (b) never: all-reduce adds rounding
# - (c) always
# - (d) only with SGD
#
# **3.** Why does DDP plan its buckets in the reverse of `model.parameters()` order?
#
# - (a) NCCL requires it
# - (b) to make the result deterministic
# - (c) to save memory
# - (d) gradients become ready roughly in reverse order during backward, so the first bucket fills early and its all-reduce overlaps the rest of backward
#
# **4.** `bare = nn.BatchNorm1d(3)`, then `nn.SyncBatchNorm.convert_sync_batchnorm(bare)` with its result dropped. What is `type(bare).__name__` now?
#
# - (a) an error was raised
# - (b) BatchNorm1d
# - (c) None
# - (d) SyncBatchNorm


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`07.concepts`，全部答对得 2 分）。
#
# **1.** 每个 rank 在构建模型之前调用 `torch.manual_seed(rank)`，然后用 `DistributedDataParallel` 包装。构造刚完成时，各 rank 的参数：
#
# - (a) 报错：参数不一致
# - (b) 所有 rank 初始化的平均值
# - (c) 每个 rank 上都是 rank 0 的参数
# - (d) 是各自的初始化：之后会越走越远
#
# **2.** 什么时候，DDP 在 N 个 rank 上平均后的梯度，等于单个进程在整个全局批次上的梯度？
#
# - (a) 每个 rank 的损失都是对相同数量样本取平均，并且没有跨样本的耦合（没有 BatchNorm 统计量）时
# - (b) 永远不会：全归约带来舍入误差
# - (c) 总是
# - (d) 只在用 SGD 时
#
# **3.** 为什么 DDP 按 `model.parameters()` 的逆序来规划桶（bucket）？
#
# - (a) NCCL 要求这样
# - (b) 为了让结果确定
# - (c) 为了省内存
# - (d) 反向传播中梯度大致按逆序就绪，于是第一个桶很早就满了，它的全归约可以和剩下的反向传播重叠
#
# **4.** `bare = nn.BatchNorm1d(3)`，然后调用 `nn.SyncBatchNorm.convert_sync_batchnorm(bare)` 但丢弃了返回值。现在 `type(bare).__name__` 是什么？
#
# - (a) 已经报错
# - (b) BatchNorm1d
# - (c) None
# - (d) SyncBatchNorm


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: "c",  # a letter
    2: "a",  # a letter
    3: "d",  # a letter
    4: "b",  # a letter
    ### END ANSWERS
}
dl.quiz("07", my_answers)


# %% tags=["grade"] grade_id="07.concepts" points=2
dl.grade("07.concepts", my_answers)
