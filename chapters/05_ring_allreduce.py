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
#       en: "05 The ring all-reduce, by hand"
#       zh: "05 亲手实现环形全归约"
# ---

# %% [markdown] lang="en"
# # 05 The ring all-reduce, by hand
#
# Every `DistributedDataParallel` step ends with an **all-reduce** of the gradients. NCCL
# can run it as a **ring all-reduce** (one of its algorithms, chosen per call by a cost
# model: chapter 04), and Gloo's all-reduce on CPU tensors is a ring too: a
# **reduce-scatter** followed by an **all-gather**, 2(N-1) steps in which every rank sends
# one chunk of 1/N of the tensor to its right neighbour. It is easy to get wrong: the
# hand-written ring of PyTorch's tutorial "Writing Distributed Applications with PyTorch"
# (`intermediate_source/dist_tuto.rst` in `pytorch/tutorials`) summed the wrong buffer
# until 2020 (pytorch/pytorch issue #31572, fixed by pytorch/tutorials pull request #1039),
# and it passes the *whole* buffer at every step. In this chapter you watch every step,
# trace a real run, measure the ring against `dist.all_reduce`, and write it yourself.

# %% [markdown] lang="zh"
# # 05 亲手实现环形全归约
#
# `DistributedDataParallel` 的每一步都以梯度的**全归约**（all-reduce）结束。NCCL 可以用
# **环形全归约**（ring all-reduce）来完成它（这是它的算法之一，每次调用由代价模型选择，见第 04 章），
# Gloo 对 CPU 张量的全归约也是环形的：先**归约散发**（reduce-scatter），再**全收集**（all-gather），
# 共 2(N-1) 步，每一步每个 rank（进程编号）把张量的 1/N（一个块）发给右边的邻居。这个算法很容易写错：
# PyTorch 教程 “Writing Distributed Applications with PyTorch”（`pytorch/tutorials` 仓库中的
# `intermediate_source/dist_tuto.rst`）里手写的环形算法直到 2020 年都加错了缓冲区（pytorch/pytorch
# 的 issue #31572，由 pytorch/tutorials 的 pull request #1039 修复），而且它每一步都传递*整个*缓冲区。
# 本章你将看清每一步，追踪一次真实运行，把环形算法与 `dist.all_reduce` 做性能对比，最后亲手实现它。

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab import costs, ring
from ddp_lab.labs import bench_allreduce

dl.setup()
print(torch.__version__)

# %% [markdown] lang="en"
# ## Chunks
#
# With N ranks the flattened tensor is cut into N chunks, as `torch.tensor_split` cuts it:
# the first `numel % N` chunks are one element longer. With fewer elements than ranks some
# chunks are empty; the ring then simply sends nothing for them. Any size works, and no
# padding is needed.

# %% [markdown] lang="zh"
# ## 分块
#
# 有 N 个 rank 时，展平后的张量按 `torch.tensor_split` 的方式切成 N 块：前 `numel % N`
# 块各多一个元素。元素个数少于 rank 数时，有些块是空的，环形算法对这些块什么也不发送。
# 任何大小都可以，不需要填充（padding）。

# %%
for numel in (12, 10, 3):
    print(f"numel={numel:2d}, N=4 -> chunks (start, stop):", ring.chunk_bounds(numel, 4))

# %% [markdown] lang="en"
# ## The schedule
#
# Rank r sends to rank r+1 and receives from rank r-1 (mod N), at every step.
#
# - **Reduce-scatter**, steps s = 0 .. N-2: send chunk r-s, receive chunk r-s-1 and
#   **add** it to your own. A chunk travels around the ring collecting one more rank's
#   contribution at every hop; after N-1 steps rank r owns the complete sum of chunk r+1.
# - **All-gather**, steps s = 0 .. N-2: send chunk r+1-s, receive chunk r-s and **copy**
#   it. The finished chunks travel once more around the ring.
#
# Each rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N·S in total, less than 2S for
# any N. Every rank sends at every step: there is no "master" rank from which the process
# starts. Two descriptions often met in notes and blog posts are wrong: the ring as a relay
# that starts at GPU 0, and "tree all-reduce" for the scheme that gathers everything on one
# GPU (that is a parameter server; a tree all-reduce is something else, see chapter 04).
#
# A false friend: reading lists sometimes give "Reduced ring" as further reading on the
# ring all-reduce. That is a term of ring theory in algebra (a ring with no nonzero
# nilpotent elements) and has nothing to do with the ring all-reduce. For the algorithm, read Patarasuk and Yuan,
# "Bandwidth optimal all-reduce algorithms for clusters of workstations" (2009), and
# NCCL's documentation.

# %% [markdown] lang="zh"
# ## 调度
#
# 每一步，rank r 都向 rank r+1 发送，并从 rank r-1 接收（模 N）。
#
# - **归约散发**，第 s = 0 .. N-2 步：发送第 r-s 块，接收第 r-s-1 块并把它**加**到自己的
#   那一块上。一个块沿环传递，每经过一跳就多累加一个 rank 的数据；N-1 步之后，rank r
#   拥有第 r+1 块的完整和。
# - **全收集**，第 s = 0 .. N-2 步：发送第 r+1-s 块，接收第 r-s 块并**复制**它。
#   完成的块再沿环传一圈。
#
# 每个 rank 共发送 2(N-1) 个大小为 S/N 的块：总计 2(N-1)/N·S，对任何 N 都小于 2S。
# 每一步所有 rank 都在发送：并不存在一个作为起点的“主”rank。教程和博客里常见的两种描述都不对：
# 一是把环形算法说成从 GPU 0 开始的接力；二是把“全部汇总到一块 GPU”的方案称为“树形全归约”，
# 那其实是参数服务器，树形全归约是另一种算法（见第 04 章）。
#
# 一个容易望文生义的名字：有些参考资料把“Reduced ring”（约化环）列为环形全归约的延伸阅读。
# 这是抽象代数里环论的术语（没有非零幂零元的环），与环形全归约毫无关系。关于这个算法，请读 Patarasuk 与 Yuan 的
# “Bandwidth optimal all-reduce algorithms for clusters of workstations”（2009）以及 NCCL 的文档。

# %%
n = 4
for step in range(2 * (n - 1)):
    phase = "reduce-scatter" if step < n - 1 else "all-gather"
    moves = [f"r{r}: send {ring.schedule(r, n, step)[0]}, recv {ring.schedule(r, n, step)[1]}"
             for r in range(n)]
    print(f"step {step} {phase:14s} | " + " | ".join(moves))

# %% [markdown] lang="en"
# ## Step by step
#
# Choose N and move the step slider. Each cell lists the ranks whose data is summed into
# that chunk; darker means more, gold means complete. Red outlines mark the chunks each
# rank sends at the next step. (`ring.simulate` computes the states without running
# anything.)

# %% [markdown] lang="zh"
# ## 一步一步看
#
# 选择 N 并拖动步数滑块。每个格子列出累加进这个块的 rank；颜色越深表示累加得越多，金色表示
# 已经完整。红框标出每个 rank 在下一步要发送的块。（`ring.simulate` 不运行任何进程，直接
# 计算这些状态。）

# %%
ring.ring_widget(4);

# %%
states = ring.simulate(4)
fig, axes = plt.subplots(1, 4, figsize=(20, 4))
for ax, step in zip(axes, (0, 1, 3, 6)):
    ring.draw_state(states, step, ax)
plt.show()

# %% [markdown] lang="en"
# ## A real run, traced
#
# `ring.traced_run` runs `ring.ring_all_reduce` on real ranks, each starting with the value
# 2^r everywhere. A sum of distinct powers of two says exactly which ranks contributed
# (bit r set = rank r is in), so after every step each rank records the first element of
# every chunk and what it sent and received. Decoded, the real run matches the simulation.

# %% [markdown] lang="zh"
# ## 追踪一次真实运行
#
# `ring.traced_run` 在真实的 rank 上运行 `ring.ring_all_reduce`，rank r 的张量初值全为
# 2^r。若干个不同的 2 的幂之和能精确地说明哪些 rank 参与了累加（第 r 位为 1 表示包含
# rank r），因此每一步之后，每个 rank 记录每个块的第一个元素以及它发送和接收了什么。
# 解码之后，真实运行与模拟完全一致。

# %%
traces = dl.spawn(ring.traced_run, args=(4,), nprocs=4, backend="gloo")
for event in traces[0]:
    print({k: v for k, v in event.items()})
print("real run == simulation:", ring.states_from_trace(traces) == ring.simulate(4))

# %%
ring.ring_widget(traces=traces);

# %% [markdown] lang="en"
# The implementation. Note the exchange: the send to the right and the receive from the
# left are never a blocking `send` followed by a `recv`. Around a ring, "everyone sends
# first" means everyone waits for a receiver that never comes: a deadlock on Gloo (you saw
# it in chapter 04, and again below).
#
# It has **two schedules**, picked by `dist.get_backend(group)`:
#
# - **NCCL** (any backend but `gloo`): the send and the receive of a step go out in ONE
#   `batch_isend_irecv`. PyTorch runs every batched p2p op of a GPU on one stream
#   (`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`, `pointToPoint`: a batch uses the
#   device's communicator). A batch holding only a receive would block that stream, and with
#   it this rank's own later send; every rank of the ring would wait in its receive.
# - **Gloo**: one op per batch, and the next step's receive is posted a step early (Gloo's
#   send waits for its receiver, so an early receive saves a round trip per message). This
#   exact schedule is the one that deadlocks on NCCL.
#
# The cell after the source runs the ring on Gloo while `dist.get_backend` is made to answer
# "nccl", and records each batch: the NCCL schedule can be checked without a GPU.
# Segments (below) are pipelined: a segment moves on to the next step as soon as it has
# been reduced.

# %% [markdown] lang="zh"
# 下面是实现代码。注意交换的方式：“向右发送”和“从左接收”从来不是先阻塞地 `send` 再
# `recv`。在环上，“所有人都先发送”意味着所有人都在等待一个永远不会出现的接收者：在 Gloo
# 上会死锁（第 04 章见过，下面还会再看一次）。
#
# 它有**两种调度**，由 `dist.get_backend(group)` 决定：
#
# - **NCCL**（`gloo` 以外的所有后端）：一步中的发送和接收放进**同一个**
#   `batch_isend_irecv`。PyTorch 把同一块 GPU 上所有批量点对点操作放在同一个流上执行
#   （`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp` 的 `pointToPoint`：批量操作使用该设备
#   的通信器）。只含接收的批次会阻塞这个流，也就阻塞了本 rank 之后的发送；环上每个 rank
#   都会卡在自己的接收里。
# - **Gloo**：每个批次只有一个操作，并且提前一步发起下一步的接收（Gloo 的发送会等待接收方，
#   提前接收可以为每条消息省下一次往返）。恰恰是这种调度在 NCCL 上会死锁。
#
# 源码后面的单元在 Gloo 上运行这个环，同时让 `dist.get_backend` 回答“nccl”，并记录每个
# 批次：不用 GPU 也能检查 NCCL 调度。分段（见下文）是流水线化的：一个段一旦归约完成就立即
# 进入下一步。

# %%
dl.show_source(ring.ring_all_reduce)

# %%
def batches_of_ring(rank, backend):
    from unittest import mock

    seen, real = [], dist.batch_isend_irecv

    def record(ops):
        seen.append("+".join("send" if op.op is dist.isend else "recv" for op in ops))
        return real(ops)

    with mock.patch.object(dist, "get_backend", return_value=backend), \
         mock.patch.object(dist, "batch_isend_irecv", record):
        ring.ring_all_reduce(torch.ones(9))
    return seen


for backend in ["gloo", "nccl"]:
    print(f"{backend:>4} schedule, rank 0's batches:",
          dl.spawn(batches_of_ring, args=(backend,), nprocs=3, backend="gloo")[0])


# %%
def ring_blocking_send_first(rank):
    n = dist.get_world_size()
    chunk, incoming = torch.ones(2), torch.empty(2)
    dist.send(chunk, dst=(rank + 1) % n)  # every rank waits here for its right neighbour...
    dist.recv(incoming, src=(rank - 1) % n)  # ...which is itself waiting in send
    return incoming


try:
    dl.spawn(ring_blocking_send_first, nprocs=3, backend="gloo", timeout=4, quiet=True)
except dl.DistributedTimeoutError as err:
    print(err.summary.splitlines()[0])

# %% [markdown] lang="en"
# ## Awkward sizes and every dtype
#
# The ring must give exactly what `dist.all_reduce` gives, for one element on four ranks,
# sizes not divisible by N, integers, half precision and booleans (a `bool` "sum" is a
# logical or, in both).

# %% [markdown] lang="zh"
# ## 特殊的大小与各种数据类型
#
# 对 4 个 rank 上只有 1 个元素的张量、大小不能被 N 整除的张量、整数、半精度和布尔类型，
# 环形算法都必须给出与 `dist.all_reduce` 完全相同的结果（两者对 `bool` 的“求和”都是逻辑或）。

# %%
# %%ddp -n 4
for numel, dtype in [(1, torch.float32), (3, torch.int64), (10, torch.float16), (7, torch.bool)]:
    x = (torch.arange(numel) % (rank + 2)).to(dtype)
    expected = x.clone()
    dist.all_reduce(expected)
    same = torch.equal(ring.ring_all_reduce(x), expected)
    if rank == 0:
        print(f"numel={numel:2d} {str(dtype):14s} same as dist.all_reduce: {same}")

# %% [markdown] lang="en" tags=["lesson"]
# ## The ring on a timeline
#
# The decoded run above says *what* each step moved; a profiler says *when*. With
# `trace="ring.json"`, `dl.spawn` runs the function under `torch.profiler` in every rank and
# merges the ranks' traces into one file on one clock (`ddp_lab/runtime/_trace.py`): every
# Gloo call is an event with its kind, its bytes and its peer. Each rank of a 3-rank ring
# must show 2(N-1) = 4 sends, all to its right neighbour, and 4 receives, all from its left
# one, each of one chunk (a third of the tensor). `dl.timeline` draws the ranks as rows:
# grey is computation (creating the tensor, the additions of the reduce-scatter), coloured
# bars are Gloo's sends and receives, and gaps are time spent in Python or waiting. The
# table below it is per rank; its columns are explained in chapter 07, where overlap
# matters. The same file
# opens in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing`, thread by thread.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 时间线上的环
#
# 上面解码出的运行记录说明了每一步传了*什么*；性能分析器（profiler）则告诉我们*何时*传的。
# 传入 `trace="ring.json"` 后，`dl.spawn` 在每个 rank 里用 `torch.profiler` 运行函数，再把各
# rank 的追踪记录合并成一个文件，放在同一个时钟上（`ddp_lab/runtime/_trace.py`）：每次 Gloo
# 调用都是一个事件，带有它的类型、字节数和对端。3 个 rank 的环上，每个 rank 都应当有
# 2(N-1) = 4 次发送，全部发给右边的邻居，还有 4 次接收，全部来自左边的邻居，每次一个块（张量的
# 三分之一）。`dl.timeline` 把各 rank 画成一行一行：灰色是计算（创建张量、归约散发中的加法），
# 彩色条是 Gloo 的发送和接收，空白是花在 Python 里或等待上的时间。图下的表按 rank 列出时间的去向，各列
# 的含义留到第 07 章讲重叠时再解释。同一个文件也可以在 [Perfetto](https://ui.perfetto.dev) 或
# `chrome://tracing` 中打开，按线程查看。

# %% tags=["lesson"]
import os

from ddp_lab.tools import trace_analysis

trace_dir = str(dl.scratch("ch05"))
ring_trace = os.path.join(trace_dir, "ring.json")


def ring_once(rank):
    ring.ring_all_reduce(torch.ones(3 * 4096))  # 48 KiB: one chunk is 16 KiB


dl.spawn(ring_once, nprocs=3, backend="gloo", trace=ring_trace)
for rank, run in trace_analysis.load(ring_trace).items():
    for kind in ("send", "recv"):
        calls = [c for c in run.calls if c.kind == kind]
        print(f"rank {rank}: {len(calls)} x {kind:4s} peers {sorted({c.peer for c in calls})}"
              f" bytes {sorted({c.bytes for c in calls})}")
dl.timeline(ring_trace);

# %% [markdown] lang="en"
# ## How not to do it: passing the whole buffer
#
# The tutorial's version sends the rank's whole (partially summed) tensor to the right
# N-1 times. The result is right, but every rank sends (N-1)·S bytes instead of
# 2(N-1)/N·S: 2x more on 4 ranks, 4x on 8, and it grows with N. A small teaching version,
# and the bytes both send:

# %% [markdown] lang="zh"
# ## 错误示范：传递整个缓冲区
#
# 教程里的版本把本 rank 整个（部分求和的）张量向右传 N-1 次。结果是对的，但每个 rank
# 发送 (N-1)·S 字节，而不是 2(N-1)/N·S：4 个 rank 时是后者的 2 倍，8 个 rank 时是 4 倍，
# 并且随 N 增长。下面是一个小的教学版本，以及两者发送的字节数：

# %%
def full_buffer_ring(rank, numel):
    n = dist.get_world_size()
    total, travelling, incoming = torch.ones(numel), torch.ones(numel), torch.empty(numel)
    sent = 0
    for _ in range(n - 1):
        ops = [dist.P2POp(dist.isend, travelling, (rank + 1) % n),
               dist.P2POp(dist.irecv, incoming, (rank - 1) % n)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        sent += travelling.numel() * 4
        total += incoming
        travelling = incoming.clone()
    assert torch.all(total == n)
    return sent


numel = 12 * 1024
for n in (2, 4):
    naive = dl.spawn(full_buffer_ring, args=(numel,), nprocs=n, backend="gloo")[0]
    trace = dl.spawn(ring.traced_run, args=(n, numel), nprocs=n, backend="gloo")[0]
    chunked = sum(e["sent_numel"] for e in trace) * 8  # traced_run uses float64
    print(f"N={n}: whole buffer sends {naive / (numel * 4):.2f} S, "
          f"chunked ring {chunked / (numel * 8):.2f} S (model 2(N-1)/N = {2 * (n - 1) / n:.2f})")

# %% [markdown] lang="en"
# ## The segmented (pipelined) ring
#
# For large tensors each chunk is itself cut into **segments** of a few hundred KB to a
# few MB, and the steps are pipelined: while segment k of a step is being reduced,
# segment k+1 is already on the wire, and segment k moves on to the next step as soon as
# it is reduced. The data sent is the same; what changes is that the reduction and the
# memory buffers no longer work on whole chunks. In the cost model, p segments cost p
# times more latency terms and hide all but 1/p of the reduction time: a win for large
# messages only. `ring_all_reduce(t, segment_bytes=...)` does this.

# %% [markdown] lang="zh"
# ## 分段（流水线）环形算法
#
# 对大张量，每个块再切成几百 KB 到几 MB 的**段**（segment），并把各步流水线化：某一步
# 第 k 段正在归约时，第 k+1 段已经在传输，第 k 段一归约完就立刻进入下一步。发送的数据量
# 不变；变化在于归约和内存缓冲区不再以整块为单位。在代价模型中，p 个段使延迟项变为 p 倍，
# 同时把归约时间中除 1/p 以外的部分都隐藏起来：只对大消息有利。
# `ring_all_reduce(t, segment_bytes=...)` 实现了这一点。

# %%
sizes = [2**k for k in range(10, 31, 2)]
alpha, beta, gamma = 20e-6, 1 / 1e9, 1 / 4e9  # 20 us, 1 GB/s link, 4 GB/s reduction
fig, ax = plt.subplots(figsize=(7, 4))
for p in (1, 4, 16):
    ratio = [costs.segmented_ring(4, s, alpha, beta, gamma, p) / costs.ring(4, s, alpha, beta, gamma)
             for s in sizes]
    ax.plot(sizes, ratio, marker=".", label=f"p = {p}")
ax.axhline(1, color="gray", lw=0.8)
ax.set_xscale("log", base=2)
ax.set_xlabel(dl.tr(en="message size (bytes)", zh="消息大小（字节）"))
ax.set_ylabel(dl.tr(en="time / unsegmented ring", zh="时间 / 不分段环形"))
ax.set_title(dl.tr(en="segmented ring, N = 4 (model)", zh="分段环形，N = 4（模型）"))
ax.legend()
plt.show()

# %% [markdown] lang="en"
# ## Measuring it: algbw and busbw
#
# `bench_allreduce` prints the same columns as NVIDIA's `all_reduce_perf` (nccl-tests):
# size, element count, type, time, **algbw** = size / time, and **busbw** = algbw ·
# 2(N-1)/N. busbw is the rate at which each rank's link moves data during a ring
# all-reduce, so it can be compared across N and with the hardware's link bandwidth.
# `#wrong` counts wrong elements. The hand-written ring and `dist.all_reduce` run side by
# side in the same processes, alternating. A small sweep here (the full one takes minutes:
# `python -m ddp_lab.labs.bench_allreduce -n 2 4 -b 1K -e 64M -f 4 -i 9`):

# %% [markdown] lang="zh"
# ## 测量：algbw 与 busbw
#
# `bench_allreduce` 打印的列与 NVIDIA 的 `all_reduce_perf`（nccl-tests）相同：大小、
# 元素个数、类型、时间、**algbw** = 大小 / 时间，以及 **busbw** = algbw · 2(N-1)/N。
# busbw 是环形全归约过程中每个 rank 的链路搬运数据的速率，因此可以在不同 N 之间比较，
# 也可以与硬件链路带宽比较。`#wrong` 统计错误元素个数。手写环形算法和 `dist.all_reduce`
# 在同一组进程里交替运行、并排比较。这里只做一个小规模的扫描（完整扫描需要几分钟：
# `python -m ddp_lab.labs.bench_allreduce -n 2 4 -b 1K -e 64M -f 4 -i 9`）：

# %%
rows = bench_allreduce.run(2, sizes=["4K", "256K", "4M"], iters=3, warmup=1)
bench_allreduce.plot(rows)
plt.show()

# %% [markdown] lang="en"
# ### Measured on the course's reference machine
#
# 2 CPU cores (shared with other jobs), PyTorch 2.13 CPU build, Gloo over loopback TCP,
# float32, median of 9 iterations, measured with
# `python -m ddp_lab.labs.bench_allreduce -n 2 4 -b 1K -e 64M -f 4 -i 9`. busbw in GB/s:
#
# | size | N=2 ring | N=2 `dist.all_reduce` | N=4 ring | N=4 `dist.all_reduce` |
# | ---: | ---: | ---: | ---: | ---: |
# | 1 KiB | 0.000 (3.1 ms) | 0.001 (0.75 ms) | 0.000 (5.5 ms) | 0.000 (7.3 ms) |
# | 16 KiB | 0.015 | 0.023 | 0.004 | 0.004 |
# | 256 KiB | 0.131 | 0.334 | 0.054 | 0.045 |
# | 1 MiB | 0.289 | 0.885 | 0.192 | 0.248 |
# | 4 MiB | 0.803 | 0.971 | 0.498 | 0.520 |
# | 16 MiB | 0.907 | 0.912 | 0.593 | 0.658 |
# | 64 MiB | 1.230 | 1.250 | 0.611 | 0.490 |
#
# From 16 MiB up the hand-written ring reaches about the bus bandwidth of
# `dist.all_reduce`: 0.90 to 1.25 times it in the table (16 and 64 MiB, N = 2 and 4), and
# on a busy machine a single run varies by about 10%. Below 1 MiB it is latency bound: it
# makes 2(N-1) separate exchanges from Python, and Gloo's `send` waits for the receiver each time (chapter 04's deadlock showed
# it), while Gloo's own all-reduce runs entirely in C++.
#
# What limits busbw here is not a link. With Gloo on one machine every byte goes through
# the loopback TCP stack: the CPU copies it from the sender's tensor into the kernel and
# from the kernel into the receiver's tensor, and also adds the chunks, and N processes
# share 2 cores. That is why busbw stays around 1 GB/s, well below the memory copy
# bandwidth that the next cell measures, and why it drops from N = 2 to N = 4 (more
# processes on the same cores). On GPUs, NCCL moves data over NVLink or PCIe with no CPU
# copies, and busbw reaches tens to hundreds of GB/s.

# %% [markdown] lang="zh"
# ### 在课程参考机器上的测量结果
#
# 2 个 CPU 核（与其他任务共享）、PyTorch 2.13 CPU 版、通过回环 TCP 的 Gloo、float32、
# 9 次迭代取中位数，测量命令为
# `python -m ddp_lab.labs.bench_allreduce -n 2 4 -b 1K -e 64M -f 4 -i 9`。busbw 单位为 GB/s：
#
# | 大小 | N=2 环形 | N=2 `dist.all_reduce` | N=4 环形 | N=4 `dist.all_reduce` |
# | ---: | ---: | ---: | ---: | ---: |
# | 1 KiB | 0.000（3.1 毫秒） | 0.001（0.75 毫秒） | 0.000（5.5 毫秒） | 0.000（7.3 毫秒） |
# | 16 KiB | 0.015 | 0.023 | 0.004 | 0.004 |
# | 256 KiB | 0.131 | 0.334 | 0.054 | 0.045 |
# | 1 MiB | 0.289 | 0.885 | 0.192 | 0.248 |
# | 4 MiB | 0.803 | 0.971 | 0.498 | 0.520 |
# | 16 MiB | 0.907 | 0.912 | 0.593 | 0.658 |
# | 64 MiB | 1.230 | 1.250 | 0.611 | 0.490 |
#
# 从 16 MiB 起，手写环形算法的总线带宽与 `dist.all_reduce` 相当：表中（16 MiB 和 64 MiB，
# N = 2 和 4）为后者的 0.90 到 1.25 倍；在繁忙的机器上，单次运行的波动约为 10%。1 MiB 以下它受延迟限制：它在 Python 中
# 进行 2(N-1) 次独立的交换，而且 Gloo 的 `send` 每次都要等待接收方（第 04 章的死锁演示了
# 这一点）；Gloo 自己的全归约则完全在 C++ 中运行。
#
# 这里限制 busbw 的并不是某条链路。在单机上使用 Gloo 时，每个字节都要经过回环 TCP 协议栈：
# CPU 把它从发送方的张量复制到操作系统内核，再从内核复制到接收方的张量，还要做块的加法，而 N 个
# 进程共享 2 个核。因此 busbw 只有 1 GB/s 左右，远低于下一个单元测得的内存复制带宽；从
# N = 2 到 N = 4 时它还会下降（更多进程共享同样的核）。在 GPU 上，NCCL 通过 NVLink 或 PCIe
# 传输数据，不需要 CPU 复制，busbw 可达每秒几十到几百 GB。

# %%
x = torch.ones(64 * 2**20 // 4)
y = torch.empty_like(x)
y.copy_(x)  # touch the pages once, so the timing below sees only the copy
start = time.perf_counter()
for _ in range(5):
    y.copy_(x)
copy_gbs = 5 * 2 * x.numel() * 4 / (time.perf_counter() - start) / 1e9
print(f"memory copy on this machine: {copy_gbs:.1f} GB/s (read + write)")

# %% [markdown] lang="en"
# On GPUs the same ring runs over NCCL with CUDA tensors, where the links are NVLink or
# PCIe. The cell below runs it when there are at least two GPUs and otherwise says why
# it is skipped.

# %% [markdown] lang="zh"
# 在 GPU 上，同样的环形算法通过 NCCL 在 CUDA 张量上运行，链路是 NVLink 或 PCIe。
# 下面的单元在至少有两块 GPU 时运行，否则说明跳过的原因。

# %%
def ring_on_nccl(rank):
    x = torch.arange(1000, device=dl.this_rank_device(), dtype=torch.float32) * (rank + 1)
    expected = x.clone()
    dist.all_reduce(expected)
    return torch.equal(ring.ring_all_reduce(x), expected)


if torch.cuda.device_count() >= 2 and dist.is_nccl_available():
    print("NCCL ring == dist.all_reduce:", dl.spawn(ring_on_nccl, nprocs=2, backend="nccl"))
else:
    print(dl.tr(en="Skipped: this machine has fewer than 2 GPUs, so there is no NCCL ring to run.",
                zh="已跳过：这台机器的 GPU 少于 2 块，无法运行 NCCL 上的环形算法。"))

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise: your own ring all-reduce (5 points)
#
# Write `ring_all_reduce(tensor)`: sum `tensor` over all ranks of the default process
# group **in place** and return it, using only point-to-point operations (`isend`, `irecv`,
# `batch_isend_irecv`, `send`, `recv`). Requirements checked by the graded cell, on 2 to 4
# ranks against `dist.all_reduce`:
#
# - any size: fewer elements than ranks, sizes not divisible by N, a single element;
# - the dtypes `all_reduce` takes (float16/32/64, int32/64);
# - a real ring, turning as in the lesson: each rank sends only to its right neighbour,
#   `(rank + 1) % N` (gloo's own all-reduce, as the grader measures it, runs its ring to
#   the left: the direction is how the two are told apart), and at most 2(N-1) chunks of
#   ⌈numel/N⌉ elements, so passing the whole buffer around fails, and so does skipping the
#   all-gather;
# - no built-in collectives (they are switched off while your function runs);
# - safe on NCCL: every `send`/`recv`/`isend`/`irecv` goes through `batch_isend_irecv`, and
#   the grader replays your batches as NCCL runs them (one stream per GPU): a batch that
#   waits for a partner its peer has not put in its current batch fails, with the reason.
#
# Hints: `tensor.view(-1).tensor_split(N)` gives N chunks that are views into `tensor`;
# follow the schedule above; skip empty chunks on both sides of an exchange.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习：实现你自己的环形全归约（5 分）
#
# 编写 `ring_all_reduce(tensor)`：只用点对点操作（`isend`、`irecv`、`batch_isend_irecv`、
# `send`、`recv`），把 `tensor` 在默认进程组的所有 rank 上**原地**求和并返回它。评分单元会
# 在 2 到 4 个 rank 上与 `dist.all_reduce` 比较，检查以下要求：
#
# - 任意大小：元素个数少于 rank 数、大小不能被 N 整除、只有一个元素；
# - `all_reduce` 支持的数据类型（float16/32/64、int32/64）；
# - 真正的环形，方向与正文一致：每个 rank 只向右边的邻居 `(rank + 1) % N` 发送（评分程序
#   实测 Gloo 自带的全归约走的是向左的环，两者正是靠方向区分的），并且最多发送 2(N-1) 个
#   大小为 ⌈numel/N⌉ 的块，所以传递整个缓冲区会不通过，跳过全收集阶段也不会通过；
# - 不能使用内置的集合通信（你的函数运行期间它们被禁用）；
# - 在 NCCL 上也安全：所有 `send`/`recv`/`isend`/`irecv` 都要通过 `batch_isend_irecv` 发起；
#   评分程序会按 NCCL 的方式（每块 GPU 一个流）重放你的批次：如果某个批次等待的配对操作
#   不在对端当前的批次里，就判为不通过，并说明原因。
#
# 提示：`tensor.view(-1).tensor_split(N)` 给出 N 个指向 `tensor` 内部的视图块；按照上面的
# 调度进行；交换时，两边都要跳过空块。

# %% tags=["exercise"]
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)  # views: writing them writes `tensor`
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send: torch.Tensor, recv: torch.Tensor) -> None:
        # Send right and receive left together: no rank blocks in a send (deadlock-free).
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, right))
        if recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, left))
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()

    for s in range(n - 1):  # reduce-scatter
        target = chunks[(rank - s - 1) % n]
        incoming = torch.empty_like(target)
        exchange(chunks[(rank - s) % n], incoming)
        target += incoming
    for s in range(n - 1):  # all-gather: receive straight into place
        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])
    return tensor
    ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 3
x = torch.arange(7.0) * (rank + 1)
want = torch.arange(7.0) * sum(r + 1 for r in range(world_size))  # (1 + 2 + 3) * arange(7)
print(rank, ring_all_reduce(x).tolist(), dl.compare(x, want))

# %% tags=["grade"] grade_id="05.ring" points=5
dl.grade("05.ring", ring_all_reduce)

# %% [markdown] lang="en"
# ## What next
#
# DDP does not all-reduce one gradient at a time: it packs gradients into **buckets** and
# starts the all-reduce of a bucket while backward is still computing the others
# (**overlap**). That is chapter 07; chapter 06 first shows how `DistributedSampler`
# gives each rank its part of the data.

# %% [markdown] lang="zh"
# ## 接下来
#
# DDP 并不是一次全归约一个梯度：它把梯度装进**桶**（bucket），在反向传播仍在计算其他梯度时
# 就开始对已满的桶做全归约（通信与计算**重叠**）。这是第 07 章的内容；第 06 章先讲
# `DistributedSampler` 怎样把数据分给各个 rank。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`05.concepts`,
# 2 points when all are right).
#
# **1.** In the ring all-reduce on N = 8 ranks, how many chunks does each rank send in all (reduce-scatter plus all-gather)? (a number)
#
# **2.** nccl-tests reports an all-reduce's algbw as 10 GB/s on 4 ranks. What busbw does it report, in GB/s? (a number)
#
# **3.** Instead of a ring, every rank sends its whole buffer around the ring N - 1 times, adding what it receives. Compared with the ring all-reduce, each rank sends:
#
# - (a) about N/2 times as many bytes
# - (b) N times as many bytes
# - (c) half as many bytes
# - (d) the same bytes
#
# **4.** The segmented (pipelined) ring splits each chunk into segments. When does it win over the plain ring?
#
# - (a) for small messages
# - (b) always
# - (c) for large messages only: segments overlap sending and reducing, and each costs another latency
# - (d) never; it only saves memory


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`05.concepts`，全部答对得 2 分）。
#
# **1.** 在 N = 8 个 rank 的环形全归约中，每个 rank 一共发送多少个块（reduce-scatter 加 all-gather）？（填一个数）
#
# **2.** nccl-tests 报告 4 个 rank 上全归约的 algbw 为 10 GB/s。它报告的 busbw 是多少 GB/s？（填一个数）
#
# **3.** 不用环形算法，而是每个 rank 把整个缓冲区沿着环传 N - 1 次，并把收到的加起来。和环形全归约相比，每个 rank 发送的数据量是：
#
# - (a) 约 N/2 倍
# - (b) N 倍
# - (c) 一半
# - (d) 相同
#
# **4.** 分段（流水线）环形算法把每个块再切成若干段。它什么时候比普通环形算法快？
#
# - (a) 小消息
# - (b) 总是
# - (c) 只有大消息：分段让发送和归约重叠，但每段都要多付一次延迟
# - (d) 从不；它只省内存


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 14,  # a number
    2: 15,  # a number
    3: "a",  # a letter
    4: "c",  # a letter
    ### END ANSWERS
}
dl.quiz("05", my_answers)


# %% tags=["grade"] grade_id="05.concepts" points=2
dl.grade("05.concepts", my_answers)
