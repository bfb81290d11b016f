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
#       en: "12 Where data parallelism ends: tensor and pipeline parallelism"
#       zh: "12 数据并行的尽头：张量并行与流水线并行"
# ---

# %% [markdown] lang="en"
# # 12 Where data parallelism ends: tensor and pipeline parallelism
#
# FSDP (chapter 10) shards the model's state, but every rank still runs every layer on its
# whole micro-batch, and the global batch grows with the number of ranks. When a layer's
# activations do not fit, or the batch cannot grow, the model itself is cut: **tensor
# parallelism** (TP) splits each layer's matrices across ranks, **pipeline parallelism** (PP)
# puts consecutive layers on different ranks. You build both from scratch on gloo ranks and
# check them against one process, run PyTorch's twins (`parallelize_module` on a
# `DeviceMesh`, FSDP x TP on a 2D mesh), measure a pipeline's **bubble**, and do the
# arithmetic that decides which to use, up to 1,024 ranks with torch's fake process group.

# %% [markdown] lang="zh"
# # 12 数据并行的尽头：张量并行与流水线并行
#
# FSDP（第 10 章）把模型的状态分片了，但每个 rank（进程编号）仍要在自己完整的微批（micro-batch）上运行每一层，
# 而全局批大小随 rank 数一起增长。当一层的激活值放不下，或者批大小不能再增大时，就要把模型本身
# 切开：**张量并行**（tensor parallelism，TP）把每一层的矩阵分到多个 rank 上，**流水线并行**
# （pipeline parallelism，PP）把相邻的若干层放到不同的 rank 上。本章在 gloo rank 上从零实现这两
# 种并行，并与单进程对照；运行 PyTorch 中对应的实现（`DeviceMesh` 上的 `parallelize_module`，
# 二维网格上的 FSDP × TP）；实测流水线的**气泡**（bubble）；最后算一算该选哪种并行，并借助
# torch 的伪进程组（fake process group）一直算到 1024 个 rank。

# %%
import torch

import ddp_lab as dl

dl.setup()
print(torch.__version__)

# %% [markdown] lang="en" tags=["lesson"]
# ## 1. Tensor parallelism from scratch
#
# A linear layer `y = x W^T + b` can be split two ways. **Column-parallel**: rank r keeps a
# block of `W`'s rows, i.e. a slice of the output features, and computes that slice of `y`
# from the whole `x`. **Row-parallel**: rank r keeps a block of `W`'s columns, multiplies
# its slice of `x`, and the ranks' partial products are summed. An MLP's first layer
# column-parallel and its second row-parallel need nothing in between: the first layer's
# output slice is exactly the second's input slice (Megatron-LM's layout). Two operators
# carry the communication, and they are conjugate:
#
# - `f` = `copy_to_parallel_region`: identity forward; backward, an all-reduce (every rank
#   used the whole `x`, so its gradient is the sum of every rank's contribution);
# - `g` = `reduce_from_parallel_region`: all-reduce forward (the partial products);
#   identity backward.
#
# Megatron-LM writes them as `copy_to_tensor_model_parallel_region` and
# `reduce_from_tensor_model_parallel_region` in `megatron/core/tensor_parallel/mappings.py`;
# the course's shorter names are in `ddp_lab/tensor_parallel.py`:

# %% [markdown] lang="zh" tags=["lesson"]
# ## 1. 从零实现张量并行
#
# 线性层 `y = x W^T + b` 有两种切法。**列并行**（column-parallel）：rank r 保留 `W` 的一块行，
# 也就是输出特征的一段，用完整的 `x` 算出 `y` 的这一段。**行并行**（row-parallel）：rank r 保留
# `W` 的一块列，只乘 `x` 中对应的那一段，各 rank 的部分积再求和。MLP 的第一层用列并行、第二层
# 用行并行时，两层之间不需要任何通信：第一层输出的那一段恰好是第二层需要的输入段（Megatron-LM
# 的布局）。通信由两个算子负责，它们互为共轭（conjugate）：
#
# - `f` = `copy_to_parallel_region`：前向是恒等映射；反向做一次全归约（all-reduce），因为每个
#   rank 都用了完整的 `x`，`x` 的梯度是所有 rank 的贡献之和；
# - `g` = `reduce_from_parallel_region`：前向做一次全归约（把部分积加起来）；反向是恒等映射。
#
# Megatron-LM 在 `megatron/core/tensor_parallel/mappings.py` 中实现它们，名字是
# `copy_to_tensor_model_parallel_region` 和 `reduce_from_tensor_model_parallel_region`；本课程
# 用的是更短的名字，代码在 `ddp_lab/tensor_parallel.py`：

# %% tags=["lesson"]
from ddp_lab import tensor_parallel as tpmod

dl.show_source(tpmod._CopyToParallelRegion)

# %% tags=["lesson"]
dl.show_source(tpmod.RowParallelLinear.forward)

# %% [markdown] lang="en" tags=["lesson"]
# The MLP (8 -> 16 -> 8, float64) split over 2 and over 4 ranks, against the whole MLP in
# each rank's own process: the output, the input's gradient and each rank's slices of the
# weight gradients. Chapter 10's counter (`count_collectives`) lists what went through
# `torch.distributed`: one all-reduce forward (in `g`) and one backward (in `f`), each of
# the activation's size, batch 4 x width 8 x 8 bytes (float64) = 256 bytes, whatever the
# number of ranks.

# %% [markdown] lang="zh" tags=["lesson"]
# 把 MLP（8 -> 16 -> 8，float64）分到 2 个和 4 个 rank 上，在每个 rank 的进程内与完整的 MLP
# 对照：输出、输入的梯度，以及本 rank 那一段权重梯度。第 10 章的计数器（`count_collectives`）
# 列出经过 `torch.distributed` 的调用：前向一次全归约（在 `g` 中），反向一次（在 `f` 中），
# 大小都与激活值相同：批大小 4 × 宽度 8 × 8 字节（float64）= 256 字节，与 rank 数无关。

# %% tags=["lesson"]
for world in (2, 4):
    out = dl.spawn(tpmod.compare_with_one_process, nprocs=world, backend="gloo")
    worst = max(max(r["diffs"].values()) for r in out)
    act = out[0]["activations"]
    print(f"world {world}: largest difference {worst:.1e}; rank 0 sent {out[0]['calls']}")
    print(f"  per rank: {out[0]['params']} of 280 parameters; activations (input, hidden, "
          f"output) {act['this rank']} of {act['one process']} elements")

# %% [markdown] lang="en" tags=["lesson"]
# A common claim is that TP "divides the memory of a layer by the number of ranks". The
# parameters nearly are (fc2's bias stays whole on every rank: 76 = (280 - 8) / 4 + 8), and
# so is the hidden activation, but every rank still holds the whole input and output
# activations of the block (`batch x dim`: the "per rank" lines above), and
# all-reduces a tensor of that size twice per step, in every block (the output forward, the
# input's gradient backward): TP trades memory for communication on the critical path,
# which is why it stays inside a node, on the fastest links. A transformer layer has two
# such blocks, self-attention (the Q, K and V projections one column-parallel layer, a slice
# of the heads per rank; the output projection row-parallel) and the MLP: two all-reduces forward
# and two backward per layer, the count of the Megatron-LM paper (Shoeybi et al. 2019,
# arXiv 1909.08053, section 3).
#
# ## 2. The same with PyTorch: `parallelize_module` on a `DeviceMesh`
#
# PyTorch does not write `f` and `g`. `ColwiseParallel` and `RowwiseParallel`
# (`torch/distributed/tensor/parallel/style.py`) turn the weights into `DTensor`s sharded on
# dim 0 (`Shard(0)`, rows) or dim 1 (columns) of a `DeviceMesh`, and the communication
# comes from changing placements. `g`: `RowwiseParallel`'s output is `Partial()` (each rank
# holds a summand); turning it into `Replicate()` is the all-reduce
# (`redistribute_local_tensor` in `torch/distributed/tensor/_redistribute.py`), and its
# backward sends nothing, because `_redistribute_backward` keeps a `Replicate` gradient as
# it is instead of making it `Partial` again. `f`: `ColwiseParallel` wraps its input with
# `DTensor.from_local(x, mesh, [Replicate()])`; the input's gradient comes back `Partial`,
# and `from_local`'s backward (`_FromTorchTensor` in `torch/distributed/tensor/_api.py`)
# redistributes it to `Replicate`: an all-reduce, sent only when the input needs a gradient.
# (Between placements in general: `Partial` -> `Replicate` is an all-reduce, `Shard` ->
# `Replicate` an all-gather, `Partial` -> `Shard` a reduce-scatter.) The cell runs it on 4
# gloo ranks, with an input that needs its gradient as inside a deep model, and then **2D**:
# a 2 x 2 mesh with TP on one dimension ("tp") and FSDP's `fully_shard` on the other ("dp").
# Each rank records the collectives torch dispatched, forward and backward apart, with the
# bytes of the largest tensor of each; the cell prints rank 0's lists. A `TorchDispatchMode` records them: it sees DTensor's
# functional collectives (`_c10d_functional::...`) and the `c10d::...` ops FSDP calls, as
# torch's `CommDebugMode` in `torch/distributed/tensor/debug/_comm_mode.py` does.

# %% [markdown] lang="zh" tags=["lesson"]
# 一种常见说法是：TP“把一层的内存除以了 rank 数”。参数差不多是这样（fc2 的偏置在每个 rank 上
# 都是完整的：76 = (280 - 8) / 4 + 8），隐藏层的激活值也是，但每个 rank 仍然持有这个块完整的
# 输入和输出激活值（`batch x dim`，见上面以“per rank”开头的几行），而且每一步、每个块都要对
# 这么大的张量做两次全归约（前向是输出，反向是输入的梯度）：TP 是用关键路径上的通信换内存，
# 所以它通常放在一个节点内部、最快的链路上。一个 Transformer 层里有两个这样的块：MLP 和
# 自注意力（self-attention）。自注意力的 Q、K、V 三个投影合成一个列并行层，每个 rank 分到一部分
# 注意力头（attention head），输出投影做行并行。所以每层前向两次全归约、反向两次，与 Megatron-LM
# 论文（Shoeybi 等，2019，arXiv:1909.08053，第 3 节）给出的次数一致。
#
# ## 2. 用 PyTorch 做同样的事：`DeviceMesh` 上的 `parallelize_module`
#
# PyTorch 里没有显式的 `f` 和 `g`。`ColwiseParallel` 和 `RowwiseParallel`
# （`torch/distributed/tensor/parallel/style.py`）把权重变成 `DTensor`，在 `DeviceMesh` 上按
# 第 0 维（`Shard(0)`，即按行）或第 1 维（按列）分片；通信则来自放置方式（placement）之间的转换。
# 先看 `g`：`RowwiseParallel` 的输出是 `Partial()`（每个 rank 持有一个加数），把它转成
# `Replicate()` 就是那次全归约（`torch/distributed/tensor/_redistribute.py` 中的
# `redistribute_local_tensor`）；它的反向什么也不发送，因为 `_redistribute_backward` 让
# `Replicate` 的梯度保持原样，不再转回 `Partial`。再看 `f`：`ColwiseParallel` 用
# `DTensor.from_local(x, mesh, [Replicate()])` 包装输入；输入的梯度回来时是 `Partial`，
# `from_local` 的反向（`torch/distributed/tensor/_api.py` 中的 `_FromTorchTensor`）把它转成
# `Replicate`，这就是一次全归约，只有输入需要梯度时才会发生。放置方式之间的转换一般这样对应：
# `Partial` -> `Replicate` 是全归约，`Shard` -> `Replicate` 是全收集（all-gather），
# `Partial` -> `Shard` 是归约散发（reduce-scatter）。下面的单元先在 4 个 gloo rank 上运行它，
# 输入像在深层模型中那样需要梯度；再做**二维**（2D）：一个 2 × 2 的网格，一维（`"tp"`）上做 TP，
# 另一维（`"dp"`）上做 FSDP 的 `fully_shard`。每个 rank 把前向和反向分开，记录 torch 发出的集合
# 通信（collective），以及每次通信中最大张量的字节数；单元打印的是 rank 0 的记录。记录它们的是一个 `TorchDispatchMode`：
# DTensor 的函数式集合通信（`_c10d_functional::...`）和 FSDP 调用的 `c10d::...` 算子它都能看到，
# 与 torch 的 `CommDebugMode`（`torch/distributed/tensor/debug/_comm_mode.py`）做法相同。

# %% tags=["lesson"]
res = dl.spawn(tpmod.torch_tp_and_2d, nprocs=4, backend="gloo")
tp, two_d = res[0]["tp"], res[0]["2d"]
print(f"TP, 4 ranks: output diff {tp['output_diff']:.1e}, input grad diff {tp['x_grad_diff']:.1e}, "
      f"fc1.weight {tp['fc1.weight']}")
print("  forward:", tp["forward"], "| backward:", tp["backward"])
for r, x in enumerate(res):
    d = x["2d"]
    print(f"2D rank {r}: dp group {d['groups']['dp']}, tp group {d['groups']['tp']}, "
          f"placements {d['placements']}, local {d['local_shape']}, grad diff {d['grad_diff']:.1e}")
print("  forward:", two_d["forward"], "| backward:", two_d["backward"])
qkv = res[0]["qkv"]
print("q, k, v as 3 ColwiseParallel, o RowwiseParallel: forward", qkv["forward"],
      "| backward", qkv["backward"])

# %% [markdown] lang="en" tags=["lesson"]
# TP alone sends what the hand-written version sends: one all-reduce of the activation
# forward (`g`) and one backward (`f`), 128 bytes each (4 x 8 float32). In 2D, what goes
# over which dimension: the all-reduce runs inside a TP group ({0, 1} or {2, 3}); the
# all-gather and the reduce-scatter of 576 bytes (fc1's and fc2's weights and biases on each
# TP rank after TP's split, (64 + 8 + 64 + 8) x 4 bytes) run inside a DP group ({0, 2} or
# {1, 3}), the gather forward, the reduce-scatter backward (gloo's reduce-scatter is an
# all-reduce of the whole input, chapter 10). One all-gather, not two: the whole MLP is
# FSDP's root module here, and FSDP does not reshard the root after forward, since backward
# would gather the same parameters at once (`_lazy_init` in
# `torch/distributed/fsdp/_fully_shard/_fsdp_state.py`); section 4 counts blocks inside a
# model, two all-gathers and a reduce-scatter each. Here the input needs no gradient, so the
# backward has no all-reduce of `f`'s. fc1's weight is `_StridedShard` on "dp" and
# `Shard(0)` on "tp": each of the 4 ranks holds 4 of its 16 rows. Strided, because FSDP
# split what TP had split already: the rank at (dp d, tp t) holds rows 8t + 4d to
# 8t + 4d + 3, where `Shard(0)` on both dimensions would mean that "dp" splits first
# (`_StridedShard` in `torch/distributed/tensor/placement_types.py`). Every parameter's
# gradient equals the whole MLP's on the whole batch (float32: about 1e-8).
#
# The output's last line is the condition of section 1's count per transformer layer. Megatron
# computes Q, K and V with one column-parallel layer (`linear_qkv` in
# `megatron/core/transformer/attention.py`): one `f`, one all-reduce of the input's gradient.
# Given three separate layers `q`, `k`, `v`, `ColwiseParallel` wraps the same input three
# times, each with its own `from_local`, and each wrapping all-reduces its part of the
# input's gradient: three all-reduces backward of the activation's size where the fused
# layer sends one. Count the collectives of a plan (as this cell does, or with torch's
# `CommDebugMode`) before trusting a formula.
#
# On GPUs the same placement matters more: the "tp" dimension should be ranks of one node
# (NVLink), the "dp" dimension crosses nodes. Measuring that needs two nodes with GPUs; not
# run here. The meshes of this chapter are `"cpu"` meshes, and every `fully_shard` gets its
# mesh, so that on a machine with one GPU the cells compute on the CPU as they do here
# (seeing it needs such a machine; not run here). A `"cuda"` mesh would not:
# `init_device_mesh("cuda", ...)` sets each rank's device to `cuda:LOCAL_RANK` when that rank
# has not initialized CUDA yet (`dl.spawn` and torchrun set `LOCAL_RANK`;
# `_setup_world_group_and_device` in `torch/distributed/device_mesh.py`), and `fully_shard`
# without a mesh builds one on the accelerator (`_init_default_mesh` in
# `torch/distributed/fsdp/_fully_shard/_fsdp_init.py`); with one GPU, ranks 1, 2 and 3 would
# ask for GPUs that do not exist.

# %% [markdown] lang="zh" tags=["lesson"]
# 单独做 TP 时，发送的内容与手写版本完全一样：前向一次激活值的全归约（`g`），反向一次（`f`），
# 各 128 字节（4 × 8 个 float32）。二维时，看各种通信分别走哪一维：全归约在一个 TP 组内进行
# （{0, 1} 或 {2, 3}）；全收集和归约散发在一个 DP 组内进行（{0, 2} 或 {1, 3}），前向做全收集，
# 反向做归约散发，每次 576 字节，即 TP 切分之后每个 TP rank 上 fc1 和 fc2 的权重与偏置：
# (64 + 8 + 64 + 8) × 4 字节。gloo 的归约散发是对整个输入做一次全归约（见第 10 章）。全收集只有
# 一次，而不是两次：这里整个 MLP 就是 FSDP 的根模块，FSDP 在前向之后不会把根模块重新分片，因为
# 反向马上又要收集同样的参数（见 `torch/distributed/fsdp/_fully_shard/_fsdp_state.py` 中的
# `_lazy_init`）；第 4 节算的是模型内部的块，每块两次全收集加一次归约散发。这里输入不需要梯度，
# 所以反向没有 `f` 的那次全归约。fc1 的权重在 `"dp"` 上是 `_StridedShard`，在 `"tp"` 上是
# `Shard(0)`：4 个 rank 各持有它 16 行中的 4 行。之所以是“跨步”的分片，是因为 FSDP 切的是 TP
# 已经切过的那一块：位于 (dp d, tp t) 的 rank 持有第 (8t + 4d)～(8t + 4d + 3) 行；如果两维都写成
# `Shard(0)`，意思就成了 `"dp"` 先切（见 `torch/distributed/tensor/placement_types.py` 中的
# `_StridedShard`）。每个参数的梯度都与完整 MLP 在整批数据上的梯度一致（float32 下差异约 1e-8）。
#
# 输出的最后一行说明了第 1 节“每层前向、反向各两次全归约”这个计数成立的前提。Megatron 用一个
# 列并行层算出 Q、K、V（`megatron/core/transformer/attention.py` 中的 `linear_qkv`）：一个 `f`，
# 输入的梯度只做一次全归约。如果 `q`、`k`、`v` 是三个独立的层，`ColwiseParallel` 就会把同一个
# 输入包装三次，每次各用一个 `from_local`，每一次包装都对输入梯度中属于自己的那一部分做全归约：
# 反向要做三次与激活值同样大小的全归约，而合并的层只发送一次。相信公式之前，先数一数一个并行
# 方案实际发出的集合通信（像这个单元这样，或者用 torch 的 `CommDebugMode`）。
#
# 在 GPU 上这种摆放更重要：`"tp"` 这一维应当是同一节点内的 rank（NVLink），`"dp"` 这一维跨节点。
# 要实测这一点需要两个带 GPU 的节点，本章不做这项实测。本章的网格都是 `"cpu"` 网格，每次调用
# `fully_shard` 也都显式传入网格，这样在只有一块 GPU 的机器上，这些单元也和这里一样在 CPU 上
# 计算（要亲眼看到这一点需要这样一台机器，本章没有运行）。换成 `"cuda"` 网格就不行了：
# 如果某个 rank 还没有初始化 CUDA，`init_device_mesh("cuda", ...)` 会把它的设备设成
# `cuda:LOCAL_RANK`（`dl.spawn` 和 torchrun 都会设置 `LOCAL_RANK`；见
# `torch/distributed/device_mesh.py` 中的 `_setup_world_group_and_device`），不传网格的
# `fully_shard` 则会在加速器上建一个网格（见 `torch/distributed/fsdp/_fully_shard/_fsdp_init.py`
# 中的 `_init_default_mesh`）；只有一块 GPU 时，rank 1、2、3 要的 GPU 根本不存在。

# %% [markdown] lang="en" tags=["lesson"]
# ## 3. Pipeline parallelism from scratch
#
# Stage s of a model (here one Linear + tanh block) lives on rank s. A batch is cut into m
# **micro-batches**; forward passes flow from rank s to s+1 (`send`/`recv` of the
# activation), backward passes flow back (the activation's gradient). A **schedule** is each
# stage's order of passes. **GPipe** runs every forward, then every backward; **1F1B**
# (one forward, one backward) starts each backward as early as it can. When every forward
# takes the same time and every backward too, both leave every stage idle the same fraction
# of the step, the **bubble**: (p-1)/(m+p-1) for p stages and m micro-batches, the idle
# time over the whole step (p stages x the step's span). A common claim is that 1F1B
# shrinks the bubble; it does not: what differs is memory. GPipe holds m micro-batches'
# activations at its peak, 1F1B at most p - s on stage s.
#
# Papers do not all divide by the same thing. Narayanan et al. 2021 (the Megatron-LM paper
# on pipeline parallelism, arXiv 2104.04473, section 2.2.1) write the bubble as (p-1)/m: the
# same idle time divided by the ideal step, the m forwards and backwards without idling.
# With b = (p-1)/(m+p-1), the ratio idle / busy is b / (1 - b) = (p-1)/m: one quantity, two
# denominators (p = 4, m = 8: 27 % of the step, 38 % of the ideal step). Say which one when
# you quote a bubble. On paper (`ddp_lab.pipeline.simulate`, forward 1, backward 2 time
# units), with both denominators:

# %% [markdown] lang="zh" tags=["lesson"]
# ## 3. 从零实现流水线并行
#
# 模型的第 s 个阶段（stage，这里是一个 Linear + tanh 块）放在 rank s 上。一批数据被切成 m 个
# **微批**；前向从 rank s 流向 s+1（用 `send`/`recv` 传递激活值），反向再流回来
# （传回激活值的梯度）。**调度**（schedule）就是每个阶段执行各次计算的顺序。**GPipe** 先做完
# 所有前向，再做所有反向；**1F1B**（一次前向、一次反向交替）让每个反向尽早开始。只要每次前向
# 耗时相同、每次反向耗时也相同，两种调度下每个阶段的空闲比例就都相同，这个比例就是**气泡**：
# p 个阶段、m 个微批时为 (p-1)/(m+p-1)，即空闲时间占整步时间（p 个阶段 × 这一步的时长）的比例。
# 一种常见说法是 1F1B 缩小了气泡；其实并没有，两者的区别在内存：GPipe 在峰值时持有 m 个微批的
# 激活值，1F1B 在第 s 个阶段最多持有 p - s 个。
#
# 不同论文里气泡的分母并不相同。Megatron-LM 关于流水线并行的论文（Narayanan 等，2021，
# arXiv:2104.04473，第 2.2.1 节）把气泡写成 (p-1)/m：同样的空闲时间，除以的是理想的一步
# （ideal step），即 m 次前向和反向、没有任何空闲的时间。记 b = (p-1)/(m+p-1)，空闲与忙碌之比
# 就是 b / (1 - b) = (p-1)/m：同一个量，两种分母（p = 4、m = 8 时，以整步为分母是 27%，以理想的
# 一步为分母是 38%）。引用气泡数值时，要说明分母是什么。先在纸上推演
# （`ddp_lab.pipeline.simulate`，前向 1 个时间单位，反向 2 个），两种分母都列出来：

# %% tags=["lesson"]
from ddp_lab import pipeline as pp
from ddp_lab.pipeline_1f1b import one_f_one_b_order

for p, m in ((4, 8), (4, 4), (8, 8)):
    for name, make in (("GPipe", pp.gpipe_order), ("1F1B", one_f_one_b_order)):
        orders = [make(s, p, m) for s in range(p)]
        b = pp.bubble(pp.simulate(orders, m))
        print(f"p={p} m={m} {name:5}: bubble {b:.3f} (formula {pp.bubble_formula(p, m):.3f}), "
              f"idle / busy {b / (1 - b):.3f} ((p-1)/m = {(p - 1) / m:.3f}), "
              f"activations held per stage {[pp.peak_in_flight(o) for o in orders]}")

# %% [markdown] lang="en" tags=["lesson"]
# Now for real: 4 gloo ranks, 8 micro-batches, each stage's gradients compared with the whole
# model's in one process. Each pass also sleeps (20 ms forward, 40 ms backward): 4 ranks
# that computed would compete for the cores of a machine with fewer than 4 free ones (a
# laptop, a shared server), and the timeline would show the machine, not the schedule; a
# sleeping rank takes no core, so each pass takes its own time, as on a GPU of its own. Sends are `isend` (never blocking: with a blocking `send`, two
# neighbours that send to each other at once could wait for each other, since a send may not
# complete before its receive is posted), receives are blocking `recv`. The
# bubble is measured from the bars: 1 - (time in passes) / (4 x the whole span).

# %% [markdown] lang="zh" tags=["lesson"]
# 现在真正运行：4 个 gloo rank，8 个微批，每个阶段的梯度都与单进程中完整模型的梯度对照。每次
# 计算还会休眠一段时间（前向 20 ms，反向 40 ms）：如果机器的空闲核少于 4 个（笔记本电脑、
# 共享服务器），4 个真正计算的 rank 就会互相争抢核，时间线反映的就是机器的争抢，而不是调度
# 本身；休眠的 rank 不占用核，所以每次计算
# 都只花它自己的时间，就像每个 rank 有自己的 GPU 时那样。发送用 `isend`，从不阻塞：发送可能要等到
# 对方发起接收后才能完成，如果用阻塞的 `send`，两个相邻的 rank 同时向对方发送时就可能互相等待。
# 接收用阻塞的 `recv`。气泡从图中的条形实测得出：1 - (计算时间之和) / (4 × 整段时长)。

# %% tags=["lesson"]
import matplotlib.pyplot as plt

runs = dl.spawn(pp.pipeline_runs, nprocs=4, backend="gloo")
formula = pp.bubble_formula(4, 8)
fig, axes = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True)
for ax, name in zip(axes, ("gpipe", "1f1b"), strict=True):
    res = [r[name] for r in runs]
    pp.plot_timeline(res, name, ax, formula=formula)
    print(f"{name}: measured bubble {pp.measured_bubble(res):.3f}, formula {formula:.3f}; "
          f"gradient diff {max(r['max_grad_diff'] for r in res):.0e}; activations held "
          f"{[r['peak'] for r in res]} micro-batches ({[r['peak_bytes'] for r in res]} bytes)")
fig.tight_layout()

# %% [markdown] lang="en" tags=["lesson"]
# Both schedules give the same gradients as one process (float64: a difference of the order
# of 1e-17, rounding), and 1F1B holds 4, 3, 2, 1 micro-batches' activations where GPipe holds
# 8 on every stage. The measured bubbles sit a few hundredths above the formula, which
# counts communication as free: every pass whose input comes from a neighbour also waits for
# a send, a receive and the wake-up of the rank that waits in `recv`, and on a loaded machine
# for a free core. The two measured numbers need not be equal either: how much each schedule pays for
# those waits depends on where they fall on its critical path and on the machine, and the
# formula models neither; read each against the formula. With one stage per rank the
# bubble shrinks only with more micro-batches per step; schedules that put several stages on
# each rank (interleaved 1F1B, Megatron's virtual pipeline) or split each backward into its
# input-gradient and weight-gradient halves (the zero-bubble schedules) shrink it further;
# none is built here.
#
# PyTorch's twin is `torch.distributed.pipelining`: `PipelineStage` (`stage.py`) and, in
# `schedules.py`, `ScheduleGPipe` and `Schedule1F1B` (and, for the schedules above,
# `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`). Its
# 1F1B (`Schedule1F1B._step_microbatches`) runs `min(m, p - s)` forwards before its first
# backward, then alternates starting with a backward: the same order of passes as
# `one_f_one_b_order`. The cell runs both of torch's schedules on the same 4 stages and
# micro-batches (`PipelineStage` around each rank's stage, the loss as `loss_fn`), records
# the order in which torch ran each stage's passes (its `forward_one_chunk` and
# `backward_one_chunk` calls), and compares the gradients with one process. It also asks
# `Schedule1F1B` for 3 micro-batches on 4 stages: torch refuses fewer micro-batches than
# stages, where `one_f_one_b_order` (and exercise 2) caps the warm-up at m instead.

# %% [markdown] lang="zh" tags=["lesson"]
# 两种调度得到的梯度都与单进程一致（float64，差异在 1e-17 量级，只是舍入误差）；1F1B 在各阶段
# 分别只持有 4、3、2、1 个微批的激活值，GPipe 则每个阶段都持有 8 个。实测的气泡比公式值高出
# 几个百分点，因为公式把通信算作零开销：凡是输入来自相邻 rank 的计算，还要等一次发送、一次接收，
# 以及唤醒阻塞在 `recv` 里的 rank；机器负载高时，还得等到空闲的核。两种调度的实测值也不一定相等：
# 每种调度为这些等待多付多少，取决于它们落在关键路径的哪些位置，也取决于机器，而公式对这两点
# 都不建模。所以请分别拿它们和公式比较。每个 rank 只放一个阶段时，只有增加每步的微批数才能
# 缩小气泡。还有两类调度能进一步缩小气泡：一类让每个 rank 承担多个阶段（交错式 1F1B，即
# Megatron 的虚拟流水线），另一类把每次反向拆成输入梯度和权重梯度两半（零气泡调度）。本章都
# 不实现。
#
# PyTorch 中对应的实现是 `torch.distributed.pipelining`：`PipelineStage`（`stage.py`），以及
# `schedules.py` 中的 `ScheduleGPipe` 和 `Schedule1F1B`（上面提到的几种调度对应
# `ScheduleInterleaved1F1B`、`ScheduleInterleavedZeroBubble`、`ScheduleZBVZeroBubble`）。它的
# 1F1B（`Schedule1F1B._step_microbatches`）在第一次反向之前做 `min(m, p - s)` 次前向，之后从
# 一次反向开始交替进行，计算顺序与 `one_f_one_b_order` 相同。下面的单元在同样的 4 个阶段、
# 同样的微批上运行 torch 的这两种调度（每个 rank 的阶段包在 `PipelineStage` 里，损失函数作为
# `loss_fn` 传入），记录 torch 实际执行每个阶段各次计算的顺序（即它对 `forward_one_chunk` 和
# `backward_one_chunk` 的调用），并把梯度与单进程对照。单元还让 `Schedule1F1B` 在 4 个阶段上
# 只用 3 个微批：torch 不接受微批数少于阶段数，而 `one_f_one_b_order`（以及练习 2）的做法是
# 把预热（warm-up）的前向次数限制在 m 以内。

# %% tags=["lesson"]
twins = dl.spawn(pp.torch_pipeline_runs, nprocs=4, backend="gloo")
for name, ours in (("gpipe", pp.gpipe_order), ("1f1b", one_f_one_b_order)):
    same = [r[name]["order"] == ours(s, 4, 8) for s, r in enumerate(twins)]
    worst = max(r[name]["max_grad_diff"] for r in twins)
    print(f"torch {name}: same order as ours on stages {same}; gradient diff {worst:.0e}")
print("torch 1f1b, 3 micro-batches on 4 stages:", twins[0]["fewer_micro"])

# %% [markdown] lang="en" tags=["lesson"]
# ## 4. The arithmetic of choosing
#
# `ddp_lab.parallel_plan.per_step` puts the course's cost models together for a stack of MLP
# blocks (dim -> 4 dim -> dim) trained with float32 AdamW on dp x tp x pp ranks: parameters,
# gradients and optimizer state per rank (chapter 10's ZeRO model), activations, the bytes
# each rank sends per step (ring algorithms: an all-reduce sends 2(n-1)/n of its payload, an
# all-gather or a reduce-scatter (n-1)/n), FLOPs (6 per parameter and row: 2 forward, 4
# backward) and the bubble. 8 blocks of dim 1024, 4,096 rows (tokens) per step, 8 ranks:

# %% [markdown] lang="zh" tags=["lesson"]
# ## 4. 怎么选：算一笔账
#
# `ddp_lab.parallel_plan.per_step` 把课程前面建立的几个估算模型合在一起。要估算的网络由若干个
# MLP 块（dim -> 4 dim -> dim）叠成，在 dp × tp × pp 个 rank 上用 float32 AdamW 训练。它算出
# 每个 rank 每步的这几项：参数、梯度和优化器状态（第 10 章的 ZeRO 模型），激活值，发送的字节数，
# FLOPs 和气泡。字节数按环形算法计：全归约发送其有效载荷（payload）的 2(n-1)/n，全收集或归约散发
# 发送 (n-1)/n；FLOPs 按每个参数、每行 6 次计（前向 2 次，反向 4 次）。下面是 8 个 dim 为 1024
# 的块、每步 4096 行（token）、8 个 rank 的结果：

# %% tags=["lesson"]
from ddp_lab import parallel_plan as plan

choices = {"DP 8": {"dp": 8}, "FSDP 8": {"dp": 8, "fsdp": True}, "TP 8": {"tp": 8},
           "PP 8, m=32": {"pp": 8, "micro": 32}, "FSDP 2 x TP 4": {"dp": 2, "tp": 4, "fsdp": True},
           "DP 2 x PP 4, m=8": {"dp": 2, "pp": 4, "micro": 8}}
print(" " * 18 + dl.tr(en=f"{'state MB':>9}{'activ. MB':>10}{'sent MB':>9}{'GFLOP':>8}{'bubble':>8}",
                      zh="  状态 MB 激活值 MB  发送 MB   GFLOP    气泡"))
for name, kw in choices.items():
    r = plan.per_step(1024, 8, 4096, **kw)
    print(f"{name:18}{r['params+grads+optim'] / 1e6:9.1f}{r['activations'] / 1e6:10.1f}"
          f"{r['sent'] / 1e6:9.1f}{r['flops'] / 1e9:8.1f}{r['bubble']:8.2f}")

# %% [markdown] lang="en" tags=["lesson"]
# Read it row by row (67 M parameters, 16 bytes each with AdamW): DP keeps the whole state,
# 1,074 MB, on every rank; FSDP divides it by 8 and sends 1.5x DP's bytes (two all-gathers
# and a reduce-scatter instead of an all-reduce); TP divides the state too, but every TP
# rank sees the whole batch, so its activations are the largest, and it sends activations at
# every layer, rows x dim each: bytes that grow with the batch, where DP's grow with the
# number of parameters; PP divides the state and
# sends the least, but pays the bubble. The FLOPs per rank are nearly the same in every row
# (TP's whole fc2 biases add a little): the work is divided 8 ways each time; what differs is
# what dividing it costs. Products combine the divisions. Which wins depends on where the
# bytes go: TP's sends are on the critical path of every layer (fast
# links only), DP's and FSDP's can overlap computation (chapters 07 and 10), PP's are small
# but its bubble
# is idle time.
#
# **Prediction next to a measurement.** The same calculator for a run this machine can do:
# 2 TP ranks, 4 blocks of dim 64, 256 rows, with the compute time from this machine's
# measured matmul rate (one thread per rank) and the all-reduces from chapter 04's gloo model
# (`costs.gloo_cpu`) with alpha and beta measured here by ping-pong (`shaped_links.calibrate`).

# %% [markdown] lang="zh" tags=["lesson"]
# 逐行来看（6700 万个参数，用 AdamW 时每个 16 字节）：DP 在每个 rank 上保存全部状态，1074 MB；
# FSDP 把它除以 8，发送的字节数是 DP 的 1.5 倍（两次全收集加一次归约散发，代替一次全归约）；
# TP 也把状态分掉了，但每个 TP rank 都要处理整批数据，所以它的激活值最大，而且每一层都要发送
# 激活值，每次的元素数是行数 × dim：这些字节随批增长，而 DP 的字节数随参数个数增长；PP 把状态
# 分掉并且发送得最少，但要付出气泡的代价。各行中每个 rank 的 FLOPs 都差不多（TP 中完整的 fc2
# 偏置会多出一点）：每一行都把工作分成了 8 份，不同的只是切分所付出的代价。组合方案（如
# FSDP 2 × TP 4）则把几种切分相乘。哪种更好，取决于这些字节走在哪里：TP 的发送在每一层的关键
# 路径上（只能用快速链路），DP 和 FSDP 的发送可以与计算重叠（第 07 章和第 10 章），PP 的发送
# 很少，但它的气泡是空闲时间。
#
# **预测与实测并列**。用同一个计算器算一次这台机器能跑的训练：2 个 TP rank，4 个 dim 为 64 的
# 块，256 行；计算时间用这台机器实测的矩阵乘法速率（每个 rank 一个线程），全归约用第 04 章的
# gloo 模型（`costs.gloo_cpu`），其中 α 和 β 由这里的乒乓测试（`shaped_links.calibrate`）测得。

# %% tags=["lesson"]
from ddp_lab.labs.shaped_links import calibrate, fit

cal = dl.spawn(calibrate, nprocs=2, backend="gloo")[0]
alpha, beta = fit(cal["calibration"])
got = dl.spawn(plan.measure_tp_step, nprocs=2, backend="gloo")[0]
want = plan.per_step(64, 4, 256, tp=2)
pred = plan.predict_time(64, 4, 256, 2, got["flops_per_s"], alpha, beta)
print(f"state per rank: predicted {want['params+grads+optim']:.0f} B, measured {got['state_bytes']} B")
print(f"all-reduce payloads per step: predicted 8 x {256 * 64 * 4} B, measured {got['payloads']}")
print(f"step time: predicted {pred['step_s'] * 1e3:.1f} ms (compute {pred['compute_s'] * 1e3:.1f}, "
      f"all-reduces {pred['comm_s'] * 1e3:.1f}), measured {got['step_s'] * 1e3:.1f} ms")
mfu = want["flops"] / (got["step_s"] * got["flops_per_s"])
print(f"MFU (model FLOPs / (time x this rank's matmul rate)): {mfu:.0%}")

# %% [markdown] lang="en" tags=["lesson"]
# The counts match exactly: the state to the byte, eight all-reduces of 64 KiB (one per
# block forward, one backward). The time does not, and the gap is the lesson of MFU: 6 x
# parameters x rows counts the matmuls only, while a step of small matrices also pays gelu,
# the optimizer's elementwise work, Python and autograd per operation, and this shared
# machine's load. A real plan starts from such a measurement of one step and scales it, it
# does not trust FLOPs alone.
#
# ## 5. 1,024 ranks in one process: torch's fake process group
#
# `torch.testing._internal.distributed.fake_pg` provides `FakeStore` and registers the
# backend `"fake"` (`FakeProcessGroup`, in `torch/csrc/distributed/c10d/FakeProcessGroup.hpp`
# of PyTorch's sources): a process group of any size whose collectives return at once
# without communicating. An all-reduce leaves its tensor as it was, an all-gather copies this
# rank's own input into every slot (the cell's first line shows both). Values are
# meaningless, but shapes, placements and sharding are real: enough to ask what each rank
# would hold. The model is built on the `meta` device (no memory at all), then FSDP on 1,024
# ranks, and FSDP x TP on a 128 x 8 mesh, as rank 17:

# %% [markdown] lang="zh" tags=["lesson"]
# 计数完全一致：状态精确到字节，8 次 64 KiB 的全归约（每个块前向一次、反向一次）。时间则不一致，
# 这个差距正是模型算力利用率（MFU）要说明的：6 × 参数个数 × 行数只计入了矩阵乘法，而矩阵这么小
# 时，一步里还要付出 gelu、优化器的逐元素运算、每个算子的 Python 和 autograd 开销，还要承受这台
# 共享机器的负载。真实的规划从实测一步开始再按比例推算，而不是只相信 FLOPs。
#
# ## 5. 一个进程里的 1024 个 rank：torch 的伪进程组
#
# `torch.testing._internal.distributed.fake_pg` 提供 `FakeStore`，并注册后端 `"fake"`（即
# PyTorch 源码中 `torch/csrc/distributed/c10d/FakeProcessGroup.hpp` 里的 `FakeProcessGroup`）：
# 这是一个大小任意的进程组，它的集合通信调用立即返回，并不真正通信。全归约让张量保持原样，
# 全收集把本 rank 自己的输入复制到每一个位置上（单元输出的第一行同时展示了这两点）。数值没有
# 意义，但形状、放置方式和分片都是真实的，足以回答每个 rank 会持有什么。模型建在 `meta` 设备上
# （完全不占内存），然后以 rank 17 的身份，分别做 1024 个 rank 的 FSDP，以及 128 × 8 网格上的
# FSDP × TP：

# %% tags=["lesson"]
fake = dl.spawn(plan.fake_world, nprocs=1)[0]
print(f"world size {fake['world']}, this rank {fake['rank']}, model {fake['params'] / 1e6:.0f} M parameters; "
      f"all_reduce(1.0) gave {fake['all_reduce']}, all_gather of the rank gave {fake['all_gather']}")
for name in ("fsdp", "fsdp x tp"):
    f = fake[name]
    predicted = fake["params"] / 1024
    print(f"{name:10} mesh {f['mesh']}: {f['params_per_rank']} parameters on this rank "
          f"(Psi / 1024 = {predicted:.0f}); fc1.weight {f['fc1.weight']}")

# %% [markdown] lang="en" tags=["lesson"]
# 537 M parameters become 524,368 per rank with FSDP on 1,024 ranks, exactly the prediction
# Psi / N (every dimension here divides by 1,024). FSDP x TP holds 112 more: `RowwiseParallel`
# keeps fc2's bias (4,096 elements) whole on every TP rank, so FSDP shards it over 128 ranks,
# not 1,024: 4 blocks x (32 - 4) elements. In bytes with float32 AdamW: 16 x 524 K = 8.4 MB
# of state per rank instead of 8.6 GB. What the fake group cannot
# say is time: its collectives take none.

# %% [markdown] lang="zh" tags=["lesson"]
# 在 1024 个 rank 上做 FSDP 时，5.37 亿个参数变成每个 rank 524368 个，正好是预测的 Psi / N
# （这里每个维度都能被 1024 整除）。FSDP × TP 多持有 112 个：`RowwiseParallel` 让 fc2 的偏置
# （4096 个元素）在每个 TP rank 上保持完整，所以 FSDP 把它分到 128 个 rank 上，而不是 1024 个：
# 4 个块 × (32 - 4) 个元素。换算成 float32 AdamW 的字节数：每个 rank 的状态是 16 × 52.4 万
# = 8.4 MB，而不是 8.6 GB。伪进程组回答不了的是时间：它的集合通信不花时间。

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: the conjugate pair (3 points)
#
# Write `copy_to_tp(x)` (Megatron's `f`: identity forward, all-reduce of the gradient
# backward) and `reduce_from_tp(x)` (`g`: all-reduce forward, identity backward) on the
# default process group, each with a `torch.autograd.Function`. The graded cell runs a
# two-layer MLP split column-then-row with your pair, on 2 and on 3 ranks with drawn widths,
# and compares the output, the input's gradient and each rank's slices of the weight and
# bias gradients with the whole MLP in one process (float64). It also hands
# `reduce_from_tp` the output of `torch.exp`, which autograd keeps for exp's backward: do
# not all-reduce in place a tensor autograd still needs; clone first. In that side test,
# and in one call of `copy_to_tp`, the data differs between ranks (in the MLP it is the
# same on all of them): identity must return each rank's own tensor.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：一对共轭算子（3 分）
#
# 写出 `copy_to_tp(x)`（Megatron 的 `f`：前向恒等，反向对梯度做全归约）和 `reduce_from_tp(x)`
# （`g`：前向全归约，反向恒等），各用一个 `torch.autograd.Function` 实现，通信都走默认进程组。
# 评分单元会用你的这对算子搭一个先列并行、后行并行的两层 MLP，分别在 2 个和 3 个 rank 上、
# 用随机抽取的宽度运行，把输出、输入的梯度，以及每个 rank 那一段权重梯度和偏置梯度，与单进程
# 中完整的 MLP 比较（float64）。它还会把 `torch.exp` 的输出交给 `reduce_from_tp`，而 autograd
# 要留着这个张量给 exp 的反向用：不要对 autograd 还要用的张量原地做全归约，先克隆一份。在这个
# 附加测试里，以及单独调用一次 `copy_to_tp` 时，各 rank 的数据互不相同（MLP 里各 rank 的数据
# 都一样）：恒等操作必须返回每个 rank 自己的张量。

# %% tags=["exercise"]
import torch.distributed as dist


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return x.clone()
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
        ### END SOLUTION


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        x = x.clone()
        dist.all_reduce(x)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return grad
        ### END SOLUTION


def copy_to_tp(x):
    return CopyToTP.apply(x)


def reduce_from_tp(x):
    return ReduceFromTP.apply(x)


# %% tags=["grade"] grade_id="12.tp_pair" points=3
dl.grade("12.tp_pair", copy_to_tp, reduce_from_tp)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: a 1F1B schedule (3 points)
#
# Write `schedule_1f1b(stage, stages, micro)`: stage `stage`'s order of passes, a list of
# `("F", i)` and `("B", i)` for micro-batches `i = 0 .. micro-1`. It must run: every pass
# once, each F(i) before its B(i), the micro-batches in the order the neighbouring stages
# send them (`recv` takes messages in the order they were sent), no stage waiting forever.
# It must hold at most `min(stages - stage, micro)` micro-batches' activations at once, and
# leave the bubble (p-1)/(m+p-1). The graded cell checks your orders on paper
# (`ddp_lab.pipeline.simulate`: forward 1, backward 2 time units) for drawn numbers of
# stages and micro-batches and for every pipeline of 2 to 6 stages and 1 to 8 micro-batches,
# then runs one case for real on gloo ranks with send/recv and compares the gradients with
# one process. GPipe's order fails (it holds m); so does alternating from the start (a
# larger bubble).

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：1F1B 调度（3 分）
#
# 写出 `schedule_1f1b(stage, stages, micro)`，返回第 `stage` 个阶段的计算顺序：一个由
# `("F", i)` 和 `("B", i)` 组成的列表，`i` 是微批的索引，取 `0 .. micro-1`。它必须能跑通：每次
# 计算恰好一次，每个 F(i) 在对应的 B(i) 之前，各微批按相邻阶段发来的顺序处理（`recv` 按发送的
# 顺序接收消息），不会有阶段一直等下去。它还必须做到：同一时刻最多持有
# `min(stages - stage, micro)` 个微批的激活值，气泡为 (p-1)/(m+p-1)。评分单元先在纸上推演
# 你的顺序（`ddp_lab.pipeline.simulate`：前向 1 个时间单位，反向 2 个），用的是几组随机抽取的
# 阶段数和微批数，以及 2 到 6 个阶段、1 到 8 个微批的每一种流水线；再挑其中一组在 gloo rank 上
# 用 send/recv 真正运行，把梯度与单进程比较。GPipe 的顺序通不过（它要持有 m 个微批的激活值）；
# 一开始就交替也通不过（气泡更大）。

# %% tags=["exercise"]
def schedule_1f1b(stage, stages, micro):
    ### BEGIN SOLUTION
    warmup = min(stages - stage - 1, micro)
    order = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro):
        order += [("F", i), ("B", i - warmup)]
    return order + [("B", i) for i in range(micro - warmup, micro)]
    ### END SOLUTION


# %% tags=["grade"] grade_id="12.one_f_one_b" points=3
dl.grade("12.one_f_one_b", schedule_1f1b)

# %% [markdown] lang="en"
# ## Summary
#
# - Tensor parallelism splits each layer: column-parallel (output features) then
#   row-parallel (input features), with two conjugate operators, `f` (identity / all-reduce
#   backward) and `g` (all-reduce / identity backward); it matches one process, and sends
#   the activations twice per block (a column-parallel layer and its row-parallel partner)
#   and step. PyTorch's `ColwiseParallel`/`RowwiseParallel` do the same with `DTensor`
#   placements on a `DeviceMesh`.
# - 2D: TP's all-reduces stay in the "tp" groups, FSDP's all-gather and reduce-scatter in
#   the "dp" groups.
# - Pipeline parallelism puts layers on ranks; with equal forward times and equal backward
#   times GPipe and 1F1B share the bubble, (p-1)/(m+p-1) of the whole step ((p-1)/m of the
#   ideal step, the other denominator papers use), and 1F1B holds at most p - s
#   micro-batches' activations instead of m. torch's `ScheduleGPipe` and `Schedule1F1B`
#   run the same orders of passes.
# - Choosing is arithmetic: state, activations, bytes, FLOPs and bubble per rank; counts can
#   be predicted exactly, time needs a measured step; torch's fake process group answers
#   the memory questions at 1,024 ranks in one process.

# %% [markdown] lang="zh"
# ## 小结
#
# - 张量并行切分每一层：先列并行（输出特征），再行并行（输入特征），用两个共轭算子 `f`（前向
#   恒等，反向全归约）和 `g`（前向全归约，反向恒等）；结果与单进程一致，每个块（一个列并行层
#   加上与之配对的行并行层）每步要发送两次激活值。PyTorch 的 `ColwiseParallel`/`RowwiseParallel`
#   用 `DeviceMesh` 上 `DTensor` 的放置方式做同样的事。
# - 二维：TP 的全归约留在 `"tp"` 组内，FSDP 的全收集和归约散发留在 `"dp"` 组内。
# - 流水线并行把层放到不同的 rank 上；各次前向耗时相同、各次反向耗时也相同时，GPipe 和 1F1B
#   的气泡相同，占整步的 (p-1)/(m+p-1)（以理想的一步为分母则是 (p-1)/m，有些论文用的是这个
#   分母）；1F1B 最多持有 p - s 个微批的激活值，GPipe 则要持有 m 个。torch 的 `ScheduleGPipe` 和
#   `Schedule1F1B` 执行的计算顺序与此相同。
# - 选择是一道算术题：每个 rank 的状态、激活值、字节数、FLOPs 和气泡；计数可以精确预测，时间
#   需要实测一步；torch 的伪进程组能在一个进程里回答 1024 个 rank 时的内存问题。


# %% [markdown] lang="en"
# ## Concept checks
#
# 7 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything; a "what if" can then be checked by running it (`tp.fc1.copy = lambda x, group: x`
# takes `f` out of a `TensorParallelMLP` named `tp`, as `compare_with_one_process` builds one;
# `plan.per_step` recomputes section 4's table). In the exercise notebook the same answers
# are graded (`12.concepts`, 2 points when all are right).
#
# **1.** In `TensorParallelMLP` (fc1 column-parallel, fc2 row-parallel, 2 ranks), replace `f` by a plain identity (no all-reduce in backward) and keep `g` as it is. Compared with the whole MLP in one process:
#
# - (a) everything still matches: `g`'s all-reduce already gives every rank the same numbers, forward and backward
# - (b) the output is already wrong in the forward pass
# - (c) the output and the weight gradients match; the input's gradient on each rank is only that rank's share
# - (d) the ranks hang: each waits in an all-reduce the others never start
#
# **2.** One MLP block (dim 1,024 -> 4,096 -> 1,024) inside a deep model is split column-then-row over 4 TP ranks; the step has 2,048 rows (tokens), float32. With ring all-reduces (each sends 2(n-1)/n of its payload), how many MB (10^6 bytes) does each rank send for this block in one step, forward and backward? (a number)
#
# **3.** In section 4's table, the rows per step go from 4,096 to 8,192 (same model, same 8 ranks). The bytes each rank sends per step:
#
# - (a) double for "DP 8" and for "TP 8"
# - (b) double for "TP 8", stay the same for "DP 8"
# - (c) stay the same for "TP 8", double for "DP 8"
# - (d) stay the same for both: the model did not change
#
# **4.** A pipeline of 4 stages and 8 micro-batches, every forward taking the same time and every backward too, switches from GPipe to 1F1B. What changes?
#
# - (a) the bubble shrinks, since each backward starts earlier; the activations held stay those of 8 micro-batches
# - (b) both the bubble and the activations held shrink
# - (c) nothing: the same bubble and the same activations, only the order of the passes differs
# - (d) the bubble stays 3/11; stage 0 holds at most 4 micro-batches' activations instead of 8
#
# **5.** A pipeline of 4 stages, equal pass times. What is the smallest number of micro-batches per step that brings the bubble, the idle fraction of the whole step, down to 10 % or less? (a number)
#
# **6.** Section 4's model (8 blocks of dim 1,024, float32 AdamW: 16 bytes per parameter) on 8 ranks as DP 4 x TP 2, plain DP (no FSDP). How many MB (10^6 bytes) of parameters, gradients and optimizer state does each rank hold? (a number)
#
# **7.** FSDP x TP on 2 nodes of 8 GPUs (NVLink inside a node, a slower network between the nodes), mesh 2 x 8. Which dimension should the 8 GPUs of one node form?
#
# - (a) "tp": TP's all-reduces hold up every layer; FSDP's collectives can overlap computation
# - (b) "dp": FSDP moves the whole model's parameters and gradients every step, more bytes than TP's activations, so it needs the fast links
# - (c) either: the bytes each rank sends are the same whichever way the mesh is laid out
# - (d) neither: FSDP and TP cannot share one mesh


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 7 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码；“如果……会怎样”的题目，算完之后可以自己运行验证（照 `compare_with_one_process`
# 的做法建一个名为 `tp` 的 `TensorParallelMLP`，`tp.fc1.copy = lambda x, group: x` 就去掉了其中的 `f`；
# `plan.per_step` 可以重算第 4 节的表格）。练习笔记本会对同样的答案评分（`12.concepts`，全部
# 答对得 2 分）。
#
# **1.** 在 `TensorParallelMLP`（fc1 列并行，fc2 行并行，2 个 rank）中，把 `f` 换成单纯的恒等映射（反向不做全归约），`g` 保持不变。与单进程中完整的 MLP 相比：
#
# - (a) 全都一致：无论前向还是反向，`g` 的全归约都已经让每个 rank 拿到相同的数值
# - (b) 前向的输出就已经错了
# - (c) 输出和权重梯度一致；每个 rank 上输入的梯度只是总和中本 rank 的那一份
# - (d) 各 rank 卡住：每个 rank 都在等一次其他 rank 永远不会发起的全归约
#
# **2.** 一个深层模型中的某个 MLP 块（dim 1024 -> 4096 -> 1024）按先列并行、后行并行的方式切到 4 个 TP rank 上；每步 2048 行（token），float32。全归约用环形算法（每次发送其有效载荷的 2(n-1)/n），这个块在一步之内（前向加反向）每个 rank 发送多少 MB（10^6 字节）？（填一个数）
#
# **3.** 把第 4 节表格中每步的行数从 4096 增加到 8192（模型不变，仍是 8 个 rank）。每个 rank 每步发送的字节数：
#
# - (a) “DP 8”和“TP 8”都翻倍
# - (b) “TP 8”翻倍，“DP 8”不变
# - (c) “TP 8”不变，“DP 8”翻倍
# - (d) 都不变：模型没有变
#
# **4.** 一条 4 个阶段、8 个微批的流水线，每次前向耗时相同，每次反向也相同，从 GPipe 换成 1F1B。什么变了？
#
# - (a) 气泡变小，因为每个反向开始得更早；持有的激活值仍是 8 个微批的
# - (b) 气泡和持有的激活值都变小
# - (c) 什么都没变：气泡相同，激活值相同，只是计算的顺序不同
# - (d) 气泡仍是 3/11；阶段 0 最多持有 4 个微批的激活值，而不是 8 个
#
# **5.** 一条 4 个阶段的流水线，各次计算耗时相同。每步至少要多少个微批，才能让气泡（空闲时间占整步时间的比例）降到 10% 或以下？（填一个数）
#
# **6.** 第 4 节的模型（8 个 dim 为 1024 的块，float32 AdamW：每个参数 16 字节）在 8 个 rank 上按 DP 4 × TP 2 训练，DP 是普通的数据并行（不用 FSDP）。每个 rank 持有的参数、梯度和优化器状态一共多少 MB（10^6 字节）？（填一个数）
#
# **7.** 在 2 个节点、每个节点 8 块 GPU（节点内是 NVLink，节点之间是较慢的网络）上做 FSDP × TP，网格为 2 × 8。一个节点的 8 块 GPU 应当组成哪一维？
#
# - (a) `"tp"`：TP 的全归约位于每一层的关键路径上，每层都要等它；FSDP 的集合通信可以与计算重叠
# - (b) `"dp"`：FSDP 每一步都要搬运整个模型的参数和梯度，字节数比 TP 的激活值还多，所以需要快速链路
# - (c) 哪一维都行：无论网格怎样排布，每个 rank 发送的字节数都相同
# - (d) 都不行：FSDP 和 TP 不能共用一个网格


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: "c",  # a letter
    2: 25.17,  # a number
    3: "b",  # a letter
    4: "d",  # a letter
    5: 27,  # a number
    6: 537.3,  # a number
    7: "a",  # a letter
    ### END ANSWERS
}
dl.quiz("12", my_answers)


# %% tags=["grade"] grade_id="12.concepts" points=2
dl.grade("12.concepts", my_answers)
