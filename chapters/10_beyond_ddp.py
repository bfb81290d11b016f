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
#       en: "10 DDP in production and what comes after it"
#       zh: "10 生产环境中的 DDP，以及 DDP 之后"
# ---

# %% [markdown] lang="en"
# # 10 DDP in production and what comes after it
#
# You can write DDP from scratch (chapter 07). This chapter answers the questions that come
# next. Why is my step slower or bigger than it should be (DDP's knobs)? How do I send fewer
# bytes (**comm hooks**)? How does **mixed precision** fit in? And what do I do when the
# model, its gradients and its **optimizer state** no longer fit on one device: shard the
# optimizer state (**ZeRO-1**), then the gradients, then the parameters (**FSDP**). You
# write ZeRO-1 and FSDP yourself, run them on this CPU with gloo, and check them against
# PyTorch: `ZeroRedundancyOptimizer`, `fully_shard` and single-process training.

# %% [markdown] lang="zh"
# # 10 生产环境中的 DDP，以及 DDP 之后
#
# 你已经能从零写出 DDP（第 07 章）。本章回答接下来会遇到的问题：为什么我的训练步比预期的
# 更慢、更占内存（DDP 的各个开关）？怎样用**通信钩子**（comm hook）少发送一些字节？
# **混合精度**（mixed precision）怎样配合 DDP？当模型、梯度和**优化器状态**（optimizer
# state）在一个设备上放不下时怎么办：先把优化器状态分片（**ZeRO-1**），再把梯度分片，最后
# 把参数也分片（**FSDP**）。ZeRO-1 和 FSDP 都由你亲手实现，在这台 CPU 上用 gloo 运行，并与
# PyTorch 对照：`ZeroRedundancyOptimizer`、`fully_shard` 和单进程训练。

# %%
import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab as dl
from ddp_lab.comm_hooks import compare_hooks, count_collectives, format_table
from ddp_lab.labs.ddp_knobs import format_knob_table, measure_knobs
from ddp_lab.fsdp import FullyShardedDP, plot_fsdp_timeline
from ddp_lab.labs.memory_model import measure_memory, paper_example, plot_memory, worst_rank
from ddp_lab.zero import ShardedOptimizer, assign_shards

dl.setup()
print(torch.__version__, "| CUDA GPUs:", torch.cuda.device_count())

# %% [markdown] lang="en"
# ## 1. DDP's knobs, measured
#
# Four settings of `DistributedDataParallel`, one model, one run on 2 ranks. The model
# (`ShuffledMLP`, 12 layers of 256×256) calls its layers in an order different from the
# order it defines them, and `bucket_cap_mb=1`. For each setting the cell counts:
#
# - **gradients + buckets**: the bytes of the distinct storages behind every `param.grad`
#   and every bucket that a pass-through comm hook receives;
# - **buckets per iteration**, seen by that hook, in iterations 0, 1 and 2.
#
# Both are exact counts. The table has no step-time column: on a shared CPU and a model
# this small, the time of one setting varies from run to run by more than the settings
# differ, so a measured "slower" or "faster" would be noise.

# %% [markdown] lang="zh"
# ## 1. 实测 DDP 的各个开关
#
# 用同一个模型，在 2 个 rank（进程编号）上把 `DistributedDataParallel` 的四种设置各运行一次。模型
# （`ShuffledMLP`，12 层 256×256）调用各层的顺序与定义顺序不同，`bucket_cap_mb=1`。对每种
# 设置，下面的单元统计：
#
# - **梯度 + 桶**：所有 `param.grad` 以及透传通信钩子收到的每个桶所占的存储（storage）
#   字节数，同一块存储只计一次；
# - **每次迭代的桶数**：由这个钩子在第 0、1、2 次迭代中看到。
#
# 两者都是精确计数。表里没有单步耗时一列：在共享的 CPU 上、这么小的模型，同一种设置每次运行
# 的耗时差别比各设置之间的差别还大，测出来的“更慢”或“更快”只是噪声。

# %%
knobs = dl.spawn(measure_knobs, nprocs=2, backend="gloo")[0]
print(format_knob_table(knobs))

# %% [markdown] lang="en"
# What the table shows, and where torch decides it (`torch/nn/parallel/distributed.py`):
#
# - **`gradient_as_bucket_view=True`** halves the memory for gradients: by default each
#   `param.grad` has its own storage and DDP copies it into a bucket (2x the parameters);
#   with the flag, each gradient *is* a view into its bucket (1x). Use it. What breaks the
#   views is `detach_()` on a gradient (the DDP docstring's warning). A `param.grad` that
#   is `None` or replaced by a new tensor is handled: `mark_variable_ready_dense` in
#   `reducer.cpp` copies it into the bucket and points `param.grad` at the bucket again,
#   at the cost of that copy (`zero_grad(set_to_none=False)` keeps the views and avoids it).
# - **The first iteration uses one bucket** for all parameters, then DDP **rebuilds** the
#   buckets in the order the gradients really arrived (`_BucketCapacityConfig.
#   compute_bucket_size_limits` returns `[sys.maxsize]` unless `find_unused_parameters=True`
#   without `static_graph`). So time your steps after the first two iterations.
# - **`static_graph=True`** records the graph in iteration 0 and rebuilds after iteration 1;
#   it lets DDP skip per-step bookkeeping, and it makes DDP accept reentrant backward
#   passes (the next cell).
# - **`find_unused_parameters=True`** walks the autograd graph from the outputs after every
#   forward (a cost that grows with the number of autograd nodes), and the buckets are
#   never rebuilt: they keep the construction plan, the **reverse** of the definition
#   order, not the order gradients arrive in, so less communication overlaps backward.
#   Turn it on only for a model that really skips parameters (chapter 07, section 5).
#   DDP says as much: with no parameter unused, each rank printed the reducer's warning
#   above the table (chapter 07, section 4: why `warnings` filters do not hide it).

# %% [markdown] lang="zh"
# 表格说明了什么，以及 torch 在哪里做出这些决定（`torch/nn/parallel/distributed.py`）：
#
# - **`gradient_as_bucket_view=True`** 让梯度占用的内存减半：默认情况下每个 `param.grad`
#   有自己的存储，DDP 再把它复制进桶里（参数的 2 倍）；打开这个开关后，每个梯度**就是**
#   桶的一个视图（1 倍）。建议打开它。会破坏视图的是对梯度调用 `detach_()`（DDP 文档字符串
#   里的警告）。`param.grad` 为 `None` 或被换成新张量的情况 DDP 能处理：`reducer.cpp` 的
#   `mark_variable_ready_dense` 会把它复制进桶，再让 `param.grad` 重新指向桶，代价是多一次
#   复制（`zero_grad(set_to_none=False)` 保留视图，省掉这次复制）。
# - **第一次迭代只用一个桶**装下所有参数，之后 DDP 按梯度实际到达的顺序**重建**桶
#   （`_BucketCapacityConfig.compute_bucket_size_limits` 返回 `[sys.maxsize]`，除非设置了
#   `find_unused_parameters=True` 且没有 `static_graph`）。所以测量单步耗时要从第三次迭代开始。
# - **`static_graph=True`** 在第 0 次迭代记录计算图，第 1 次迭代之后重建桶；它让 DDP 省去
#   每一步的一些簿记工作，并让 DDP 接受可重入（reentrant）的反向传播（见下一个单元）。
# - **`find_unused_parameters=True`** 在每次前向之后从输出出发遍历 autograd 图（开销随
#   autograd 节点数增长），而且桶永远不会重建：它们保持构造时的分法，即定义顺序的**逆序**，
#   而不是梯度到达的顺序，所以与反向计算重叠的通信更少。只有当模型确实会跳过某些参数时才
#   打开它（第 07 章第 5 节）。DDP 自己也会提醒：没有未使用的参数时，每个 rank 都在表格上方打印
#   了 reducer 的那条警告（为什么 `warnings` 的过滤器挡不住它，见第 07 章第 4 节）。

# %% [markdown] lang="en"
# **Activation checkpointing under DDP.** `torch.utils.checkpoint.checkpoint(fn, x,
# use_reentrant=...)` drops `fn`'s activations in forward and recomputes them in backward.
# The reentrant variant (`use_reentrant=True`, still what torch 2.13 uses when you pass
# nothing, with a warning; `torch/utils/checkpoint.py`) runs that recomputation as
# a separate, nested backward pass; the DDP docstring lists what `static_graph=True` adds
# support for: "Reentrant backwards. Activation checkpointing multiple times. Activation
# checkpointing when model has unused parameters." The cell checkpoints one block twice
# per forward (a layer applied twice, as in weight-shared models) and compares each rank's
# gradients after DDP with the average computed in one process:

# %% [markdown] lang="zh"
# **DDP 下的激活检查点**。`torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=...)` 实现的
# 是激活检查点（activation checkpointing）：前向时丢掉 `fn` 的激活值，反向时再重新计算。可重入
# 版本（`use_reentrant=True`；不传这个参数时，torch 2.13 仍默认用它，同时给出警告，见
# `torch/utils/checkpoint.py`）把这次重算作为一次单独的、嵌套的反向传播来运行；DDP 的文档字符串
# 列出了 `static_graph=True` 额外支持的情形：“Reentrant backwards. Activation checkpointing
# multiple times. Activation checkpointing when model has unused parameters.”（即可重入的反向传播、多次
# 激活检查点、模型有未使用参数时的激活检查点。）下面的单元在每次
# 前向中对同一个块做两次检查点（同一层用两次，权重共享的模型就是这样），并把各 rank 经 DDP 平均
# 后的梯度与单进程算出的平均梯度相比较：

# %%
class CheckpointedTwice(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.block, self.head, self.reentrant = nn.Linear(8, 8), nn.Linear(8, 1), reentrant

    def forward(self, x):
        for _ in range(2):  # the same block, checkpointed twice
            x = torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(self.block(t)), x,
                                                  use_reentrant=self.reentrant)
        return self.head(x)


def checkpointing_under_ddp(rank):
    import warnings

    rows = []
    for reentrant, kwargs in [(True, {}), (True, {"static_graph": True}), (True, {"find_unused_parameters": True}),
                              (False, {}), (False, {"find_unused_parameters": True})]:
        torch.manual_seed(0)
        net = CheckpointedTwice(reentrant)
        ref, model = copy.deepcopy(net), DDP(net, **kwargs)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Python's only: DDP's C++ warning is not (ch. 07, 4)
                for step in range(3):
                    xs = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(step))
                    model.zero_grad()
                    ref.zero_grad()
                    model(xs[rank].requires_grad_(reentrant)).sum().backward()
                    (ref(xs[0].clone().requires_grad_()).sum() + ref(xs[1].clone().requires_grad_()).sum()).div(2).backward()
                    diff = max((a.grad - b.grad).abs().max().item()
                               for a, b in zip(model.module.parameters(), ref.parameters()))
            result = f"no error, gradients off by {diff:.1e}"
        except RuntimeError as err:
            result = f"RuntimeError: {str(err).split('.')[0]}"
        rows.append(f"use_reentrant={reentrant!s:5} {str(kwargs):33} {result}")
    return rows


print(*dl.spawn(checkpointing_under_ddp, nprocs=2, backend="gloo", quiet=True)[0], sep="\n")

# %% [markdown] lang="en"
# Reentrant checkpointing of a block used twice gives **wrong gradients without an error**
# under plain DDP, an error with `find_unused_parameters=True`, and the right gradients
# with `static_graph=True`. Non-reentrant checkpointing (`use_reentrant=False`) is right in
# every case, with no flag: prefer it (torch's own `checkpoint` warns when `use_reentrant`
# is not passed and recommends `False`). Keep `static_graph=True` for code that must stay
# reentrant. With FSDP, checkpoint inside each unit: the recomputation runs in the unit's
# backward, after `fully_shard`'s pre-backward hook has gathered its parameters, and reuses
# that gather (`_pre_forward` in `torch/distributed/fsdp/_fully_shard/_fsdp_state.py`).

# %% [markdown] lang="zh"
# 对用了两次的块做可重入检查点：普通 DDP 下**不报错，梯度却是错的**；加
# `find_unused_parameters=True` 会报错；`static_graph=True` 时梯度正确。非可重入检查点
# （`use_reentrant=False`）在所有情形下都正确，不需要任何开关：优先用它（torch 自己的
# `checkpoint` 在没有传 `use_reentrant` 时会给出警告，并推荐 `False`）。只有必须保留可重入
# 写法的代码，才用 `static_graph=True`。配合 FSDP 时，在每个单元内部做检查点：重算发生在该
# 单元的反向阶段，此时 `fully_shard` 的反向前置钩子（pre-backward hook）已经全收集了它的参数，重算直接复用这次全收集
# （见 `torch/distributed/fsdp/_fully_shard/_fsdp_state.py` 的 `_pre_forward`）。

# %% [markdown] lang="en"
# ## 2. Comm hooks: send fewer bytes
#
# `model.register_comm_hook(state, hook)` replaces the all-reduce of each bucket by
# `hook(state, bucket)`, which returns a `Future` of the averaged bucket. torch's own hooks
# live in `torch/distributed/algorithms/ddp_comm_hooks/`: `default_hooks.py`
# (`allreduce_hook`, `fp16_compress_hook`, `bf16_compress_hook`) and `powerSGD_hook.py`.
# Here is the compression helper both fp16 and bf16 use:

# %% [markdown] lang="zh"
# ## 2. 通信钩子：少发送一些字节
#
# `model.register_comm_hook(state, hook)` 用 `hook(state, bucket)` 替换每个桶的全归约，
# 钩子返回平均后的桶的一个 `Future`。torch 自带的钩子在
# `torch/distributed/algorithms/ddp_comm_hooks/` 中：`default_hooks.py`
# （`allreduce_hook`、`fp16_compress_hook`、`bf16_compress_hook`）和 `powerSGD_hook.py`。
# 下面是 fp16 和 bf16 共用的压缩函数：

# %%
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402

dl.show_source(default_hooks._compress_hook)

# %% [markdown] lang="en"
# Cast to 16 bits, divide by the world size *before* the sum (so fp16 does not overflow),
# all-reduce asynchronously, copy back into the float32 bucket in a `then` callback.
# PowerSGD goes further: it sends two thin matrices P and Q (a rank-r approximation of
# each gradient matrix), keeping the error it made for the next step (error feedback).
#
# One run on the digits (2 ranks, 60 steps of SGD with momentum): bytes handed to the
# collectives per step (`count_collectives` wraps `torch.distributed.all_reduce`, which all
# these hooks call), test accuracy, and how far the parameters end from plain DDP.
#
# The ranks run with the GPUs hidden (`dl.gpus_hidden()` sets `CUDA_VISIBLE_DEVICES=""` for
# the ranks it launches). The model is on CPU, and PowerSGD's `decompress` calls
# `torch.cuda.synchronize(device)` whenever `torch.cuda.is_available()`, for a CPU bucket
# too (`powerSGD_hook.py`), which raises "Expected a cuda device, but got: cpu" on a
# machine with a GPU.

# %% [markdown] lang="zh"
# 转换为 16 位，在求和**之前**除以 world size（这样 fp16 不会溢出），异步全归约，再在
# `then` 回调里复制回 float32 的桶。PowerSGD 更进一步：它发送两个细长的矩阵 P 和 Q（对每个
# 梯度矩阵做秩为 r 的低秩近似），并把这一步产生的误差留到下一步补上（误差反馈，error feedback）。
#
# 在手写数字数据集（digits）上运行一次（2 个 rank，带动量的 SGD 训练 60 步）：每步交给集合
# 通信的字节数（`count_collectives` 包装了 `torch.distributed.all_reduce`，这些钩子都调用它）、测试准确率，
# 以及最终参数与普通 DDP 相差多少。
#
# 这些 rank 看不到 GPU（`dl.gpus_hidden()` 为它启动的 rank 设置 `CUDA_VISIBLE_DEVICES=""`）。
# 模型在 CPU 上，而 PowerSGD 的 `decompress` 只要 `torch.cuda.is_available()` 为真就调用
# `torch.cuda.synchronize(device)`，桶在 CPU 上也照样调用（见 `powerSGD_hook.py`）；在有 GPU
# 的机器上，这会报错“Expected a cuda device, but got: cpu”。

# %%
with dl.gpus_hidden():  # a CPU model: see above
    hook_rows = dl.spawn(compare_hooks, nprocs=2, backend="gloo")[0]
print(format_table(hook_rows))

# %% [markdown] lang="en"
# fp16 and bf16 send exactly half the bytes and land on the same accuracy; bf16 drifts
# further from plain DDP than fp16 (7 bits of mantissa instead of 10). PowerSGD sends a
# small fraction and, at rank 1, costs accuracy after so few steps; rank 4 is closer to plain DDP.
# These are payload bytes; a ring all-reduce moves about 2(N-1)/N times that per rank
# (chapter 05).
#
# Two things found by running the code; the docs only hint at them. (1) DDP refuses a
# hook *named* `bf16_compress_hook` unless torch was **built** with CUDA (or ROCm) and NCCL
# >= 2.10 (`_check_comm_hook` in `distributed.py` checks `hook.__name__` and the build, not
# whether this run uses a GPU or NCCL), although gloo all-reduces bfloat16 on CPU; the
# hook's docstring only says it "requires NCCL version later than 2.9.6". The table calls
# the very same function through a wrapper (`builtin_bf16_hook`). (2) `PowerSGDState`
# refuses `start_powerSGD_iter <= 1` when error feedback or warm start is on (a warning in
# its docstring says the minimum is 2, because DDP rebuilds its buckets after iteration
# 1); the table uses 2, so the first step is a plain all-reduce.

# %% [markdown] lang="zh"
# fp16 和 bf16 发送的字节数恰好减半，准确率相同；bf16 的结果比 fp16 偏离普通 DDP 更多（bf16
# 的尾数只有 7 位，fp16 有 10 位）。PowerSGD 只发送很小一部分，但在秩 1 时，这么少的步数就会损失准确率；
# 秩 4 更接近普通 DDP。这些是有效载荷（payload）字节；环形全归约中每个 rank 实际传输的约为
# 它的 2(N-1)/N 倍（第 05 章）。
#
# 有两点是运行代码时发现的，文档只是略有提及。（1）除非 torch 在**构建时**带了 CUDA（或
# ROCm）且 NCCL >= 2.10，DDP 会拒绝**名字叫** `bf16_compress_hook` 的钩子（`distributed.py`
# 中的 `_check_comm_hook` 检查的是 `hook.__name__` 和构建信息，而不是这次运行是否用 GPU 或
# NCCL），尽管 gloo 在 CPU 上可以对 bfloat16 做全归约；钩子的文档字符串只说它“需要高于 2.9.6
# 的 NCCL”。上表通过一个包装函数（`builtin_bf16_hook`）调用的是同一个函数。（2）开启误差反馈
# 或热启动（warm start）时，`PowerSGDState` 不接受 `start_powerSGD_iter <= 1`（它的文档字符串
# 里有一条警告：最小值是 2，因为 DDP 在第 1 次迭代之后会重建桶）；上表用的是 2，所以第一步是
# 普通的全归约。

# %% [markdown] lang="en"
# ## 3. Mixed precision with DDP
#
# With `torch.autocast`, the parameters stay float32 and only the operations run in the
# low-precision dtype; the gradients autograd writes into `param.grad` are float32, so
# **DDP's all-reduce happens in float32**. A recording hook shows the bucket's dtype, with
# bf16 autocast on CPU:

# %% [markdown] lang="zh"
# ## 3. 混合精度与 DDP
#
# 使用 `torch.autocast` 时，参数仍是 float32，只有运算在低精度 dtype 下进行；autograd 写进
# `param.grad` 的梯度是 float32，所以 **DDP 的全归约以 float32 进行**。下面在 CPU 上用 bf16
# autocast，用一个记录钩子查看桶的 dtype：

# %%
def autocast_dtypes(rank):
    seen = []

    def record(state, bucket):
        seen.append(str(bucket.buffer().dtype))
        return default_hooks.allreduce_hook(state, bucket)

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    model.register_comm_hook(None, record)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(8, 16))
    out.float().pow(2).mean().backward()
    p = next(model.parameters())
    return {"output": str(out.dtype), "param": str(p.dtype), "grad": str(p.grad.dtype), "bucket": seen}


print(dl.spawn(autocast_dtypes, nprocs=2, backend="gloo")[0])

# %% [markdown] lang="en"
# To all-reduce in 16 bits as well, add `bf16_compress_hook` or `fp16_compress_hook`
# (section 2). DDP also has an experimental `mixed_precision=_MixedPrecision(param_dtype,
# reduce_dtype, buffer_dtype)` argument (`torch/nn/parallel/distributed.py`, private, "subject
# to change"); it keeps low-precision copies of the parameters and waits on a stream event
# before each forward, so it needs a GPU: on CPU it fails, as the next cell shows.

# %% [markdown] lang="zh"
# 如果希望全归约也用 16 位，就加上 `bf16_compress_hook` 或 `fp16_compress_hook`（第 2 节）。
# DDP 还有一个实验性的参数 `mixed_precision=_MixedPrecision(param_dtype, reduce_dtype,
# buffer_dtype)`（`torch/nn/parallel/distributed.py`，私有 API，“可能会改变”）；它保存参数的
# 低精度副本，并在每次前向之前等待一个流事件（event），所以需要 GPU：在 CPU 上会失败，见下一个单元。

# %%
def ddp_mixed_precision(rank):
    from torch.nn.parallel.distributed import _MixedPrecision

    try:
        mp = _MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        model = DDP(nn.Linear(4, 2), mixed_precision=mp)
        model(torch.randn(3, 4)).sum().backward()
        return f"ran: grad dtype {model.module.weight.grad.dtype}"
    except RuntimeError as err:
        return f"RuntimeError: {err}"


print(dl.spawn(ddp_mixed_precision, nprocs=2, backend="gloo", quiet=True)[0])

# %% [markdown] lang="en"
# With fp16 on a GPU you also need a `GradScaler` (fp16 underflows small gradients). With
# DDP the order is: `scaler.scale(loss).backward()` (DDP all-reduces the *scaled*
# gradients), then `scaler.unscale_(opt)` **before** clipping, then `clip_grad_norm_`,
# then `scaler.step(opt)` and `scaler.update()`. With `no_sync()` accumulation, clip only
# after the last micro-batch, when the gradients are synchronised. The next cell runs this
# on 2 GPUs and otherwise says what it would show.

# %% [markdown] lang="zh"
# 在 GPU 上用 fp16 时还需要 `GradScaler`（fp16 会让很小的梯度下溢为 0）。配合 DDP 的顺序是：
# `scaler.scale(loss).backward()`（DDP 对**放大后**的梯度做全归约），然后在裁剪**之前**调用
# `scaler.unscale_(opt)`，再 `clip_grad_norm_`，最后 `scaler.step(opt)` 和 `scaler.update()`。
# 用 `no_sync()` 做梯度累积时，只在最后一个微批之后、梯度已经同步时才裁剪。下一个单元在
# 2 块 GPU 上运行这段代码，否则说明它会显示什么。

# %%
if torch.cuda.device_count() >= 2:

    def fp16_scaler(rank):
        device = dl.this_rank_device()  # nccl: this rank's own GPU (ddp_lab/runtime/device.py)
        model = DDP(nn.Linear(16, 4).to(device), device_ids=[device])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        x = torch.randn(8, 16, device=device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        print(f"scale {scaler.get_scale():.0f}, grad norm after unscale_ {norm:.3f}")

    dl.spawn(fp16_scaler, nprocs=2, backend="nccl")
else:
    print(dl.tr(en="Skipped: no 2 GPUs here. On 2 GPUs this cell trains one fp16 step with GradScaler "
                   "under DDP and prints the loss scale and the unscaled gradient norm.",
                zh="已跳过：这里没有 2 块 GPU。在 2 块 GPU 上，本单元会在 DDP 下用 GradScaler 训练一步 fp16，"
                   "并打印损失缩放因子和还原后的梯度范数。"))

# %% [markdown] lang="en"
# ## 4. ZeRO-1: shard the optimizer state
#
# Under DDP every rank holds everything: parameters, gradients and optimizer state. The
# ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, section 3) counts, for Psi
# parameters and mixed-precision Adam, 2 Psi bytes of fp16 parameters, 2 Psi of fp16
# gradients and K Psi of optimizer state with K = 12 (an fp32 copy of the parameters,
# momentum and variance: 3 × 4 bytes). Sharding the optimizer state over N ranks (stage 1)
# divides the K term by N; stage 2 the gradients too; stage 3 the parameters too. The
# paper's Figure 1 example, Psi = 7.5 B on N = 64, computed from this model (the figure
# shows the same four values: 120, 31.4, 16.6 and 1.9 GB):

# %% [markdown] lang="zh"
# ## 4. ZeRO-1：把优化器状态分片
#
# 在 DDP 下，每个 rank 都持有全部内容：参数、梯度和优化器状态。ZeRO 论文（Rajbhandari 等，
# 2019，arXiv:1910.02054，第 3 节）对 Psi 个参数、混合精度 Adam 的情况计算如下：fp16 参数
# 2 Psi 字节，fp16 梯度 2 Psi 字节，优化器状态 K Psi 字节，K = 12（参数的 fp32 副本、动量和
# 方差：3 × 4 字节）。把优化器状态在 N 个 rank 上分片（第 1 阶段）使 K 这一项除以 N；第 2
# 阶段把梯度也分片；第 3 阶段把参数也分片。论文图 1 的例子是 Psi = 75 亿、N = 64，下面按这个
# 模型计算（图中给出的正是这四个值：120、31.4、16.6 和 1.9 GB）：

# %%
for stage, gb in paper_example(psi=7.5e9, n=64):
    print(f"{stage:26s} {gb:7.1f} GB per rank")

# %% [markdown] lang="en"
# `ddp_lab.zero.ShardedOptimizer(params, optimizer_class, **defaults)` is shaped like
# `torch.distributed.optim.ZeroRedundancyOptimizer`
# (`torch/distributed/optim/zero_redundancy_optimizer.py`): it assigns each parameter to one
# rank with torch's greedy rule (largest first, to the least loaded rank, as
# `_partition_parameters` does), builds the real optimizer over its own shard only, steps
# it, and then **broadcasts** every parameter from its owner. Gradients stay whole (DDP
# all-reduced them): that is stage 1.

# %% [markdown] lang="zh"
# `ddp_lab.zero.ShardedOptimizer(params, optimizer_class, **defaults)` 的接口仿照
# `torch.distributed.optim.ZeroRedundancyOptimizer`
# （`torch/distributed/optim/zero_redundancy_optimizer.py`）：它用 torch 的贪心规则
# （与 `_partition_parameters` 一样，先分配最大的参数，每次给负载最小的 rank）把每个参数
# 分给一个 rank，只在自己的分片上构建真正的优化器并执行一步更新，然后从所属 rank **广播**每个
# 参数。梯度仍然是完整的（DDP 已对它们做了全归约）：这就是第 1 阶段。

# %%
dl.show_source(ShardedOptimizer.step)

# %%
sizes = [p.numel() for p in nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 32), nn.Linear(32, 10)).parameters()]
print("sizes", sizes, "-> owners on 2 ranks", assign_shards(sizes, 2), "on 3 ranks", assign_shards(sizes, 3))

# %% [markdown] lang="en"
# Three optimizers on 2 ranks, the same model (with a frozen layer), AdamW with weight
# decay: plain AdamW on the full batch in one process, `ShardedOptimizer` and torch's
# `ZeroRedundancyOptimizer`, each rank on half the batch. The cell prints the largest
# parameter differences and how many optimizer-state elements each rank holds
# (`tests/test_zero.py` adds tied weights, two parameter groups, 3 ranks and the
# consolidated `state_dict`).

# %% [markdown] lang="zh"
# 在 2 个 rank 上比较三个优化器，模型相同（含一个冻结层），都是带权重衰减的 AdamW：单进程在
# 全批上运行的普通 AdamW、`ShardedOptimizer` 和 torch 的 `ZeroRedundancyOptimizer`，后两者
# 每个 rank 处理半批。单元打印参数的最大差值，以及每个 rank 持有多少个优化器状态元素
# （`tests/test_zero.py` 还测试了共享（绑定）权重、两个参数组、3 个 rank 和汇总后的
# `state_dict`）。

# %%
def zero_vs_torch(rank, steps=4):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    world = dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    net[0].requires_grad_(False)
    models = {"plain": net, "ours": copy.deepcopy(net), "torch": copy.deepcopy(net)}
    kw = {"lr": 0.01, "weight_decay": 0.1}
    opts = {"plain": torch.optim.AdamW(models["plain"].parameters(), **kw),
            "ours": ShardedOptimizer(models["ours"].parameters(), torch.optim.AdamW, **kw),
            "torch": ZeroRedundancyOptimizer(models["torch"].parameters(), torch.optim.AdamW, **kw)}
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(world * 4, 8, generator=gen), torch.randn(world * 4, 3, generator=gen)
        for name, m in models.items():
            opts[name].zero_grad()
            xs, ys = (x, y) if name == "plain" else (x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4])
            nn.functional.mse_loss(m(xs), ys).backward()
            if name != "plain":
                for p in m.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                        p.grad /= world
            opts[name].step()
    flat = {n: torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for n, m in models.items()}
    state = sum(v.numel() for s in opts["ours"].optim.state.values() for v in s.values() if v.dim())
    print(f"ShardedOptimizer - AdamW: {(flat['ours'] - flat['plain']).abs().max():.1e}, "
          f"- ZeroRedundancyOptimizer: {(flat['ours'] - flat['torch']).abs().max():.1e}, "
          f"optimizer-state elements here: {state}")


dl.spawn(zero_vs_torch, nprocs=2, backend="gloo");

# %% [markdown] lang="en"
# **Memory per rank, counted.** `measure_memory` counts the bytes of the tensors each rank
# holds after two AdamW steps (float32, so 4 + 4 + 8 bytes per parameter) under DDP
# (`gradient_as_bucket_view=True`), ZeRO-1 and this chapter's FSDP (section 5; its
# gathered parameters at their peak included). It runs on 2, 3 and 4 ranks; for each
# method, the rank that holds the most is shown (the first to run out of memory). Dots:
# counted; dashes: the 4+4+8 model.

# %% [markdown] lang="zh"
# **每个 rank 的内存，逐字节统计**。`measure_memory` 统计每个 rank 在两步 AdamW 之后持有的
# 张量字节数（float32，所以每个参数 4 + 4 + 8 字节），对 DDP（`gradient_as_bucket_view=True`）、
# ZeRO-1 和本章的 FSDP（第 5 节，包括峰值时已全收集的参数）分别统计。在 2、3、4 个 rank 上各运行一次；
# 每种方法显示持有字节最多的那个 rank（也就是最先耗尽内存的那个）。点是实际计数，虚线是按
# 4+4+8 模型算出的值。

# %%
memory = {n: worst_rank(dl.spawn(measure_memory, nprocs=n, backend="gloo")) for n in (2, 3, 4)}
print(dl.tr(en="| N | method | params MiB | grads MiB | optimizer MiB | gathered peak MiB | total MiB |",
            zh="| N | 方法 | 参数 MiB | 梯度 MiB | 优化器 MiB | 全收集峰值 MiB | 合计 MiB |"))
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for n, rows in memory.items():
    for r in rows:
        print(f"| {n} | {r['method']} | " + " | ".join(
            f"{r[k] / 2**20:.2f}" for k in ("params", "grads", "optim", "gathered_peak", "total")) + " |")
plot_memory(memory);

# %% [markdown] lang="en"
# ZeRO-1's optimizer column shrinks with N but not to exactly 1/N: it shards whole
# parameters, and this model (`memory_mlp(512, 4)` in `ddp_lab/labs/memory_model.py`) has three
# 512×512 weight matrices, a 512×64 input layer and a small output layer, so on 2 ranks
# one rank owns two of the large ones. FSDP shards a flat vector, so its shards are even (up to padding), and the
# parameters and gradients shrink too; it pays for that with an all-gather before every
# use and with the gathered units. The "gathered peak" column counts gathered
# **parameters** only (one unit at a time here). In backward this `FullyShardedDP` also
# holds, per unit, its full gradient and a copy divided by N (the reduce-scatter's input,
# alive until gloo finishes): about two units more for a moment. DDP with bucket views has
# no such transient, so the table flatters FSDP a little.

# %% [markdown] lang="zh"
# ZeRO-1 的优化器一列随 N 减小，但不是恰好 1/N：它按整个参数分片，而这个模型
# （`ddp_lab/labs/memory_model.py` 中的 `memory_mlp(512, 4)`）有三个 512×512 的权重矩阵、一个
# 512×64 的输入层和一个很小的输出层，所以在 2 个 rank 上，有一个 rank 会分到两个大矩阵。FSDP 对一个展平的向量分片，
# 所以各分片大小相同（至多相差填充的那几个元素），参数和梯度也一起变小；代价是每次使用前都
# 要做一次全收集，而且全收集后的单元要占用内存。“全收集峰值”一列只统计全收集的**参数**（这里同一时刻
# 只有一个单元）。在反向阶段，这个 `FullyShardedDP` 对每个单元还会暂时持有完整的梯度和一份
# 除以 N 之后的副本（归约散发的输入，gloo 完成之前一直存在）：短时间内大约多出两个单元。使用桶视图的 DDP
# 没有这种临时开销，所以这张表对 FSDP 略显偏袒。

# %% [markdown] lang="en"
# ## 5. FSDP from scratch (ZeRO-3)
#
# `ddp_lab.fsdp.FullyShardedDP(module, compute_dtype=None)` keeps each **unit** (here each
# child with parameters) as one flat float32 vector, padded to a multiple of N, of which
# each rank stores only its slice, as an `nn.Parameter`: `model.parameters()` yields the
# shards, so a plain `torch.optim.AdamW` steps them and its state is sharded too.
#
# - before a unit's forward, an **all-gather** rebuilds the full vector and the unit's
#   parameters become views of it; after the forward its storage is **freed**;
# - a hook on the unit's output **gathers again** just before backward reaches the unit
#   (each call of a unit has its own gathered vector, so two forwards before one backward,
#   `(m(x1).sum() + m(x2).sum()).backward()`, work);
# - the gather is an `autograd.Function` whose backward (the gradient hook) starts an
#   asynchronous **reduce-scatter**: the adjoint of an all-gather is a reduce-scatter,
#   and each rank receives only its shard of the averaged gradient.

# %% [markdown] lang="zh"
# ## 5. 从零实现 FSDP（ZeRO-3）
#
# `ddp_lab.fsdp.FullyShardedDP(module, compute_dtype=None)` 把每个**单元**（unit，这里是每个
# 带参数的子模块）保存为一个展平的 float32 向量，并填充到 N 的倍数，每个 rank 只保存其中属于
# 自己的一段，作为一个 `nn.Parameter`：`model.parameters()` 给出的就是这些分片，所以普通的
# `torch.optim.AdamW` 就能更新它们，而且它的状态也是分片的。
#
# - 在一个单元前向之前，**全收集**（all-gather）重建完整向量，单元的参数成为它的视图；前向
#   之后**释放**它的存储；
# - 单元输出上的一个钩子在反向传播到达该单元之前**再次全收集**（单元的每次调用都有自己的
#   全收集向量，所以在一次反向之前做两次前向，即 `(m(x1).sum() + m(x2).sum()).backward()`，
#   也没有问题）；
# - 全收集是一个 `autograd.Function`，它的反向（梯度钩子）启动一个异步的**归约散发**
#   （reduce-scatter）：全收集的伴随操作就是归约散发，每个 rank 只收到平均梯度中属于自己的分片。

# %%
dl.show_source(FullyShardedDP._use_full)

# %%
dl.show_source(FullyShardedDP._after_forward)

# %% [markdown] lang="en"
# The check: on 2 and 3 ranks, `FullyShardedDP` trained with SGD and with AdamW on each
# rank's part of the batch, against one process on the full batch, and against torch's
# own `fully_shard` (FSDP2, `torch/distributed/fsdp/_fully_shard/`), which runs on CPU with
# gloo in this torch. Layer sizes are odd, so the shards need padding.
#
# `fully_shard` is given a CPU mesh. Without one it builds a mesh on the machine's
# accelerator (`_init_default_mesh` in `_fsdp_init.py`: `torch._C._get_accelerator()`), and
# `DeviceMesh` then calls `torch.cuda.set_device(LOCAL_RANK)`
# (`_setup_world_group_and_device` in `torch/distributed/device_mesh.py`): on a machine with
# one GPU, rank 1 fails with "invalid device ordinal", and the CPU tensors here would not
# match a CUDA mesh anyway.

# %% [markdown] lang="zh"
# 验证：在 2 个和 3 个 rank 上，`FullyShardedDP` 分别用 SGD 和 AdamW 在每个 rank 的那部分
# 批上训练，与单进程在全批上的训练比较，也与 torch 自己的 `fully_shard`（FSDP2，
# `torch/distributed/fsdp/_fully_shard/`）比较；在这个版本的 torch 中，它可以在 CPU 上用
# gloo 运行。各层大小是奇数，所以分片需要填充。
#
# 这里显式地给 `fully_shard` 传入一个 CPU 网格（mesh）。不传的话，它会在本机的加速器上建网格
# （`_fsdp_init.py` 中的 `_init_default_mesh` 调用 `torch._C._get_accelerator()`），随后
# `DeviceMesh` 会调用 `torch.cuda.set_device(LOCAL_RANK)`（`torch/distributed/device_mesh.py`
# 中的 `_setup_world_group_and_device`）：在只有一块 GPU 的机器上，rank 1 会报
# “invalid device ordinal”，而且这里的张量都在 CPU 上，本来也对不上 CUDA 网格。

# %%
def fsdp_check(rank, steps=3):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))  # CPU ranks: a CPU mesh, whatever GPUs exist
    result = []
    for opt_name in ("SGD", "AdamW"):
        make_opt = (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)) if opt_name == "SGD" else (
            lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1))
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.Tanh(), nn.Linear(3, 2))
        single, theirs = copy.deepcopy(net), copy.deepcopy(net)
        ours = FullyShardedDP(net)
        for layer in theirs:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(theirs, mesh=mesh)
        opts = [make_opt(m.parameters()) for m in (ours, theirs, single)]
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x, y = torch.randn(world * 4, 5, generator=gen), torch.randn(world * 4, 2, generator=gen)
            part = slice(rank * 4, (rank + 1) * 4)
            for m, o in zip((ours, theirs, single), opts):
                o.zero_grad()
                xs, ys = (x, y) if m is single else (x[part], y[part])
                nn.functional.mse_loss(m(xs), ys).backward()
                o.step()
        full = ours.full_state_dict()
        vs_single = max((full[k] - v).abs().max().item() for k, v in single.state_dict().items())
        vs_torch = max((full[n] - p.full_tensor()).abs().max().item() for n, p in theirs.named_parameters())
        shards = [p.numel() for p in ours.parameters()]
        result.append(f"{opt_name}: vs one process {vs_single:.1e}, vs fully_shard {vs_torch:.1e}, shards {shards}")
    return result


for world in (2, 3):
    print(f"{world} ranks:", *dl.spawn(fsdp_check, nprocs=world, backend="gloo")[0], sep="\n  ")

# %% [markdown] lang="en"
# Equal up to float32 rounding. Now one step's **timeline** on 2 ranks with a wider model:
# green all-gathers, blue compute, orange reduce-scatters (the end of an orange bar is
# when the rank *noticed* it had finished: gloo's reduce-scatter has no completion
# callback, `Work::getFuture not implemented`, so the wrapper polls). The backward gathers
# run in reverse order and each unit's reduce-scatter runs while earlier units compute.

# %% [markdown] lang="zh"
# 两者在 float32 舍入误差以内相等。下面在 2 个 rank 上用一个更宽的模型画出一步的**时间线**：
# 绿色是全收集，蓝色是计算，橙色是归约散发（橙色条的终点是 rank **发现**它已完成的时刻：gloo
# 的归约散发没有完成回调，会报 `Work::getFuture not implemented`，所以包装器用轮询）。反向
# 阶段的全收集按相反的顺序进行，每个单元的归约散发与前面单元的计算同时进行。

# %%
def fsdp_timeline(rank):
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)])
    model = FullyShardedDP(net, record_timeline=True)
    x = torch.randn(64, 512)
    for _ in range(2):
        model(x).pow(2).mean().backward()
    return model.timeline[-1], model.peak_gathered_bytes


step, peak = dl.spawn(fsdp_timeline, nprocs=2, backend="gloo")[0]
print(f"peak of gathered parameters: {peak / 2**20:.2f} MiB (one 512x512 unit: {(512 * 512 + 512) * 4 / 2**20:.2f} MiB)")
plot_fsdp_timeline(step);

# %% [markdown] lang="en" tags=["lesson"]
# The same step seen by the profiler instead of the wrapper's own record: the run traced
# (`trace=`, as in chapters 05 and 07) and drawn with `dl.timeline`. It counts the calls by
# the name Gloo's own work records, and there is a surprise: no reduce-scatter. On Gloo,
# `reduce_scatter_tensor` all-reduces the whole input into a buffer and then copies this
# rank's chunk out of it when the work is waited for (`ProcessGroupGloo::
# reduce_scatter_tensor_coalesced` in `torch/csrc/distributed/c10d/ProcessGroupGloo.cpp`,
# a `LambdaWork`, which only implements `wait`: hence no future). An all-reduce needs at
# least twice the bytes of a reduce-scatter (2(N-1)/N of the tensor per rank against
# (N-1)/N, chapter 04), so FSDP's gradients cost Gloo about twice what NCCL's real
# reduce-scatter sends. The broadcasts are the wrapper's start (rank 0's weights to every rank).

# %% [markdown] lang="zh" tags=["lesson"]
# 下面换一个角度看同一步：不用包装器自己的记录，而用性能分析器。把这次运行加上追踪（`trace=`，
# 与第 05、07 章相同），再用 `dl.timeline` 画出来。按 Gloo 自己记录的操作名统计调用次数，会看到
# 一个意外：没有归约散发。在 Gloo 上，`reduce_scatter_tensor` 先把整个输入全归约到一个缓冲区，
# 等到调用这个 `Work` 的 `wait()` 时，再从中复制出本 rank 的那一块（见
# `torch/csrc/distributed/c10d/ProcessGroupGloo.cpp` 中的
# `ProcessGroupGloo::reduce_scatter_tensor_coalesced`，它返回一个只实现了 `wait` 的
# `LambdaWork`，所以没有 future）。全归约至少要传输归约散发两倍的字节数（每个 rank 传张量的
# 2(N-1)/N，而归约散发只需 (N-1)/N，见第 04 章），因此在 Gloo 上，FSDP 的梯度归约大约要传输
# NCCL 真正的归约散发的两倍。其中的广播来自包装器的初始化（把 rank 0 的权重发给每个 rank）。

# %% tags=["lesson"]
from collections import Counter  # noqa: E402

from ddp_lab.tools import trace_analysis  # noqa: E402

fsdp_trace = str(dl.scratch("ch10") / "fsdp.json")
dl.spawn(fsdp_timeline, nprocs=2, backend="gloo", trace=fsdp_trace)
runs = trace_analysis.load(fsdp_trace)
print("rank 0, Gloo's calls by kind:", dict(Counter(c.kind for c in runs[0].calls)))
dl.timeline(fsdp_trace);

# %% [markdown] lang="en"
# `compute_dtype=torch.bfloat16` casts each shard before the all-gather (so the gather
# already moves 2 bytes per element), computes in bf16 and reduce-scatters in bf16, while
# the shards the optimizer steps stay float32 (master weights), like FSDP2's
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)`:

# %% [markdown] lang="zh"
# `compute_dtype=torch.bfloat16` 会在全收集之前转换每个分片（所以全收集时每个元素只传 2 个
# 字节），用 bf16 计算，并用 bf16 做归约散发，而优化器更新的分片仍然是 float32（主权重，
# master weights），相当于 FSDP2 的
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)`：

# %%
def fsdp_bf16(rank):
    torch.manual_seed(0)
    model = FullyShardedDP(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)), compute_dtype=torch.bfloat16)
    with count_collectives() as log:
        out = model(torch.randn(3, 6))
        out.float().pow(2).mean().backward()
    calls = [f"{name} {str(dtype).replace('torch.', '')}" for name, dtype, _ in log.calls]
    return calls, str(out.dtype), [str(p.grad.dtype) for p in model.parameters()]


calls, out_dtype, grad_dtypes = dl.spawn(fsdp_bf16, nprocs=2, backend="gloo")[0]
print(*calls, sep="\n")
print("output:", out_dtype, "| shard gradients:", grad_dtypes)

# %% [markdown] lang="en"
# What this teaching version leaves out (its docstring lists it): no prefetching of the
# next unit's all-gather (torch overlaps it with compute), no nesting of units, no
# parameters shared across units, all parameters trainable, no activation checkpointing
# inside a unit; a unit called twice before a backward keeps two gathered copies until
# backward reaches them, and reduce-scatters twice.

# %% [markdown] lang="zh"
# 这个教学版省略了什么（它的文档字符串里列出了）：不预取下一个单元的全收集（torch 会让它与
# 计算重叠），单元不能嵌套，参数不能跨单元共享，所有参数必须可训练，单元内部不能做激活
# 检查点；一个单元在一次反向之前被调用两次，就会保留两份全收集的副本直到反向阶段用到它们，
# 并做两次归约散发。

# %% [markdown] lang="en"
# ### What torch's FSDP adds
#
# **FSDP2 and FSDP1.** torch has two implementations, `FullyShardedDataParallel`
# (`torch/distributed/fsdp/fully_sharded_data_parallel.py`) and `fully_shard`
# (`torch/distributed/fsdp/_fully_shard/_fully_shard.py`). The main differences:
#
# | | FSDP1: `FullyShardedDataParallel` | FSDP2: `fully_shard` |
# | --- | --- | --- |
# | how a unit is sharded | its parameters flattened and concatenated into one `FlatParameter`, cut into N pieces (as `FullyShardedDP` here) | every parameter cut on dim 0, a `DTensor` with placement `Shard(0)` |
# | frozen and trainable parameters in one unit | restricted | allowed |
# | sharded state dict | needs all-gathers | each rank saves its own pieces, no communication |
# | the model | wrapped in a new module | the same modules, changed in place |
# | communication | one all-gather per unit | still one all-gather per unit (parameters copied into one buffer) |
#
# `fully_shard(module)` takes every parameter of `module` that no inner `fully_shard` has
# taken yet, so apply it bottom-up: the layers first, the root last, as the cells of this
# chapter do.
#
# **`reshard_after_forward`.** `True` (the default for every unit but the root) frees a
# unit's gathered parameters after its forward and gathers them again in backward, as
# `FullyShardedDP` does; `False` keeps them until backward (one all-gather less, and
# ZeRO-2's memory); an `int` reshards onto a smaller group, for example the GPUs of one
# node, so that the backward all-gather stays inside the node. The cell shows what each
# `nn.Linear`'s `weight` is after forward and after backward:

# %% [markdown] lang="zh"
# ### torch 的 FSDP 还做了什么
#
# **FSDP2 与 FSDP1**。torch 有两种实现：`FullyShardedDataParallel`
# （`torch/distributed/fsdp/fully_sharded_data_parallel.py`）和 `fully_shard`
# （`torch/distributed/fsdp/_fully_shard/_fully_shard.py`）。主要区别如下：
#
# | | FSDP1：`FullyShardedDataParallel` | FSDP2：`fully_shard` |
# | --- | --- | --- |
# | 单元怎样分片 | 把参数展平、拼接成一个 `FlatParameter`，再切成 N 份（与这里的 `FullyShardedDP` 相同） | 每个参数沿第 0 维切开，成为放置方式为 `Shard(0)` 的 `DTensor` |
# | 同一单元里混合冻结参数和可训练参数 | 受限制 | 可以 |
# | 分片状态字典 | 需要全收集 | 每个 rank 保存自己的那几片，不需要通信 |
# | 模型 | 被包进一个新模块 | 还是原来的模块，原地修改 |
# | 通信 | 每个单元一次全收集 | 仍然是每个单元一次全收集（参数先复制进一块缓冲区） |
#
# `fully_shard(module)` 会拿走 `module` 中所有还没有被内层 `fully_shard` 拿走的参数，所以要自底
# 向上地调用：先包各层，最后包根模块，本章的代码也是这样写的。
#
# **`reshard_after_forward`**。取 `True`（除根模块外每个单元的默认值）时，单元前向之后就释放全
# 收集来的参数，反向时再全收集一次，与 `FullyShardedDP` 一样；取 `False` 时，参数一直保留到反向
# （少一次全收集，内存与 ZeRO-2 相同）；取一个整数时，前向之后重新分片到一个更小的组上，比如一
# 个节点内的 GPU，这样反向时的全收集就留在节点内部。下面的代码单元显示每个 `nn.Linear` 的
# `weight` 在前向之后和反向之后分别是什么：

# %%
def small_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))


def shard_bottom_up(net, **kwargs):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    kwargs.setdefault("mesh", init_device_mesh("cpu", (dist.get_world_size(),)))  # see above
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    return fully_shard(net, **kwargs)


def after_forward(rank):
    rows = []
    for flag in (True, False):
        net = shard_bottom_up(small_mlp(), reshard_after_forward=flag)
        loss = net(torch.randn(4, 8)).sum()
        fwd = {type(m.weight).__name__ for m in net if isinstance(m, nn.Linear)}
        loss.backward()
        bwd = {type(m.weight).__name__ for m in net if isinstance(m, nn.Linear)}
        rows.append(f"reshard_after_forward={flag!s:5}: after forward {fwd}, after backward {bwd}")
    return rows


print(*dl.spawn(after_forward, nprocs=2, backend="gloo")[0], sep="\n")

# %% [markdown] lang="en"
# `DTensor`: sharded; `Parameter`: the gathered, unsharded tensor.
#
# **Prefetching.** torch issues the all-gather of the next unit before the current one has finished computing:
# in forward, the gathers run on their own CUDA stream ahead of the compute;
# in backward, it prefetches the unit that comes next in the reverse of the forward order.
# `set_modules_to_forward_prefetch` and `set_modules_to_backward_prefetch` set the order
# by hand. So at the peak a GPU holds **two** gathered units (the one computing and the
# one arriving) plus the unsharded gradient of one unit, not the one unit of this
# teaching version. (Streams need a GPU; not run here.)
#
# **Gradient clipping when the gradients are sharded.** `clip_grad_norm_` needs the norm of
# the whole gradient, the square root of the sum of squares over **every** shard. A rank
# that computes it from its own shards gets a different, smaller number on every rank, and
# the ranks clip by different factors. With `fully_shard` each `param.grad` is a `DTensor`,
# and `torch.nn.utils.clip_grad_norm_` computes the norm on `DTensor`s, which all-reduces
# the sum of squares. That holds while every gradient lives on one mesh: `get_total_norm`
# (`torch/nn/utils/clip_grad.py`) stacks the per-tensor norms into one tensor, and
# `DTensor`s on different meshes (HSDP combined with tensor parallelism, or modules sharded
# on different meshes) cannot be stacked; such setups compute the norm per mesh and combine
# the totals by hand. The cell compares it with one process on the full batch, with the
# same sum done by hand (one `all_reduce`), and with the naive per-rank norm:

# %% [markdown] lang="zh"
# `DTensor` 说明参数处于分片状态；`Parameter` 是全收集之后、未分片的张量。
#
# **预取**（prefetching）。torch 会在当前单元算完之前就发出下一个单元的全收集：前向时，全收
# 集在单独的 CUDA 流上提前进行；反向时，它按前向顺序的逆序预取下一个单
# 元。`set_modules_to_forward_prefetch` 和 `set_modules_to_backward_prefetch` 可以手动指定顺
# 序。所以峰值时一块 GPU 上有**两个**全收集好的单元（正在计算的那个，和正在传过来的那个），再加
# 一个单元未分片的梯度，而这个教学版只有一个单元。（CUDA 流需要 GPU，这里不运行。）
#
# **梯度分片时的梯度裁剪**。`clip_grad_norm_` 做梯度裁剪（gradient clipping）时需要整个梯度的范
# 数，也就是**所有**分片上平方和的平方根。如果每个 rank 只用自己的分片来算，每个 rank 得到的数
# 都不一样，而且都偏小，各 rank 的裁剪系数也就各不相同。使用 `fully_shard` 时每个 `param.grad`
# 都是 `DTensor`，`torch.nn.utils.clip_grad_norm_` 在 `DTensor` 上计算范数，会对平方和做全归
# 约。前提是所有梯度都在同一个设备网格（device mesh）上：`get_total_norm`
# （`torch/nn/utils/clip_grad.py`）把各个张量的范数堆叠成一个张量，而不同网格上的 `DTensor`
# 无法堆叠（比如 HSDP 再加上张量并行，或者不同模块分片在不同的网格上）。这种情况下要按网格分别
# 算范数，再手动合并。下面的代码单元把它与三个结果比较：单进程在整个批上算出的范数，手动求和（一次
# `all_reduce`）得到的范数，以及每个 rank 只用自己的分片算出的朴素范数：

# %%
def sharded_clipping(rank):
    world = dist.get_world_size()
    ref = small_mlp()
    net = shard_bottom_up(small_mlp())
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(world * 4, 8, generator=gen), torch.randn(world * 4, 2, generator=gen)
    nn.functional.mse_loss(net(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4]).backward()
    nn.functional.mse_loss(ref(x), y).backward()
    one_process = nn.utils.get_total_norm([p.grad for p in ref.parameters()])
    local = [p.grad.to_local() for p in net.parameters()]  # this rank's shards
    naive = nn.utils.get_total_norm(local)
    squares = sum(g.pow(2).sum() for g in local)
    dist.all_reduce(squares)  # the sum of squares over every shard
    torch_norm = nn.utils.clip_grad_norm_(net.parameters(), max_norm=0.1).full_tensor()
    return (f"rank {rank}: one process {one_process:.4f} | clip_grad_norm_ {torch_norm:.4f} | "
            f"by hand {squares.sqrt():.4f} | naive, this rank's shards only {naive:.4f}")


print(*dl.spawn(sharded_clipping, nprocs=2, backend="gloo"), sep="\n")

# %% [markdown] lang="en"
# The same holds for this chapter's `FullyShardedDP` and for ZeRO-2: all-reduce the sum of
# squares of the local shards, then scale every shard by the same factor. (FSDP1 has its own
# method, `FullyShardedDataParallel.clip_grad_norm_`.)
#
# **HSDP (hybrid sharding): shard inside a node, replicate across nodes.** All-gathers over
# the slow network between nodes cost more than over NVLink inside one. `fully_shard(module,
# mesh=mesh)` with a 2-D `DeviceMesh` of shape (nodes, GPUs per node) shards each parameter
# over the second dimension and keeps a replica per node over the first: the placements are
# `(Replicate(), Shard(0))`, the reduce-scatter runs inside a node and an all-reduce across.
# Four gloo ranks stand for 2 nodes × 2 GPUs:

# %% [markdown] lang="zh"
# 本章的 `FullyShardedDP` 和 ZeRO-2 也是如此：先对各 rank 本地分片的平方和做全归约，再让每个分
# 片都按同一个系数缩放。（FSDP1 有自己的方法 `FullyShardedDataParallel.clip_grad_norm_`。）
#
# **HSDP（hybrid sharding，混合分片）：节点内分片，节点间复制**。在节点之间较慢的网络上做全收
# 集，比在节点内的 NVLink 上代价更高。`fully_shard(module, mesh=mesh)` 配合一个形状为（节点数，
# 每节点 GPU 数）的二维 `DeviceMesh`，在第二维上把每个参数分片，在第一维上每个节点保留一个副
# 本：放置方式是 `(Replicate(), Shard(0))`，归约散发在节点内进行，节点之间则做全归约。下面用 4
# 个 gloo rank 代表 2 个节点 × 2 块 GPU：

# %%
def hsdp(rank):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    ref, net = small_mlp(), shard_bottom_up(small_mlp(), mesh=mesh)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, ref)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 2, generator=gen)
        for m, opt in zip((net, ref), opts):
            opt.zero_grad()
            xs, ys = (x, y) if m is ref else (x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4])
            nn.functional.mse_loss(m(xs), ys).backward()
            opt.step()
    w = net[0].weight
    diff = max((p.full_tensor() - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))
    return (f"rank {rank}: mesh position {mesh.get_coordinate()}, {w.placements}, "
            f"holds {tuple(w.to_local().shape)} of {tuple(w.shape)}; vs one process {diff:.1e}")


print(*dl.spawn(hsdp, nprocs=4, backend="gloo"), sep="\n")

# %% [markdown] lang="en"
# Ranks 0 and 1 form one "node" and hold the two halves of each weight; ranks 2 and 3 hold
# the same two halves again. Training still equals one process on the full batch.

# %% [markdown] lang="zh"
# rank 0 和 1 组成一个“节点”，分别持有每个权重的一半；rank 2 和 3 又持有同样的两半。训练结果仍
# 与单进程在整个批上训练的结果一致。

# %% [markdown] lang="en"
# **Mixed precision and offload in `fully_shard`.** `MixedPrecisionPolicy`
# (`torch/distributed/fsdp/_fully_shard/_fsdp_api.py`) has four fields. `param_dtype` is the
# dtype a unit is all-gathered and computed in. `reduce_dtype` is the dtype of the gradient
# reduce-scatter (and of the all-reduce across replicas under HSDP); unset, it follows
# `param_dtype`. bf16 halves those bytes, but every partial sum is rounded to bf16's 7-bit
# mantissa, an error that grows with N; `reduce_dtype=torch.float32` with bf16 compute is the usual
# choice for stability. `output_dtype` casts the unit's floating-point outputs: on the root,
# it hands the loss float32 logits. `cast_forward_inputs` (default True) casts a unit's
# floating-point inputs to `param_dtype` before its forward. The sharded parameters and
# their gradients keep their own dtype, float32 here, and the optimizer steps those: FSDP
# needs no separate master copy. `offload_policy=CPUOffloadPolicy()` keeps the shards, their
# gradients and the optimizer state in (pinned) CPU memory, copies each shard to the GPU
# before its all-gather and runs the optimizer step on the CPU (its docstring, same file); it
# needs a GPU (without one, `fully_shard` fails with "Cannot access accelerator device when
# none is available"), so it is not run here.

# %% [markdown] lang="zh"
# **`fully_shard` 的混合精度与卸载（offload）**。`MixedPrecisionPolicy`
# （`torch/distributed/fsdp/_fully_shard/_fsdp_api.py`）有四个字段。`param_dtype` 是单元做全收
# 集和计算时的类型。`reduce_dtype` 是梯度归约散发（以及 HSDP 下副本之间那次全归约）的类型；不设
# 置时跟随 `param_dtype`。bf16 能把这部分字节数减半，但每个部分和都要舍入到 bf16 的 7 位尾
# 数，误差随 N 增大；计算用 bf16、`reduce_dtype=torch.float32` 是兼顾稳定性的常见选
# 择。`output_dtype` 转换单元的浮点输出：设在根模块上，交给损失函数的就是 float32 的输
# 出。`cast_forward_inputs`（默认 True）在单元的前向之前把浮点输入转换成 `param_dtype`。分片后
# 的参数及其梯度保持原来的类型（这里是 float32），优化器更新的就是它们，所以 FSDP 不需要另存一份
# 主权重。`offload_policy=CPUOffloadPolicy()` 把分片、分片的梯度和优化器状态都放在（页锁定的）
# CPU 内存里，全收集之前把分片拷到 GPU，优化器步骤在 CPU 上执行（见同一文件中它的文档字符串）。
# 它需要 GPU（没有 GPU 时 `fully_shard` 报错“Cannot access accelerator device when none is
# available”），这里不运行。

# %%
def fsdp2_mixed_precision(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  output_dtype=torch.float32)
    net = shard_bottom_up(small_mlp(), mesh=mesh, mp_policy=policy)
    seen = {}
    net[2].register_forward_hook(lambda m, inputs, out: seen.update(x=inputs[0].dtype, w=m.weight.dtype))
    out = net(torch.randn(4, 8))
    out.sum().backward()
    w = net[2].weight
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
    return (f"inside the second Linear: input {name[seen['x']]}, weight {name[seen['w']]} | "
            f"model output {name[out.dtype]} | stored shard {name[w.to_local().dtype]}, "
            f"its gradient {name[w.grad.to_local().dtype]}")


print(dl.spawn(fsdp2_mixed_precision, nprocs=2, backend="gloo")[0])

# %% [markdown] lang="en"
# **`torch.compile` with DDP.** Compiling a whole model into one graph would break DDP's
# overlap: the compiled backward runs as one autograd function, so every gradient becomes
# ready at its end and every bucket's all-reduce waits for all of backward. So when dynamo
# compiles a module inside an active DDP forward, it hands the graph to `DDPOptimizer`
# (`torch/_dynamo/backends/distributed.py`, called from `convert_frame.py`), which walks the
# graph in reverse, counts parameter bytes up to DDP's `bucket_cap_mb`, and splits the graph
# there; each piece is compiled on its own, so each bucket's gradients are ready when its
# piece's backward ends (`torch._dynamo.config.optimize_ddp`, on by default). The cell hands
# `DDPOptimizer` a backend that only records what it is given, for four 512×512 layers
# (1 MiB each) and a 2 MiB cap, in one process: it is the object dynamo builds for a
# DDP-wrapped module. With `fully_shard` there is no DDP module and so no `DDPOptimizer`: the
# collectives come from FSDP2's hooks around each unit, and compiling FSDP2 models is not run
# in this course.

# %% [markdown] lang="zh"
# **`torch.compile` 与 DDP**。把整个模型编译成一张图会破坏 DDP 的重叠：编译后的反向是一个整体
# 的 autograd 函数，所有梯度都在它结束时才就绪，每个桶的全归约都要等整个反向算完。所以当 dynamo
# 在 DDP 的前向中编译一个模块时，会把图交给 `DDPOptimizer`（`torch/_dynamo/backends/distributed.py`，
# 由 `convert_frame.py` 调用）：它逆序遍历这张图，按 DDP 的 `bucket_cap_mb` 累计参数字节数，到
# 上限就在那里把图切开；每一段单独编译，这样每一段的反向一结束，对应桶的梯度就已就绪
# （`torch._dynamo.config.optimize_ddp`，默认打开）。下面的单元给 `DDPOptimizer` 一个只记录收到
# 了什么的后端，模型是四个 512×512 的层（每层 1 MiB），上限 2 MiB，在一个进程里运行：这正是
# dynamo 为 DDP 包装的模块构造的那个对象。使用 `fully_shard` 时没有 DDP 模块，也就没有
# `DDPOptimizer`：集合通信来自 FSDP2 在每个单元前后的钩子；本课程不运行 FSDP2 模型的编译。

# %%
from torch._dynamo.backends.distributed import DDPOptimizer


def record_pieces(gm, example_inputs):
    pieces.append(sum("linear" in str(n.target) for n in gm.graph.nodes))
    return gm.forward  # run the piece as it is: only the split is of interest


pieces = []
four = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
cap = 2 * 2**20
splitter = DDPOptimizer(bucket_bytes_cap=cap, backend_compile_fn=record_pieces, first_bucket_cap=cap)
torch.compile(four, backend=splitter.compile_fn)(torch.randn(2, 512)).sum().backward()
print(len(pieces), "pieces, compiled one by one, with", pieces, "linear ops")
for bucket in splitter.buckets:
    names = [n.removeprefix("L_fn_modules_").replace("_parameters_", ".").rstrip("_") for n in bucket.params]
    print(f"bucket of {bucket.size / 2**20:.2f} MiB:", ", ".join(names))

# %% [markdown] lang="en"
# ## 6. When to use which
#
# From the measurements above (per rank, Psi parameters, N ranks; communication per step
# in bytes handed to collectives, as in the ZeRO paper, section 7, where an all-reduce
# counts 2 Psi):

# %% [markdown] lang="zh"
# ## 6. 什么时候用哪一个
#
# 根据上面的测量（每个 rank，Psi 个参数，N 个 rank；每步的通信量按交给集合通信的字节数计，
# 与 ZeRO 论文第 7 节一样，一次全归约计为 2 Psi）：

# %% [markdown] lang="en"
# | method | memory per rank (fp32 AdamW) | communication per step | use it when | PyTorch |
# | --- | --- | --- | --- | --- |
# | DDP | 16 Psi with `gradient_as_bucket_view=True` (20 Psi without: gradients and buckets) | all-reduce of gradients (2 Psi) | the model and its optimizer fit on one device | [`DistributedDataParallel`](https://pytorch.org/docs/stable/notes/ddp.html) |
# | + comm hook | as DDP; PowerSGD's error feedback adds 4 Psi (an fp32 copy of every bucket) | 1/2 (fp16/bf16) or much less (PowerSGD) | the network is the bottleneck | [DDP Communication Hooks](https://pytorch.org/docs/stable/ddp_comm_hooks.html) |
# | ZeRO-1 (paper, DeepSpeed) | 8 Psi + 8 Psi / N | reduce-scatter of gradients + all-gather of parameters (2 Psi, as DDP) | optimizer state is what does not fit | DeepSpeed `zero_optimization.stage=1` |
# | torch `ZeroRedundancyOptimizer` + DDP | 8 Psi + 8 Psi / N, uneven (whole parameters per rank) | DDP's all-reduce + a broadcast of the parameters (3 Psi) | the same, in plain PyTorch | [`ZeroRedundancyOptimizer`](https://pytorch.org/docs/stable/distributed.optim.html) |
# | ZeRO-2 | 4 Psi + 12 Psi / N at the peak (FSDP2 reshards the parameters after backward) | reduce-scatter + all-gather (2 Psi) | gradients do not fit either | `fully_shard(..., reshard_after_forward=False)`; FSDP1's `SHARD_GRAD_OP` |
# | FSDP (ZeRO-3) | 16 Psi / N + gathered units (one here; two in torch, which prefetches) + a unit's gradient | all-gather twice + reduce-scatter (3 Psi) | the parameters do not fit | [`fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) |
# | tensor / pipeline parallel | splits the layers themselves | activations between devices, every layer / stage | one layer or the activations do not fit, or N is very large | [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html), [Pipelining](https://pytorch.org/docs/stable/distributed.pipelining.html) |
#
# The paper's ZeRO-1 replaces DDP's all-reduce by its two halves, a reduce-scatter of the
# gradients and, after each rank steps its shard, an all-gather of the parameters: the
# same 2 Psi as DDP. torch's `ZeroRedundancyOptimizer` sits on top of DDP, which has
# already all-reduced the whole gradient, and then broadcasts every parameter from its
# owner (`ShardedOptimizer.step` above does the same): 3 Psi, 1.5 times DDP. DeepSpeed
# also splits one flat buffer evenly over the ranks, where torch assigns whole parameters,
# which is the imbalance the memory table showed.

# %% [markdown] lang="zh"
# | 方法 | 每个 rank 的内存（fp32 AdamW） | 每步的通信 | 适用场景 | PyTorch |
# | --- | --- | --- | --- | --- |
# | DDP | `gradient_as_bucket_view=True` 时 16 Psi（不开时 20 Psi：梯度加桶） | 梯度全归约（2 Psi） | 模型和优化器能放进一个设备 | [`DistributedDataParallel`](https://pytorch.org/docs/stable/notes/ddp.html) |
# | + 通信钩子 | 同 DDP；PowerSGD 的误差反馈再加 4 Psi（每个桶一份 fp32 副本） | 1/2（fp16/bf16）或少得多（PowerSGD） | 网络是瓶颈 | [DDP Communication Hooks](https://pytorch.org/docs/stable/ddp_comm_hooks.html) |
# | ZeRO-1（论文、DeepSpeed） | 8 Psi + 8 Psi / N | 梯度归约散发 + 参数全收集（2 Psi，与 DDP 相同） | 放不下的是优化器状态 | DeepSpeed `zero_optimization.stage=1` |
# | torch `ZeroRedundancyOptimizer` + DDP | 8 Psi + 8 Psi / N，不均匀（每个 rank 分到整个参数） | DDP 的全归约 + 参数广播（3 Psi） | 同上，只用 PyTorch | [`ZeroRedundancyOptimizer`](https://pytorch.org/docs/stable/distributed.optim.html) |
# | ZeRO-2 | 峰值 4 Psi + 12 Psi / N（FSDP2 在反向之后把参数重新分片） | 归约散发 + 全收集（2 Psi） | 梯度也放不下 | `fully_shard(..., reshard_after_forward=False)`；FSDP1 的 `SHARD_GRAD_OP` |
# | FSDP（ZeRO-3） | 16 Psi / N + 已全收集的单元（这里一个；torch 会预取，是两个）+ 一个单元的梯度 | 两次全收集 + 一次归约散发（3 Psi） | 参数也放不下 | [`fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) |
# | 张量并行 / 流水线并行 | 把层本身切开 | 设备之间传递激活，每层 / 每段一次 | 单个层或激活都放不下，或 N 非常大 | [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html)、[Pipelining](https://pytorch.org/docs/stable/distributed.pipelining.html) |
#
# 论文中的 ZeRO-1 把 DDP 的全归约拆成两半：先对梯度做归约散发，各 rank 更新完自己的分片后，
# 再对参数做全收集，总量与 DDP 一样是 2 Psi。torch 的 `ZeroRedundancyOptimizer` 则叠在 DDP
# 之上：DDP 已经对完整的梯度做了全归约，它再从所属 rank 广播每个参数（上面的
# `ShardedOptimizer.step` 也是这样）：3 Psi，是 DDP 的 1.5 倍。此外，DeepSpeed 把一块展平的
# 缓冲区平均分给各 rank，而 torch 按整个参数分配，这就是内存表里看到的不均衡。

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: ZeRO-1, shard assignment and step (4 points)
#
# Write `MySharded(params, optimizer_class, **defaults)` for one parameter group:
# - `__init__`: list the parameters; give each one an owner rank, the largest first, each
#   to the rank that owns the fewest elements so far; build
#   `optimizer_class(<this rank's parameters>, **defaults)` (or none if it owns none);
# - `zero_grad()`: clear the gradients of *all* parameters;
# - `step()`: step the local optimizer, then broadcast every parameter from its owner, in
#   the same order on every rank.
#
# The graded cell passes its own AdamW (with weight decay) that records each rank's
# parameters, trains hidden models with tied and frozen weights on 2 and 3 ranks, each rank
# on its own part of the batch with its own learning rate in `defaults`, and compares with
# AdamW on the full batch that steps each parameter at its owner's learning rate; when
# graded, it also counts from outside the ranks the bytes each rank receives at each step,
# which must be at least about the parameters it does not own. It fails a ZeRO that
# steps every parameter on every rank, one that forgets to share the updated parameters,
# and one whose ranks' loads (elements owned) differ from those of the rule above; how you
# break ties between equal sizes or equal loads does not matter.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：ZeRO-1 的分片分配与优化器步骤（4 分）
#
# 为单个参数组编写 `MySharded(params, optimizer_class, **defaults)`：
# - `__init__`：把参数列成列表；为每个参数指定一个所属 rank，先分配最大的参数，每次分给当前
#   拥有元素最少的 rank；构建 `optimizer_class(<本 rank 的参数>, **defaults)`（如果本 rank
#   一个参数也没有，就不构建）；
# - `zero_grad()`：清除**所有**参数的梯度；
# - `step()`：先让本地优化器执行一步更新，然后从所属 rank 广播每个参数，每个 rank 广播的顺
#   序相同。
#
# 评分单元传入的是它自己的 AdamW（带权重衰减），这个 AdamW 会记录每个 rank 拿到了哪些参数。
# 评分单元在 2 个和 3 个 rank 上训练带共享（绑定）权重和冻结权重的隐藏模型，每个 rank 只用自
# 己那部分批数据，各 rank 在 `defaults` 里拿到的学习率也各不相同；然后与在全批上运行、每个参
# 数按其所属 rank 的学习率更新的 AdamW 比较。正式评分时，它还会在各 rank 之外统计每个 rank
# 每一步收到的字节数，这个数至少要大致等于该 rank 不拥有的那些参数的大小。在每个 rank 上更新
# 所有参数、忘记共享更新后的参数，或者各 rank 的负载（拥有的元素数）与上述规则给出的不同，都
# 会判为失败；大小相同或负载相同时怎样取舍都可以。

# %% tags=["exercise"]
class MySharded:
    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        ### BEGIN SOLUTION
        self.rank, world = dist.get_rank(), dist.get_world_size()
        loads, self.owner = [0] * world, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            r = loads.index(min(loads))
            self.owner[i], loads[r] = r, loads[r] + self.params[i].numel()
        mine = [p for p, o in zip(self.params, self.owner) if o == self.rank]
        self.optim = optimizer_class(mine, **defaults) if mine else None
        ### END SOLUTION

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        ### BEGIN SOLUTION
        if self.optim is not None:
            self.optim.step()
        for p, owner in zip(self.params, self.owner):
            dist.broadcast(p, src=owner)
        ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 2
torch.manual_seed(0)
net = nn.Linear(4, 3)
x = torch.randn(2, 4)
opt = MySharded(net.parameters(), torch.optim.AdamW, lr=0.1)
net(x + rank).sum().backward()  # rank r's data: x + r; no gradient all-reduce here
opt.step()
# The owner (weight, 12 elements: rank 0; bias, 3: rank 1) steps its parameter with its own
# gradient, as plain AdamW in one process would; every other rank gets it from the owner.
want = {}
for name, owner in (("weight", 0), ("bias", 1)):
    torch.manual_seed(0)
    ref = nn.Linear(4, 3)
    ref(x + owner).sum().backward()
    torch.optim.AdamW(ref.parameters(), lr=0.1).step()
    want[name] = getattr(ref, name).detach()
print("weight:", dl.compare(net.weight.detach(), want["weight"]),
      "| bias:", net.bias.tolist(), dl.compare(net.bias.detach(), want["bias"]))

# %% tags=["grade"] grade_id="10.sharded_optimizer" points=4
dl.grade("10.sharded_optimizer", MySharded)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: a bf16 compression hook (3 points)
#
# Write `my_bf16_hook(process_group, bucket)` for `register_comm_hook`, as torch's
# `bf16_compress_hook` does it: take `bucket.buffer()`, cast it to `torch.bfloat16` and
# divide by the world size, start `dist.all_reduce(..., async_op=True)`, and return its
# future chained (`.then`) with a function that copies the result back into the buffer and
# returns the buffer. (`process_group` is None here: use the default group.)
#
# The graded cell compares the gradients with those under torch's hook, bit for bit, and
# checks that only bfloat16 crosses the wire, 2 bytes per gradient element.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：bf16 压缩钩子（3 分）
#
# 按 torch 的 `bf16_compress_hook` 的做法，为 `register_comm_hook` 编写
# `my_bf16_hook(process_group, bucket)`：取出 `bucket.buffer()`，转换为 `torch.bfloat16` 并
# 除以 world size，启动 `dist.all_reduce(..., async_op=True)`；用 `.then` 给它的 `Future` 接上
# 一个函数（把结果复制回缓冲区，并返回缓冲区），返回的是接上之后得到的 `Future`。（这里 `process_group` 是 None：使用默认进程组。）
#
# 评分单元把梯度与使用 torch 钩子时的梯度逐位比较，并检查通信中只出现 bfloat16，每个梯度
# 元素 2 字节。

# %% tags=["exercise"]
def my_bf16_hook(process_group, bucket):
    ### BEGIN SOLUTION
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(f):
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)
    ### END SOLUTION


# %% tags=["grade"] grade_id="10.bf16_hook" points=3
dl.grade("10.bf16_hook", my_bf16_hook)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 3: FSDP's gradient reduction (2 points)
#
# `FullyShardedDP(module, reduce_grad=f)` calls `f(flat_grad)` in each unit's backward
# with the unit's full flat gradient on this rank (its length a multiple of the world
# size). Return this rank's shard of the **average** over the ranks, a tensor of
# `len(flat_grad) // world_size` elements, with one reduce-scatter
# (`dist.reduce_scatter_single(output, input)`; torch older than 2.13 has it only under its
# old name, `dist.reduce_scatter_tensor`, and `ddp-lab doctor` says so). The graded cell trains with your function
# against single-process training, and fails an all-reduce or an all-gather followed by a
# local sum: each rank keeps only its shard, so receiving the whole gradient (or every
# rank's) wastes bandwidth. When graded, it also calls your function alone on large
# gradients on 3 ranks that refuse all_reduce, all_gather and broadcast (in any thread),
# and counts from outside the ranks the bytes each one receives.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 3：FSDP 的梯度归约（2 分）
#
# `FullyShardedDP(module, reduce_grad=f)` 会在每个单元的反向中调用 `f(flat_grad)`，参数是该
# 单元在本 rank 上完整的展平梯度（长度是 world size 的倍数）。请返回各 rank **平均值**中属于
# 本 rank 的分片，即一个含 `len(flat_grad) // world_size` 个元素的张量，只用一次归约散发
# （`dist.reduce_scatter_single(output, input)`；早于 2.13 的 torch 只有它的旧名字
# `dist.reduce_scatter_tensor`，`ddp-lab doctor` 会指出这一点）。评分单元用你的函数训练并与单进程训练比较；
# 使用全归约，或者先全收集再在本地求和，都会失败：每个 rank 只保留自己的分片，接收完整的梯度
# （或所有 rank 的梯度）是在浪费带宽。正式评分时，它还会在 3 个 rank 上脱离训练、单独用较大的梯
# 度调用你的函数：这些 rank 拒绝 all_reduce、all_gather 和 broadcast（在任何线程里都一样），评分程序
# 在各 rank 之外统计每个 rank 收到的字节数。

# %% tags=["exercise"]
def reduce_grad(flat_grad):
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world, dtype=flat_grad.dtype)
    # torch before 2.13 (ddp-lab doctor): the same collective under its old name
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(out, flat_grad / world)
    return out
    ### END SOLUTION


# %% tags=["grade"] grade_id="10.fsdp_reduce" points=2
dl.grade("10.fsdp_reduce", reduce_grad)

# %% [markdown] lang="en"
# ## Summary
#
# - DDP's knobs, counted: `gradient_as_bucket_view=True` halves gradient memory; the first
#   iteration uses one bucket and the buckets are rebuilt after it (after the second with
#   `static_graph=True`, never with `find_unused_parameters=True`).
# - Comm hooks replace each bucket's all-reduce: fp16/bf16 halve the bytes, PowerSGD sends
#   far fewer at some cost in accuracy; you wrote the bf16 hook.
# - Autocast keeps float32 gradients, so DDP all-reduces in float32 unless a hook
#   compresses; fp16 needs a `GradScaler` and `unscale_` before clipping.
# - ZeRO-1 shards the optimizer state (`ShardedOptimizer`, equal to AdamW and to torch's
#   `ZeroRedundancyOptimizer`); FSDP shards parameters and gradients too (`FullyShardedDP`,
#   equal to one process and to `fully_shard`), at the cost of an all-gather before every use.

# %% [markdown] lang="zh"
# ## 小结
#
# - 实测 DDP 的开关：`gradient_as_bucket_view=True` 让梯度内存减半；第一次迭代只用一个桶，
#   之后重建桶（`static_graph=True` 时在第二次迭代之后，`find_unused_parameters=True` 时从不重建）。
# - 通信钩子替换每个桶的全归约：fp16/bf16 让字节数减半，PowerSGD 发送得少得多，但会损失一些
#   准确率；你亲手写了 bf16 钩子。
# - autocast 下梯度仍是 float32，所以除非用钩子压缩，DDP 以 float32 做全归约；fp16 需要
#   `GradScaler`，并且要在裁剪之前 `unscale_`。
# - ZeRO-1 把优化器状态分片（`ShardedOptimizer`，与 AdamW 和 torch 的
#   `ZeroRedundancyOptimizer` 结果相同）；FSDP 把参数和梯度也分片（`FullyShardedDP`，与单进程
#   和 `fully_shard` 结果相同），代价是每次使用参数之前都要做一次全收集。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`10.concepts`,
# 2 points when all are right).
#
# **1.** With mixed-precision Adam the ZeRO paper counts 2 + 2 + 12 = 16 bytes per parameter. For 1 billion parameters on 8 ranks, how many GB does each rank hold under ZeRO-1 (optimizer state sharded, activations ignored)? (a number)
#
# **2.** A bf16 compression comm hook is added to DDP training in float32. Per step, the bytes each rank sends for gradients become:
#
# - (a) the same
# - (b) half
# - (c) a quarter
# - (d) it depends on PowerSGD's rank
#
# **3.** fp16 and bf16 both use 16 bits. Why does bf16 training usually need no `GradScaler` while fp16 does?
#
# - (a) GradScaler does not support bf16
# - (b) bf16 runs only on CPUs
# - (c) bf16 has float32's exponent range, so small gradients do not underflow; it has fewer mantissa bits (7 against 10)
# - (d) bf16 has more mantissa bits
#
# **4.** Compared with ZeRO-1, what does FSDP (ZeRO-3) pay for sharding the parameters too?
#
# - (a) it cannot use Adam
# - (b) nothing
# - (c) a second optimizer
# - (d) an all-gather of each unit's parameters before its forward and again before its backward


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`10.concepts`，全部答对得 2 分）。
#
# **1.** 在混合精度 Adam 下，ZeRO 论文按每个参数 2 + 2 + 12 = 16 字节计算。10 亿个参数、8 个 rank，在 ZeRO-1（只把优化器状态分片，不计激活）下每个 rank 占多少 GB？（填一个数）
#
# **2.** 给 float32 的 DDP 训练加上 bf16 压缩通信钩子。每一步，每个 rank 为梯度发送的字节数变为：
#
# - (a) 不变
# - (b) 一半
# - (c) 四分之一
# - (d) 取决于 PowerSGD 的秩
#
# **3.** fp16 和 bf16 都是 16 位。为什么 bf16 训练通常不需要 `GradScaler`，而 fp16 需要？
#
# - (a) GradScaler 不支持 bf16
# - (b) bf16 只在 CPU 上运行
# - (c) bf16 的指数范围和 float32 相同，小梯度不会下溢；它的尾数位更少（7 对 10）
# - (d) bf16 的尾数位更多
#
# **4.** 和 ZeRO-1 相比，FSDP（ZeRO-3）把参数也分片之后要付出什么代价？
#
# - (a) 不能用 Adam
# - (b) 什么都不用付
# - (c) 第二个优化器
# - (d) 在每个单元前向之前和反向之前，各做一次参数的全收集（all-gather）


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 5.5,  # a number
    2: "b",  # a letter
    3: "c",  # a letter
    4: "d",  # a letter
    ### END ANSWERS
}
dl.quiz("10", my_answers)


# %% tags=["grade"] grade_id="10.concepts" points=2
dl.grade("10.concepts", my_answers)
