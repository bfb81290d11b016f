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
#       en: "04 Collective communication"
#       zh: "04 集合通信"
# ---

# %% [markdown] lang="en"
# # 04 Collective communication
#
# Data-parallel training needs only a handful of ways for processes to exchange tensors.
# This chapter shows every one of them at work on several ranks: **point-to-point**
# messages (`send`/`recv`, `isend`/`irecv`) and the **collectives** `broadcast`, `reduce`,
# `all_reduce`, `gather`, `all_gather`, `scatter`, `reduce_scatter`, `all_to_all` and
# `barrier`. Then it asks which **backend** supports what, measures it on your machine,
# and compares five ways to build an all-reduce with a cost model. You finish by writing
# two collectives yourself.

# %% [markdown] lang="zh"
# # 04 集合通信
#
# 数据并行训练只需要少数几种进程间交换张量的方式。本章在多个 rank（进程编号）上逐一演示：
# **点对点通信**（point-to-point：`send`/`recv`、`isend`/`irecv`）以及
# **集合通信**（collective）`broadcast`、`reduce`、`all_reduce`、`gather`、`all_gather`、
# `scatter`、`reduce_scatter`、`all_to_all` 和 `barrier`。接着我们讨论哪个**后端**
# （backend）支持哪些操作，并在你的机器上实际测一遍；然后用代价模型比较实现全归约
# （all-reduce）的五种方法。最后你将亲手实现两个集合通信操作。

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab import collectives, costs

dl.setup()
print(torch.__version__, "| gloo:", dist.is_gloo_available(), "| nccl:", dist.is_nccl_available(),
      "| mpi:", dist.is_mpi_available())

# %% [markdown] lang="en"
# ## Point-to-point: `send` and `recv`
#
# `dist.send(tensor, dst)` sends a tensor to one rank; `dist.recv(tensor, src)` receives
# into a tensor that must already have the right shape and dtype. Both **block**: `send`
# returns when the message has been handed over, `recv` when it has arrived.

# %% [markdown] lang="zh"
# ## 点对点通信：`send` 与 `recv`
#
# `dist.send(tensor, dst)` 把一个张量发给某一个 rank；`dist.recv(tensor, src)` 把收到的
# 数据写入一个事先分配好的张量，它的形状和数据类型必须与发送的张量一致。两者都是**阻塞**的：`send` 在消息交付后才返回，
# `recv` 在数据到达后才返回。

# %%
collectives.draw("send_recv", 2)
plt.show()

# %%
# %%ddp -n 2
x = torch.arange(4.0) if rank == 0 else torch.zeros(4)
if rank == 0:
    dist.send(x, dst=1)
else:
    dist.recv(x, src=0)
print(f"rank {rank}: {x.tolist()}")

# %% [markdown] lang="en"
# ### Ordering matters: a deadlock
#
# Two ranks want to swap tensors. The obvious code has both ranks `send` first and `recv`
# second. With Gloo, `send` waits until the peer has posted the matching `recv`, so both
# ranks wait for each other forever: a **deadlock**. The launcher's **timeout** stops the
# ranks and shows where each one was stuck (here after 5 seconds).

# %% [markdown] lang="zh"
# ### 顺序很重要：死锁
#
# 两个 rank 想交换张量。最直观的写法是两边都先 `send` 再 `recv`。在 Gloo 上，`send`
# 要等对方执行了对应的 `recv` 才会完成，于是两个 rank 永远互相等待：这就是**死锁**
# （deadlock）。启动器的**超时**（timeout）机制会停止这些 rank，并显示每个 rank 卡在哪里
# （这里设为 5 秒）。

# %%
def swap_send_first(rank):
    other = 1 - rank
    mine, theirs = torch.full((3,), float(rank)), torch.empty(3)
    dist.send(mine, dst=other)  # both ranks block here, each waiting for the other's recv
    dist.recv(theirs, src=other)
    return theirs.tolist()


try:
    dl.spawn(swap_send_first, nprocs=2, backend="gloo", timeout=5, quiet=True)
except dl.DistributedTimeoutError as err:
    print(err.summary.splitlines()[0])
    for failure in err.failures:
        stuck = [line.strip() for line in failure.stack.splitlines() if "swap_send_first" in line]
        print(f"rank {failure.rank} was stuck at:", stuck[:1])

# %% [markdown] lang="en"
# Two fixes. **Order by rank**: even ranks send first, odd ranks receive first, so every
# `send` meets a `recv`. Or **post both at once** with the non-blocking `isend`/`irecv`,
# which return a request object, and `wait()` on both. On Gloo (and MPI) both work; the
# next cell runs them.
#
# On NCCL the first fix still works, the second one may not. There `dist.send` does not
# even block the CPU: it queues an NCCL send on a CUDA stream and returns, and the *stream*
# waits. An NCCL send or receive "is blocking for the GPU": the stream does nothing else
# until the peer's matching call runs (NCCL's `ncclSend`/`ncclRecv` reference). A plain
# `send` or `recv` between two ranks goes to one communicator and one stream, whichever
# direction it takes (`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`, `pointToPoint`):
# by default a 2-rank communicator for the pair, whose key `getKeySendRecv(rank, peer)` is
# the same for both ranks and both directions; with a group initialised eagerly
# (`init_process_group(..., device_id=...)`), the device's own communicator. Either way the
# stream runs the calls in the order they were issued.
#
# - Ordered by rank, rank 0's stream holds send, recv and rank 1's holds recv, send: the
#   first calls match, then the second ones. Nothing has to run at the same time, so it
#   completes.
# - Posted as separate `isend` then `irecv` on both ranks, both streams start with a send
#   and wait there for a receive that sits behind the other rank's send: the GPUs hang,
#   although the CPU moved on long ago (`wait()` only waits for the stream).
#
# NCCL's guide says it plainly: calls that must progress at the same time go in one group,
# `ncclGroupStart`/`ncclGroupEnd` (`docs/userguide/source/usage/p2p.rst`).
# `dist.batch_isend_irecv` is that group (`torch/distributed/distributed_c10d.py`), so the
# form that is safe on every backend is the send and the receive in **one**
# `batch_isend_irecv`. The NCCL cases need two GPUs and are not run here; the sources named
# above are what to read.

# %% [markdown] lang="zh"
# 有两种修正方法。**按 rank 排序**：偶数 rank 先发后收，奇数 rank 先收后发，这样每个
# `send` 都能遇到一个 `recv`。或者用非阻塞的 `isend`/`irecv` **同时发起**收和发：
# 它们返回一个请求对象，再对两者调用 `wait()`。在 Gloo（以及 MPI）上两种方法都可行，
# 下一个单元会运行它们。
#
# 在 NCCL 上，第一种方法仍然可行，第二种则可能卡住。NCCL 的 `dist.send` 根本不阻塞 CPU：
# 它只是把一次 NCCL 发送放进 CUDA 流就返回了，真正等待的是*流*。而 NCCL 的发送或接收对
# GPU 是阻塞的：对方执行与之匹配的调用之前，这条流什么也不做（NCCL 文档中 `ncclSend`/
# `ncclRecv` 的说明）。两个 rank 之间单独的 `send` 或 `recv`，不论方向，都走同一个通信器、
# 同一条流（`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp` 的 `pointToPoint`）：默认是
# 这一对 rank 专用的 2-rank 通信器，它的键 `getKeySendRecv(rank, peer)` 对两个 rank、两个方向
# 都相同；进程组若是立即初始化的（`init_process_group(..., device_id=...)`），则用这块设备
# 自己的通信器。无论哪种情况，流都按发起的顺序执行这些调用。
#
# - 按 rank 排序时，rank 0 的流上依次是发、收，rank 1 的流上是收、发：先是两边的第一个调用
#   相互匹配，然后是第二个。没有哪两个调用需要同时进行，所以能顺利完成。
# - 两个 rank 都先 `isend` 再 `irecv`、分开发起时，两条流都以发送开头，各自等待一个接收，
#   而那个接收排在对方的发送后面：GPU 卡死了，CPU 却早已往下执行（`wait()` 只等这条流）。
#
# NCCL 的文档说得很直接：需要同时推进的调用必须放进同一个组，即
# `ncclGroupStart`/`ncclGroupEnd` 之间（`docs/userguide/source/usage/p2p.rst`）。
# `dist.batch_isend_irecv` 就是这个组（`torch/distributed/distributed_c10d.py`），所以在
# 任何后端上都安全的写法，是把发送和接收放进**同一个** `batch_isend_irecv`。NCCL 上的这两种
# 情形需要两块 GPU，这里没有运行；想深入了解，就读上面列出的源码和文档。

# %%
def swap_odd_even(rank):
    other = 1 - rank
    mine, theirs = torch.full((3,), float(rank)), torch.empty(3)
    if rank % 2 == 0:
        dist.send(mine, dst=other)
        dist.recv(theirs, src=other)
    else:
        dist.recv(theirs, src=other)
        dist.send(mine, dst=other)
    return theirs.tolist()


def swap_nonblocking(rank):
    other = 1 - rank
    mine, theirs = torch.full((3,), float(rank)), torch.empty(3)
    send_req = dist.isend(mine, dst=other)
    recv_req = dist.irecv(theirs, src=other)
    recv_req.wait()
    send_req.wait()
    return theirs.tolist()


def swap_batched(rank):
    other = 1 - rank
    mine, theirs = torch.full((3,), float(rank)), torch.empty(3)
    ops = [dist.P2POp(dist.isend, mine, other), dist.P2POp(dist.irecv, theirs, other)]
    for req in dist.batch_isend_irecv(ops):  # one group: the form NCCL needs
        req.wait()
    return theirs.tolist()


print("odd/even:   ", dl.spawn(swap_odd_even, nprocs=2, backend="gloo"))
print("isend/irecv:", dl.spawn(swap_nonblocking, nprocs=2, backend="gloo"))
print("batched:    ", dl.spawn(swap_batched, nprocs=2, backend="gloo"))

# %% [markdown] lang="en"
# ## The collectives, one picture each
#
# A collective is called by **every** rank of the **process group**, with matching
# arguments. In each picture, rank r starts with the numbers 10(r+1), 10(r+1)+1, ...
# (colour = the rank the value came from; gold = a sum over ranks; grey "?" = left
# unspecified by PyTorch). The pictures are computed by `collectives.model`, and the
# tests of `ddp_lab` check that model against the real operations. After each picture,
# a cell runs the real call on 4 ranks.
#
# Two slips often met in tutorials and blog posts. "All-reduce is a kind of all-gather" is
# wrong: all-gather *concatenates* (every rank ends with N pieces, N times the data), all-reduce
# *combines* (every rank ends with one tensor of the input's size); an all-reduce can be
# *built* from a reduce-scatter followed by an all-gather (chapter 05). And "`MPI_Allreduce`
# takes a root" is wrong too: it has no `root` argument (`sendbuf, recvbuf, count, datatype, op, comm` in the MPI standard):
# every rank gets the result, so there is no root, here as in `dist.all_reduce`.
#
# **Broadcast** copies the root's tensor to every rank.

# %% [markdown] lang="zh"
# ## 集合通信：每种一张图
#
# 集合通信必须由**进程组**里的**每一个** rank 以相互匹配的参数调用。每张图中，rank r
# 一开始持有 10(r+1)、10(r+1)+1、……（颜色表示数值来自哪个 rank；金色表示多个 rank
# 的和；灰色“?”表示 PyTorch 不保证其内容）。这些图由 `collectives.model` 计算，
# `ddp_lab` 的测试会用真实的操作来验证这个模型。每张图后面都有一个单元在 4 个 rank 上
# 执行真正的调用。
#
# 先纠正教程和博客里常见的两个小错误。“全归约是一种全收集”是错的：全收集（all-gather）是*拼接*（每个 rank 最后
# 得到 N 块，数据量是输入的 N 倍），全归约是*合并*（每个 rank 最后得到一个与输入同样大小的
# 张量）；全归约可以*由*归约散发（reduce-scatter）加全收集*组成*（第 05 章）。“`MPI_Allreduce` 需要指定根”
# 也不对。它没有 `root` 参数（MPI 标准中的参数是 `sendbuf, recvbuf, count, datatype, op, comm`），每个 rank 都得到
# 结果，所以没有根 rank，`dist.all_reduce` 也一样。
#
# **广播**（broadcast）把根 rank 的张量复制到所有 rank。

# %%
collectives.draw("broadcast", 4)
plt.show()

# %%
# %%ddp -n 4
x = torch.arange(4.0) + 10 * (rank + 1)
dist.broadcast(x, src=0)
print(x.tolist())

# %% [markdown] lang="en"
# **Reduce** combines (by default sums) every rank's tensor into the root's tensor. The
# other ranks' tensors may hold partial results afterwards: do not use them.

# %% [markdown] lang="zh"
# **归约**（reduce）把所有 rank 的张量合并（默认求和）到根 rank 的张量中。之后其他 rank
# 的张量里可能是中间结果，不要使用它们。

# %%
collectives.draw("reduce", 4)
plt.show()

# %%
# %%ddp -n 4
x = torch.arange(4.0) + 10 * (rank + 1)
dist.reduce(x, dst=0)
print(x.tolist(), "<- the sum" if rank == 0 else "<- unspecified")

# %% [markdown] lang="en"
# **All-reduce** leaves the combined tensor on every rank: it is the operation at the
# heart of data-parallel training (every rank ends with the sum of all gradients). The
# `op` argument chooses the combination; this PyTorch's Gloo also accepts `AVG`.

# %% [markdown] lang="zh"
# **全归约**（all-reduce）让每个 rank 都得到合并后的张量：它是数据并行训练的核心操作
# （每个 rank 最终都得到所有梯度之和）。参数 `op` 选择合并方式；当前版本 PyTorch 的
# Gloo 也支持 `AVG`。

# %%
collectives.draw("all_reduce", 4)
plt.show()

# %%
# %%ddp -n 4
for op in ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]:
    x = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
    if rank == 0:
        print(f"{op:8s}", x.tolist())

# %% [markdown] lang="en"
# **Gather** collects one tensor from every rank into a list on the root;
# **all-gather** gives that list to every rank.

# %% [markdown] lang="zh"
# **收集**（gather）把每个 rank 的一个张量收集到根 rank 的列表里；**全收集**
# （all-gather）让每个 rank 都得到这个列表。

# %%
fig, axes = plt.subplots(2, 2, figsize=(10, 6))
collectives.draw("gather", 4, axes=axes[0])
collectives.draw("all_gather", 4, axes=axes[1])
plt.show()

# %%
# %%ddp -n 4
x = torch.tensor([10.0 * (rank + 1)])
out = [torch.zeros(1) for _ in range(world_size)] if rank == 0 else None
dist.gather(x, out, dst=0)
everyone = [torch.zeros(1) for _ in range(world_size)]
dist.all_gather(everyone, x)
print("gather:", None if out is None else [t.item() for t in out],
      "| all_gather:", [t.item() for t in everyone])

# %% [markdown] lang="en"
# **Scatter** is the reverse of gather: the root hands piece i of a list to rank i.
# **Reduce-scatter** sums piece i over all ranks and leaves the result on rank i: it is
# the first half of the ring all-reduce of chapter 05.

# %% [markdown] lang="zh"
# **散发**（scatter）是收集的逆操作：根 rank 把列表中的第 i 块交给 rank i。
# **归约散发**（reduce-scatter）把所有 rank 的第 i 块求和，结果留在 rank i 上：它正是
# 第 05 章环形全归约的前半部分。

# %%
fig, axes = plt.subplots(2, 2, figsize=(10, 6))
collectives.draw("scatter", 4, axes=axes[0])
collectives.draw("reduce_scatter", 4, axes=axes[1])
plt.show()

# %%
# %%ddp -n 4
pieces = list((torch.arange(4.0) + 10 * (rank + 1)).chunk(world_size))
mine = torch.zeros(1)
dist.scatter(mine, pieces if rank == 0 else None, src=0)
summed = torch.zeros(1)
dist.reduce_scatter(summed, pieces)
print("scatter:", mine.item(), "| reduce_scatter:", summed.item())

# %% [markdown] lang="en"
# **All-to-all** sends piece i of every rank to rank i: a transpose of the data across
# ranks (used to reshuffle activations in expert and sequence parallelism).
# **Barrier** moves no data; every rank waits until all ranks have reached it.

# %% [markdown] lang="zh"
# **全交换**（all-to-all）把每个 rank 的第 i 块发给 rank i：相当于跨 rank 的数据转置
# （专家并行和序列并行里用它重新分配激活值）。**屏障**（barrier）不传输数据；每个 rank
# 都要等到所有 rank 都到达这里才继续。

# %%
fig, axes = plt.subplots(2, 2, figsize=(10, 6))
collectives.draw("all_to_all", 4, axes=axes[0])
collectives.draw("barrier", 4, axes=axes[1])
plt.show()
gloo_all_to_all = dl.doctor.has("gloo all_to_all")  # torch >= 2.13; older: one line says so

# %%
# %%ddp -n 4
pieces = list((torch.arange(4.0) + 10 * (rank + 1)).chunk(world_size))
received = [torch.zeros(1) for _ in range(world_size)]
if gloo_all_to_all:
    dist.all_to_all(received, pieces)
time.sleep(0.2 * rank)  # rank 3 arrives last...
start = time.perf_counter()
dist.barrier()
waited = time.perf_counter() - start  # ...so rank 0 waits longest at the barrier
got = [t.item() for t in received] if gloo_all_to_all else "skipped"
print("all_to_all:", got, f"| waited {waited:.2f} s at the barrier")

# %% [markdown] lang="en"
# ### Your turn: collectives on ranks that stay
#
# Each `%%ddp` cell above started 4 fresh ranks and forgot them at the end. To look at the
# data before and after a collective, keep the ranks: `dl.start(4)` starts 4 persistent
# ranks with the process group ready, `%%ranks` runs a cell on them (variables stay from
# one cell to the next), `%%ranks -r 2` runs it on rank 2 only, and `dl.pull("x")` brings
# every rank's `x` back into the notebook, in rank order. Change the cells and run them
# again: nothing has to be set up twice.

# %% [markdown] lang="zh"
# ### 动手试试：在常驻的 rank 上做集合通信
#
# 上面每个 `%%ddp` 单元都启动 4 个新的 rank，运行结束就把它们丢掉了。想看集合通信前后的数据，
# 就让 rank 留下来：`dl.start(4)` 启动 4 个常驻 rank 并准备好进程组，`%%ranks` 在它们上运行一个
# 单元（变量从一个单元保留到下一个单元），`%%ranks -r 2` 只在 rank 2 上运行，
# `dl.pull("x")` 把每个 rank 的 `x` 按 rank 顺序取回 notebook。修改这些单元再运行一次：
# 什么都不用重新准备。

# %%
dl.start(4, backend="gloo")

# %%
# %%ranks
x = torch.arange(4.0) + 10 * (rank + 1)

# %%
# %%ranks -r 2
x[:] = 0  # change rank 2's data only

# %%
before = dl.pull("x")
print("before:", [t.tolist() for t in before])

# %%
# %%ranks
dist.all_reduce(x, op=dist.ReduceOp.MAX)

# %%
after = dl.pull("x")
print("after: ", [t.tolist() for t in after])
print("every rank holds the element-wise max of the 'before' tensors:",
      all(torch.equal(t, torch.stack(before).amax(dim=0)) for t in after))
dl.stop()

# %% [markdown] lang="en"
# ### `all_gather` and autograd: the gradient is lost silently
#
# The tensors `dist.all_gather` fills carry no autograd history (`requires_grad=False`),
# even the slot that holds your own tensor. A loss built on them, such as the
# contrastive loss often written that way, which gathers every rank's features, back-propagates
# nothing into this rank's features, and no error says so. Two fixes, both run below:
#
# - put your own tensor back into its slot (`parts[rank] = x`): the gradient flows to
#   your part only, which is the usual fix when DDP averages the gradients afterwards;
# - `torch.distributed.nn.functional.all_gather`, differentiable: its backward is a
#   reduce-scatter with SUM (`torch/distributed/nn/functional.py`, `_AllGather.backward`),
#   so each rank receives the sum over all ranks of the gradients of its slice. torch 2.13
#   marks it deprecated (a FutureWarning pointing to the private
#   `torch.distributed._functional_collectives`).

# %% [markdown] lang="zh"
# ### `all_gather` 与自动求导：梯度被悄悄丢掉
#
# `dist.all_gather` 填充的张量没有自动求导的历史（`requires_grad=False`），连存放你自己张量的
# 那个位置也没有。基于它们构造的损失（loss），例如常见的那种先收集所有 rank 特征再计算的对比损失
# （contrastive loss），不会把任何梯度传回本 rank 的特征，而且没有任何报错。有两种修正办法，
# 下面都会运行：
#
# - 把你自己的张量放回它的位置（`parts[rank] = x`）：梯度只流向你自己的那一份；之后由 DDP
#   对梯度求平均时，这是常用的修正；
# - 使用可微的 `torch.distributed.nn.functional.all_gather`：它的反向传播是一次求和（SUM）的
#   归约散发（见 `torch/distributed/nn/functional.py` 的 `_AllGather.backward`），
#   所以每个 rank 得到的是所有 rank 对它那一份的梯度之和。torch 2.13 把它标记为弃用（给出
#   FutureWarning，指向私有模块 `torch.distributed._functional_collectives`）。

# %%
def gather_with_grad(rank):
    import warnings

    import torch.distributed.nn.functional as dfn

    x = torch.full((2,), float(rank + 1), requires_grad=True)
    parts = [torch.empty(2) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    rows = [f"plain all_gather: requires_grad {[p.requires_grad for p in parts]}"]
    parts[rank] = x  # fix 1: your own slot keeps its history
    torch.cat(parts).pow(2).sum().backward()
    rows.append(f"own slot put back: x.grad {x.grad.tolist()}")
    x.grad = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gathered = dfn.all_gather(x)  # fix 2: differentiable
    torch.cat(gathered).pow(2).sum().backward()
    rows.append(f"dist.nn.functional.all_gather: x.grad {x.grad.tolist()} (summed over ranks)")
    rows += [f"warning: {w.category.__name__}: {w.message}" for w in caught[:1]]
    return rows


for rank, rows in enumerate(dl.spawn(gather_with_grad, nprocs=2, backend="gloo")):
    print(f"rank {rank}:", *rows, sep="\n  ")

# %% [markdown] lang="en"
# ### Tensor forms and `async_op`
#
# The list forms above take one tensor per rank. Every collective that moves pieces also has
# a form on one flat tensor, which avoids the list and is what FSDP and DDP use:
# `all_gather_single` (output N times the input), `reduce_scatter_single` (input N times the
# output) and `all_to_all_single`. In torch 2.13 the older names `all_gather_into_tensor` and
# `reduce_scatter_tensor` still work but warn that they are deprecated
# (`torch/distributed/distributed_c10d.py`, the `@deprecated` decorators on both).
#
# Every collective also takes `async_op=True`: it returns a `Work` at once, and `wait()`
# waits for it. What "done" means depends on the backend. On Gloo (CPU), `wait()` returns
# when the data is there. On NCCL, `wait()` only makes the *current CUDA stream* wait for
# NCCL's stream: the CPU goes on before the data has arrived, and only work queued later on
# that stream (the next kernel, or the copy `print` makes) sees the result
# (`WorkNCCL::wait` and `WorkNCCL::synchronize` in
# `torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`; the CPU blocks only with
# `TORCH_NCCL_BLOCKING_WAIT=1`, a timeout passed to `wait`, or for `barrier`, whose work
# synchronizes the current stream with the host). To time an NCCL collective,
# call `torch.cuda.synchronize()` after it. (No GPU here: the NCCL behaviour is from the
# source, not run.)

# %% [markdown] lang="zh"
# ### 张量形式与 `async_op`
#
# 上面的列表形式为每个 rank 准备一个张量。每个需要切块的集合通信还有一种在单个扁平张量上的形式，
# 省去了列表，FSDP 和 DDP 用的就是它：`all_gather_single`（输出是输入的 N 倍）、
# `reduce_scatter_single`（输入是输出的 N 倍）以及 `all_to_all_single`。在 torch 2.13 中，
# 旧名字 `all_gather_into_tensor` 和 `reduce_scatter_tensor` 仍然可用，但会警告已弃用
# （`torch/distributed/distributed_c10d.py` 中这两个函数上的 `@deprecated` 装饰器）。
#
# 每个集合通信都接受 `async_op=True`：立即返回一个 `Work`，`wait()` 等待它完成。“完成”的含义
# 取决于后端。在 Gloo（CPU）上，`wait()` 返回时数据已经到位。在 NCCL 上，`wait()` 只是让*当前
# CUDA 流*等待 NCCL 的流：数据还没到，CPU 就继续往下走了；只有之后排进这条流的工作才能看到结果，例如下
# 一个核函数（kernel），或 `print` 引起的拷贝
# （`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp` 中的 `WorkNCCL::wait` 和
# `WorkNCCL::synchronize`；只有设置 `TORCH_NCCL_BLOCKING_WAIT=1`、给 `wait` 传入超时，或者是
# `barrier`（它的 work 会让主机等当前流完成）时，CPU 才会阻塞）。要给 NCCL 集合
# 通信计时，之后要调用 `torch.cuda.synchronize()`。（这里没有 GPU：NCCL 的行为依据源码，没有运行。）

# %%
def tensor_forms(rank):
    import warnings

    n, x = dist.get_world_size(), torch.full((2,), float(rank + 1))
    rows = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.empty(2 * n)
        dist.all_gather_single(out, x)
        rows.append(f"all_gather_single     {out.tolist()}")
        dist.all_gather_into_tensor(out, x)  # the old name: same result, a FutureWarning
        piece = torch.empty(1)
        dist.reduce_scatter_single(piece, torch.arange(2.0) + rank)
        rows.append(f"reduce_scatter_single {piece.tolist()}")
        dist.reduce_scatter_tensor(piece, torch.arange(2.0) + rank)  # old name, warns
        swapped = torch.empty(2)
        dist.all_to_all_single(swapped, torch.arange(2.0) + 10 * rank)
        rows.append(f"all_to_all_single     {swapped.tolist()}")
    rows += sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    work = dist.all_reduce(x, async_op=True)  # returns at once
    rows.append(f"async_op=True -> {type(work).__name__}; wait() -> {work.wait()}, {x.tolist()}")
    return rows


if dl.doctor.has("dist.all_gather_single"):  # torch >= 2.13; older: one line says so
    for rank, rows in enumerate(dl.spawn(tensor_forms, nprocs=2, backend="gloo")):
        print(f"rank {rank}:", *rows, sep="\n  ")

# %% [markdown] lang="en"
# ## Which backend supports what
#
# A support table from an old release of the PyTorch documentation is still copied into
# tutorials and blog posts. Rather than trust any table, ask your own installation: `collectives.probe`
# runs every operation above on 2 ranks and compares the result with the model.

# %% [markdown] lang="zh"
# ## 哪个后端支持哪些操作
#
# 不少教程和博客还在转抄旧版 PyTorch 文档里的支持表。与其相信哪张表，不如在你自己的环境里
# 实测一遍：
# `collectives.probe` 在 2 个 rank 上运行上面的每一个操作，并把结果与模型比较。

# %%
probed = collectives.probe("gloo", "cpu")
for op, result in probed.items():
    print(f"gloo/cpu  {op:15s} {result}")
if torch.cuda.device_count() >= 2 and dist.is_nccl_available():
    for op, result in collectives.probe("nccl", "cuda").items():
        print(f"nccl/cuda {op:15s} {result}")
else:
    print(dl.tr(en="No 2 GPUs here: nccl cannot be probed; the documented table follows.",
                zh="这里没有 2 块 GPU，无法实测 nccl；下面给出文档中的表。"))

# %% [markdown] lang="en"
# The documented table of PyTorch 2.x for all three backends (`?` for MPI on GPU: it
# depends on whether your MPI was built with CUDA support), and the cells where that old
# table is out of date. Gloo on CPU now has `reduce_scatter` and `all_to_all` (your probe
# just ran them; torch 2.11's gloo still raises "does not support alltoall"), Gloo on GPU gained most collectives, and NCCL has `scatter`. The table in
# `docs/source/distributed.rst` of your release is the one to trust; that file's history on
# GitHub shows when each cell changed. Besides these three, torch 2.13 has `xccl`, the backend for Intel GPUs (`xpu` devices),
# and `ucc` and `fake`; the last lines of the cell list them.

# %% [markdown] lang="zh"
# 下面是 PyTorch 2.x 文档中三个后端的支持表（MPI 在 GPU 上为 `?`：取决于你的 MPI 编译时
# 是否支持 CUDA），以及那张旧表中已经过时的格子。Gloo 在 CPU 上现在支持
# `reduce_scatter` 和 `all_to_all`（你的探测刚刚运行过它们；torch 2.11 的 gloo 仍会报
# “does not support alltoall”），Gloo 在 GPU 上增加了大部分
# 集合通信操作，NCCL 也支持了 `scatter`。可信的是你所用版本的 `docs/source/distributed.rst`；
# 每一格在哪个版本改变，可以在 GitHub 上查看这个文件的历史。除了这三个，torch 2.13 还内置了
# 面向 Intel GPU（`xpu` 设备）的 `xccl`，
# 以及 `ucc` 和 `fake`；单元的最后几行会列出它们。

# %%
columns = list(next(iter(collectives.DOCUMENTED.values())))
print(f"{'':15s}" + "".join(f"{c:>10s}" for c in columns))
for op, row in collectives.DOCUMENTED.items():
    print(f"{op:15s}" + "".join(f"{row[c]:>10s}" for c in columns))
print()
for op, where, notes, docs in collectives.table_differences():
    print(dl.tr(en=f"{op:15s} {where:9s} old table: {notes}  docs now: {docs}",
                zh=f"{op:15s} {where:9s} 旧表：{notes}  现行文档：{docs}"))
print()
print("backends:", dist.Backend.backend_list, "| default per device:",
      dist.Backend.default_device_backend_map)
print("xccl built in this torch:", dist.is_xccl_available())

# %% [markdown] lang="en"
# ## What an all-reduce costs: the alpha-beta-gamma model
#
# A message of m bytes between two ranks takes α + mβ: α is the **latency**, β = 1/B the
# time per byte at **bandwidth** B. Reducing m bytes costs mγ. Each rank has one link and
# can send and receive one message at a time. For an all-reduce of S bytes on N ranks:
#
# | algorithm | time | most bytes one rank sends |
# | --- | --- | --- |
# | reduce + broadcast through one root ("parameter server") | 2(N-1)(α + Sβ) + (N-1)Sγ | (N-1)S (the root) |
# | binomial tree reduce, then broadcast | 2⌈log₂N⌉(α + Sβ) + ⌈log₂N⌉Sγ | ⌈log₂N⌉S |
# | recursive halving (reduce-scatter) + doubling (all-gather) | 2log₂N·α + 2(N-1)/N·Sβ + (N-1)/N·Sγ | 2(N-1)/N·S |
# | butterfly (recursive doubling, whole buffer) | log₂N(α + Sβ + Sγ) | log₂N·S |
# | ring (reduce-scatter + all-gather) | 2(N-1)α + 2(N-1)/N·Sβ + (N-1)/N·Sγ | 2(N-1)/N·S |
#
# Ring and halving-doubling send the least data, 2(N-1)/N·S < 2S whatever N is; the
# ring pays 2(N-1) latencies for it, halving-doubling only 2log₂N. The formulas are for N a
# power of two; for other N the tree and butterfly round log₂N up, and halving-doubling
# first folds the N - p extra ranks (p the largest power of two below N) into partners and
# hands them the result at the end: two extra steps of the whole buffer, not impossible
# (Thakur, Rabenseifner and Gropp 2005; `costs.halving_doubling`, run below).
#
# **How NCCL chooses.** Not by message size alone: for every call NCCL estimates the time of
# each (algorithm, protocol) pair with a latency + size/bandwidth model whose constants come
# from the detected topology, and takes the fastest (`ncclTopoGetAlgoTime` in
# `src/graph/tuning.cc`, the minimum taken in `topoGetAlgoInfo` in `src/enqueue.cc`, NCCL
# v2.30.7-1). The algorithms are Ring, Tree (a *double* binary tree), CollNetDirect,
# CollNetChain (in-network reduction through a network plugin), NVLS and NVLSTree (NVLink
# SHARP, reduction inside the NVSwitch) and PAT (for all-gather and reduce-scatter with one
# GPU per node); the protocols are LL, LL128 and Simple (`ncclAlgoStr`, `ncclProtoStr` in
# `src/init.cc`). Message size enters the model, and so the choice changes with size, but
# so do the number of nodes, the links and the GPU. `NCCL_ALGO`/`NCCL_PROTO` restrict the
# choice and a tuner plugin can override it; `NCCL_DEBUG=INFO` with
# `NCCL_DEBUG_SUBSYS=TUNING` prints it (on a GPU machine; not run here).
#
# **A common mistake.** Tutorials and blog posts often give 2(α + S/B) + NSC for reduce +
# broadcast. That assumes the root receives the N-1 tensors at the same time at full
# bandwidth. With one
# link it receives them one after another: the root alone moves (N-1)S bytes in and
# (N-1)S bytes out. The cell below counts the bytes that really pass through the root.
# (The "recursive halving and doubling" formula often given with it,
# 2log₂N(α + S/B + SC), is close to the binomial tree's, but counts the reduction twice: the tree reduces on the way up only,
# log₂N·Sγ, and the broadcast down reduces nothing. Real halving-doubling sends halves,
# quarters, ... of the buffer.)

# %% [markdown] lang="zh"
# ## 一次全归约的代价：alpha-beta-gamma 模型
#
# 两个 rank 之间一条 m 字节的消息耗时 α + mβ：α 是**延迟**（latency），β = 1/B 是
# **带宽**（bandwidth）为 B 时每字节的时间。归约 m 字节耗时 mγ。每个 rank 只有一条链路，
# 同一时刻能发送一条、接收一条消息。对 N 个 rank 上 S 字节的全归约：
#
# | 算法 | 时间 | 单个 rank 最多发送的字节数 |
# | --- | --- | --- |
# | 经由一个根 rank 的归约 + 广播（“参数服务器”） | 2(N-1)(α + Sβ) + (N-1)Sγ | (N-1)S（根 rank） |
# | 二项树归约，再广播 | 2⌈log₂N⌉(α + Sβ) + ⌈log₂N⌉Sγ | ⌈log₂N⌉S |
# | 递归减半（归约散发）+ 递归加倍（全收集） | 2log₂N·α + 2(N-1)/N·Sβ + (N-1)/N·Sγ | 2(N-1)/N·S |
# | 蝶形（butterfly，递归加倍，交换整个缓冲区） | log₂N(α + Sβ + Sγ) | log₂N·S |
# | 环形（归约散发 + 全收集） | 2(N-1)α + 2(N-1)/N·Sβ + (N-1)/N·Sγ | 2(N-1)/N·S |
#
# 环形和递归减半/加倍发送的数据最少，无论 N 多大都是 2(N-1)/N·S < 2S；环形为此付出
# 2(N-1) 次延迟，递归减半/加倍只需 2log₂N 次。这些公式针对 N 是 2 的幂的情形；其他 N 时，
# 二项树和蝶形把 log₂N 向上取整，递归减半/加倍则先把多出来的 N - p 个 rank（p 是不超过 N 的
# 最大的 2 的幂）合并到各自的伙伴上，最后再把结果交还给它们：代价只是多出两步整块缓冲区的
# 传输，并不是没法做（Thakur、Rabenseifner 与 Gropp，2005；`costs.halving_doubling`，下面会运行）。
#
# **NCCL 怎样选择**。不只看消息大小：每次调用时，NCCL 用“延迟 + 大小/带宽”模型估算每一对
# （算法，协议）的耗时，模型常数来自探测到的拓扑，然后选最快的（NCCL v2.30.7-1 中
# `src/graph/tuning.cc` 的 `ncclTopoGetAlgoTime`，在 `src/enqueue.cc` 的 `topoGetAlgoInfo` 中
# 取最小值）。算法有 Ring、Tree（*双*二叉树）、CollNetDirect、CollNetChain（通过网络插件在
# 网络中归约）、NVLS 和 NVLSTree（NVLink SHARP，在 NVSwitch 内归约）以及 PAT（用于每节点
# 一块 GPU 时的全收集和归约散发）；协议有 LL、LL128 和 Simple（`src/init.cc` 中的
# `ncclAlgoStr`、`ncclProtoStr`）。消息大小是模型的输入，所以选择会随大小变化，但节点数、链路
# 和 GPU 同样会影响它。`NCCL_ALGO`/`NCCL_PROTO` 可以限制选择范围，调优插件（tuner plugin）
# 可以覆盖它；设置 `NCCL_DEBUG=INFO` 和 `NCCL_DEBUG_SUBSYS=TUNING` 会打印出来（需要 GPU 机器；
# 这里没有运行）。
#
# **一个常见的错误**。教程和博客里常把归约 + 广播的耗时写成 2(α + S/B) + NSC。
# 这相当于假设根 rank 能以满带宽同时接收 N-1 个张量。只有一条链路时，它只能一个接一个地
# 接收：仅根 rank 就要收 (N-1)S 字节、发 (N-1)S 字节。下面的单元统计真正经过根 rank
# 的字节数。（常与它一起给出的“递归减半与加倍”公式 2log₂N(α + S/B + SC) 接近二项树的公式，但把归约
# 算了两遍：二项树只在向上归约时计算，即 log₂N·Sγ，向下广播时不做归约。真正的递归减半/加倍
# 每次只发送缓冲区的一半、四分之一……）

# %%
def bytes_through_root(rank, numel):
    """All-reduce as reduce + broadcast through rank 0, counting the bytes rank 0 moves."""
    n = dist.get_world_size()
    x, moved = torch.ones(numel), 0
    if rank == 0:
        incoming = torch.empty(numel)
        for peer in range(1, n):  # one link: one message after another
            dist.recv(incoming, src=peer)
            x += incoming
            moved += incoming.numel() * 4
        for peer in range(1, n):
            dist.send(x, dst=peer)
            moved += x.numel() * 4
    else:
        dist.send(x, dst=0)
        dist.recv(x, src=0)
    return moved


S, alpha, beta, gamma = 2**20, 1e-5, 1e-10, 1e-11
for n in (4, 6, 8):  # 6 is no power of two: two extra steps, still cheaper than 8
    print(f"N={n}: halving-doubling {costs.halving_doubling(n, S, alpha, beta, gamma) * 1e6:.0f} µs"
          f" | binomial tree {costs.binomial_tree(n, S, alpha, beta, gamma) * 1e6:.0f} µs")

size = 1 << 20  # elements (4 MiB of float32)
for n in (2, 3, 4):
    moved = dl.spawn(bytes_through_root, args=(size,), nprocs=n, backend="gloo")[0]
    print(f"N={n}: the root moved {moved / 2**20:.0f} MiB = 2(N-1)S; "
          f"model: {2 * costs.bytes_sent('parameter server', n, size * 4) / 2**20:.0f} MiB; "
          f"the 2(α + S/B) formula assumes 2S = {2 * size * 4 / 2**20:.0f} MiB")

# %% [markdown] lang="en"
# Move the sliders: message size, latency and bandwidth, and the largest N. With small
# messages latency dominates and the log-step algorithms win; with large ones the ring and
# halving-doubling win, and the parameter server grows linearly with N.

# %% [markdown] lang="zh"
# 拖动滑块：消息大小、延迟、带宽以及最大的 N。消息小时延迟占主导，步数为 log 级的算法
# 胜出；消息大时环形和递归减半/加倍胜出，而参数服务器的时间随 N 线性增长。

# %%
costs.cost_widget();

# %% [markdown] lang="en"
# A static view for two cases: 4 KiB and 256 MiB, with 10 µs latency and 10 GB/s.

# %% [markdown] lang="zh"
# 两种情形的静态图：4 KiB 和 256 MiB，延迟 10 微秒，带宽 10 GB/s。

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
costs.plot_curves(axes[0], 64, 4 * 2**10, 10e-6, 10e9)
costs.plot_curves(axes[1], 64, 256 * 2**20, 10e-6, 10e9)
plt.show()

# %% [markdown] lang="en" tags=["lesson"]
# ## Your machine: each collective's time from a trace, next to the model
#
# The model needs α and β, and a measurement to hold it against. Both can come from your
# own machine, no root needed: ranks on one machine talk to each other over loopback.
#
# 1. **Calibrate.** `shaped_links.calibrate` is the lab's ping-pong (further below) between
#    two local ranks: `dist.send`/`dist.recv` at 4 bytes, 64 KiB and 1 MiB, half a round trip
#    per message; `shaped_links.fit` takes α from the 4-byte messages and β as the slope over
#    the larger ones; γ comes from a local `add_`.
# 2. **Trace** `collectives.timed_collectives` (source below) on 2 and then 4 ranks:
#    `all_reduce`, `broadcast`, `all_gather_single` and `reduce_scatter_single` at 4 KiB,
#    256 KiB and 2 MiB per rank, three times each, every call after a barrier and inside a
#    `record_function` range named after it. `dl.spawn(..., trace=...)` writes one trace of
#    all ranks.
# 3. **Read** every call out of the trace: `trace_analysis.collective_times` matches the k-th
#    `all_reduce` of each rank with the k-th of the others and times it from the moment the
#    last rank started it to the moment the last rank finished it (a rank that waited for a
#    late one does not count its wait). `trace_analysis.versus_model` puts the median next to
#    the model of the algorithm Gloo really runs, `costs.gloo_cpu`.
#
# Which algorithm that is, read in the sources (gloo's files from the `pytorch/gloo`
# repository; `ProcessGroupGlooDetail.hpp` comes with torch under
# `torch/include/torch/csrc/distributed/c10d/`):
#
# | call | what Gloo runs on CPU tensors | model (`costs`) |
# | --- | --- | --- |
# | `all_reduce` | `AsyncAllreduceWork` (`ProcessGroupGlooDetail.hpp`) calls `gloo::allreduce` without choosing an algorithm, and `gloo/allreduce.cc` then runs `ring`: reduce-scatter + all-gather around the ring, every chunk cut into segments of at most 1 MiB, at least two per chunk, so that one travels while the other is reduced | `segmented_ring` with p = `gloo_segments(N, S)` segments per chunk: 2(N-1)p·α + 2(N-1)/N·Sβ + (N-1)/N·Sγ/p |
# | `broadcast` | `gloo::broadcast` (`gloo/broadcast.cc`): a binomial tree | `tree_broadcast`: ⌈log₂N⌉(α + Sβ) |
# | `all_gather_single` | `gloo::allgather` (`gloo/allgather.cc`): a ring; each rank's piece travels in two halves, two messages in flight | `ring_all_gather`: 2(N-1)α + (N-1)Sβ (S = one rank's input) |
# | `reduce_scatter_single` | `reduce_scatter_tensor_coalesced` (`torch/csrc/distributed/c10d/ProcessGroupGloo.cpp`): clones the whole input, all-reduces the clone, copies its own chunk out; the trace calls it `gloo:all_reduce` | the all-reduce's model for the whole input: twice the bytes of a ring reduce-scatter, (N-1)/N·S |
#
# The table's columns: **trace ms**, the time above (Gloo's work on its own thread);
# **of it operators ms**, the time Gloo's thread spent in PyTorch operators inside the call on
# the lowest rank (copies between its buffers and your tensors, no communication);
# **Python ms**, `perf_counter` around the call on the slowest rank (the call's dispatch and
# wait included); **model ms** and **trace/model**. The cell runs three launches, two of
# them traced: some seconds, more on a busy machine.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 你的机器：从追踪记录读出每个集合通信的时间，与模型对照
#
# 模型需要 α 和 β，还需要一组实测数据来检验它。这两样都可以在你自己的机器上得到，不需要
# root 权限：同一台机器上的 rank 之间通过回环接口（loopback）通信。
#
# 1. **校准**。`shaped_links.calibrate` 就是后面实验里的乒乓测试，这里在两个本地 rank 之间进行：
#    用 `dist.send`/`dist.recv` 分别传 4 字节、64 KiB 和 1 MiB 的消息，往返时间的一半算作一条消息的
#    时间；`shaped_links.fit` 从 4 字节的消息得到 α，再用更大消息的斜率得到 β；γ 由本地的 `add_` 测得。
# 2. **追踪**。在 2 个、再在 4 个 rank 上运行 `collectives.timed_collectives`（源码见下）：
#    `all_reduce`、`broadcast`、`all_gather_single` 和 `reduce_scatter_single`，每个 rank 的输入分别为
#    4 KiB、256 KiB 和 2 MiB，各做三次；每次调用前都有一个屏障，调用本身放在以它命名的
#    `record_function` 区间里。`dl.spawn(..., trace=...)` 把所有 rank 写进同一份追踪记录。
# 3. **读取**。`trace_analysis.collective_times` 从追踪记录中取出每一次调用：把每个 rank 的第 k 次
#    `all_reduce` 与其他 rank 的第 k 次对应起来，从最后一个 rank 开始这次调用算起，到最后一个 rank
#    完成为止（先到的 rank 等待迟到者的时间不算在内）。`trace_analysis.versus_model` 把中位数和
#    Gloo 实际所用算法的模型 `costs.gloo_cpu` 放在一起。
#
# Gloo 实际用的是哪种算法，要到源码里看（gloo 的文件在 `pytorch/gloo` 仓库中；
# `ProcessGroupGlooDetail.hpp` 随 torch 一起安装，位于 `torch/include/torch/csrc/distributed/c10d/`）：
#
# | 调用 | Gloo 对 CPU 张量实际执行的操作 | 模型（`costs`） |
# | --- | --- | --- |
# | `all_reduce` | `AsyncAllreduceWork`（`ProcessGroupGlooDetail.hpp`）调用 `gloo::allreduce` 时没有指定算法，于是 `gloo/allreduce.cc` 执行 `ring`：沿环做归约散发 + 全收集，每块再切成不超过 1 MiB 的段，每块至少两段，一段在传输时另一段在归约 | `segmented_ring`，每块 p = `gloo_segments(N, S)` 段：2(N-1)p·α + 2(N-1)/N·Sβ + (N-1)/N·Sγ/p |
# | `broadcast` | `gloo::broadcast`（`gloo/broadcast.cc`）：二项树 | `tree_broadcast`：⌈log₂N⌉(α + Sβ) |
# | `all_gather_single` | `gloo::allgather`（`gloo/allgather.cc`）：环形；每个 rank 的那一块分成两半传输，同时有两条消息在途 | `ring_all_gather`：2(N-1)α + (N-1)Sβ（S 为一个 rank 的输入） |
# | `reduce_scatter_single` | `reduce_scatter_tensor_coalesced`（`torch/csrc/distributed/c10d/ProcessGroupGloo.cpp`）：复制整个输入，对副本做全归约，再把属于自己的那一块拷贝出来；追踪记录里它叫 `gloo:all_reduce` | 整个输入做全归约的模型：字节数是环形归约散发（(N-1)/N·S）的两倍 |
#
# 表中各列：**追踪 ms** 是上面定义的时间（Gloo 在它自己的线程上完成的工作）；
# **算子 ms（含于追踪）**：追踪 ms 中的一部分，即编号最小的 rank 上，Gloo 的线程在这次调用内执行 PyTorch 算子的时间（在
# 它自己的缓冲区和你的张量之间拷贝数据，不是通信）；**Python ms** 是最慢的 rank 上用 `perf_counter` 包住整个调用测得的
# 时间（包含调用的分发和等待）；然后是**模型 ms** 和**追踪/模型**。这个单元会启动三轮 rank
# （其中两轮带追踪），要跑好几秒，机器忙时更久。

# %% tags=["lesson"]
import os

from ddp_lab.labs import shaped_links
from ddp_lab.tools import trace_analysis

dl.show_source(collectives.timed_collectives)

# %% tags=["lesson"]
calibrated = dl.spawn(shaped_links.calibrate, args=((4, 64 << 10, 1 << 20),), nprocs=2,
                      backend="gloo")[0]
alpha, beta = shaped_links.fit(calibrated["calibration"])
gamma = calibrated["gamma"]
print(f"α = {alpha * 1e6:.0f} µs, 1/β = {1e-9 / beta:.2f} GB/s, 1/γ = {1e-9 / gamma:.1f} GB/s")

trace_dir = str(dl.scratch("ch04"))
rows = []
for n in (2, 4):
    path = os.path.join(trace_dir, f"collectives_{n}.json")
    seen = dl.spawn(collectives.timed_collectives, args=((4 << 10, 256 << 10, 2 << 20), 3),
                    nprocs=n, backend="gloo", trace=path)
    times = trace_analysis.collective_times(trace_analysis.load(path))
    rows += trace_analysis.versus_model(times, n, alpha, beta, gamma, seen)
print(trace_analysis.format_versus_model(rows))
print(dl.tr(en=f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}",
            zh=f"{os.cpu_count()} 个 CPU 核，平均负载 {os.getloadavg()[0]:.1f}"))

# %% [markdown] lang="en" tags=["lesson"]
# The 4-rank run on one timeline: each call's coloured bar on every rank, the barriers (grey
# bars in the communication row) between them. Zoom in with `start_ms`/`end_ms`, or open the
# file in Perfetto (ui.perfetto.dev) to see, on each rank's main thread, what a
# `reduce_scatter` range holds.

# %% [markdown] lang="zh" tags=["lesson"]
# 4 个 rank 的那次运行画在同一条时间线上：每次调用在每个 rank 上都是一段彩色条，调用之间是
# 屏障（通信那一行里的灰色条）。用 `start_ms`/`end_ms` 放大，或者在 Perfetto（ui.perfetto.dev）
# 中打开这个文件，看看每个 rank 主线程上的 `reduce_scatter` 区间里有什么。

# %% tags=["lesson"]
dl.timeline(os.path.join(trace_dir, "collectives_4.json"));

# %% [markdown] lang="en" tags=["lesson"]
# Where the model does not fit here, and why; each point can be read off the table or the trace:
#
# - **Loopback is no link.** This torch's Gloo has one transport, TCP (`gloo/transport/tcp`),
#   so every byte goes from one process through the kernel to the other: the CPU copies it,
#   and β from the ping-pong is the speed of those copies, not of a wire. The model gives each
#   rank its own link and lets it send and receive at once; here all ranks share the machine's
#   cores, and with 4 ranks on fewer than 4 cores they take turns: compare the N = 4 rows with
#   the N = 2 rows, and run it again with the machine busy or idle.
# - **Copies the model does not count.** The *of it operators* column is time Gloo's thread
#   spent copying, not communicating: `all_gather_single` gathers into a buffer of Gloo's and
#   then copies every piece into your tensor (`AsyncAllgatherWork` in `ProcessGroupGloo.cpp`; in the
#   trace, the `aten::select` and `aten::copy_` under `gloo:all_gather`).
#   `reduce_scatter_single` clones its input and later copies its chunk out on the calling thread,
#   outside Gloo's work: that time is in *Python ms* and not in *trace ms* (in Perfetto: the
#   `aten::clone` inside `c10d::_reduce_scatter_base_` on the main thread).
# - **Small messages.** At 4 KiB the time is nearly all latency, and α is a best case (the
#   fastest 4-byte round trip) while a collective sends 2(N-1)p messages, each of which can wait
#   for a busy core; the ratio there is the least stable from run to run.
# - **Python.** *Python ms* minus *trace ms* is what the call costs around Gloo's work: handing
#   the work to Gloo's thread, waking the caller when it is done, and the copies above.
#
# Two questions for your table. Is `broadcast` at 2 MiB above or below the model? It sends one
# whole-buffer message, while β comes from a ping-pong of `dist.send`/`dist.recv` called from
# Python. And how much of `all_gather`'s gap to the model do its copies explain? If not all, the
# trace of the 4-rank run is where to look next.

# %% [markdown] lang="zh" tags=["lesson"]
# 模型在这里哪些地方不符，原因是什么；每一条都能从表格或追踪记录里读出来：
#
# - **回环接口不是链路**。这个 torch 里的 Gloo 只有一种传输方式：TCP（`gloo/transport/tcp`），
#   所以每个字节都要从一个进程经过内核到达另一个进程，由 CPU 拷贝；乒乓测得的 β 是这些拷贝的
#   速度，而不是某条线路的速度。模型假设每个 rank 有自己的链路，并且能同时收发；这里所有 rank
#   共用机器的 CPU 核，4 个 rank 跑在不到 4 个核上时只能轮流执行：把 N = 4 的行和 N = 2 的行
#   对比一下，再分别在机器繁忙和空闲时各跑一次。
# - **模型没有计入的拷贝**。*其中算子*那一列是 Gloo 的线程在拷贝而不是在通信的时间：
#   `all_gather_single` 先收集到 Gloo 自己的缓冲区，再把每一块拷贝到你的张量里
#   （`ProcessGroupGloo.cpp` 中的 `AsyncAllgatherWork`；追踪记录里 `gloo:all_gather` 下面的
#   `aten::select` 和 `aten::copy_`）。`reduce_scatter_single` 复制输入、事后
#   拷出自己那一块，都是在调用方的线程上、Gloo 的工作之外完成的：这部分时间算在 *Python ms* 里，
#   不在*追踪 ms*里（在 Perfetto 中：主线程上 `c10d::_reduce_scatter_base_` 里面的 `aten::clone`）。
# - **小消息**。4 KiB 时几乎全是延迟，而 α 是最好情况（4 字节往返中最快的一次），一次集合通信
#   却要发 2(N-1)p 条消息，每一条都可能要等一个忙碌的 CPU 核；这里的比值在不同运行之间最不稳定。
# - **Python**。*Python ms* 减去*追踪 ms*，就是 Gloo 的工作之外这次调用的开销：把工作交给 Gloo
#   的线程、完成后唤醒调用方，以及上面提到的拷贝。
#
# 看着你的表格回答两个问题。2 MiB 的 `broadcast` 比模型快还是慢？它只发一条整块缓冲区的消息，
# 而 β 来自从 Python 调用 `dist.send`/`dist.recv` 的乒乓测试。`all_gather` 与模型的差距，有多少
# 能用它的拷贝来解释？如果不能完全解释，下一步就去看 4 个 rank 那次运行的追踪记录。

# %% [markdown] lang="en" tags=["lesson"]
# ## Lab: the model on links with a bandwidth
#
# The formulas above are on paper. Here they meet a network. `hosts.cluster(2, rate_mbit=100)`
# builds two hosts (Linux network namespaces; chapter 09 shows how) whose links carry at most
# 100 Mbit/s each way: `tc` puts a token bucket (the `tbf` qdisc) on each host's interface,
# for what it sends, and on its port of the switch, for what it receives. The next cell shows
# the `tc` commands and why their parameters are what they are. One gloo rank runs on each
# host, and `shaped_links.measure`:
#
# 1. **calibrates**: a ping-pong of `dist.send`/`dist.recv` at four sizes, 4 bytes to
#    256 KiB; half a round trip is one message's time. `shaped_links.fit` takes α from the
#    4-byte messages and β as the least-squares slope over the larger ones (γ, the time to add
#    one byte, comes from a local `add_`);
# 2. **times the same all-reduce three ways**, alternating so that all three see the same load:
#    the ring written by hand in chapter 05 (`ddp_lab.ring`), gloo's own `dist.all_reduce`, and
#    the naive gather to rank 0 + broadcast back. Each time is the median over iterations of
#    the slower rank's time;
# 3. puts each time next to the model with the fitted α, β, γ: the ring's formula for the
#    hand ring, `costs.gloo_cpu` for gloo (the segmented ring of the table above: at least
#    two segments per chunk, so 4α at N = 2 where the plain ring has 2α), the parameter
#    server's for gather + broadcast. With N = 2 the ring
#    and recursive halving-doubling send the same messages (half the buffer each way, then the
#    other half), so halving-doubling has no column of its own. The ratio is measured / model.
#
# Building hosts needs root; where that is not allowed, the cell prints why and shows the
# matching part of a stored real run instead. For real it takes some ten seconds, most of it
# two fresh Python processes importing torch.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 实验：有带宽的链路上的模型
#
# 上面的公式还停留在纸面上，这里让它们面对真实的网络。`hosts.cluster(2, rate_mbit=100)`
# 创建两台主机（Linux 网络命名空间，做法见第 09 章），它们的链路每个方向最多传 100 Mbit/s：
# `tc` 在每台主机的网卡上（管它发出的数据）和交换机上它的端口上（管它收到的数据）各放一个令牌桶
# （token bucket），即 `tbf` 排队规则（qdisc）。下一个单元给出这些 `tc` 命令，并说明参数为什么这样取。每台主机上运行一个
# gloo rank，`shaped_links.measure` 依次：
#
# 1. **校准**：用 `dist.send`/`dist.recv` 在 4 字节到 256 KiB 的四种大小上来回传消息（乒乓），
#    往返时间的一半就是一条消息的时间。`shaped_links.fit` 从 4 字节的消息得到 α，再对更大的消息
#    用最小二乘求出斜率 β（γ，即加一个字节的时间，由本地的 `add_` 测得）；
# 2. **用三种方法给同一个全归约计时**，轮流进行，让三者承受同样的负载：第 05 章亲手写的环形
#    算法（`ddp_lab.ring`）、gloo 自己的 `dist.all_reduce`，以及朴素的“收集到 rank 0 + 广播回去”。
#    每个时间都取较慢那个 rank 的时间在多次迭代上的中位数；
# 3. 把每个时间和用拟合出的 α、β、γ 算出的模型值放在一起：手写环形用环形的公式，gloo 用
#    `costs.gloo_cpu`（即上表中的分段环形：每块至少两段，所以 N = 2 时是 4α，而普通环形是
#    2α），收集 + 广播用参数服务器的公式。N = 2 时，环形和递归减半/加倍发送的消息完全相同（每个方向先发
#    一半缓冲区，再发另一半），所以递归减半/加倍没有单独的一列。比值是实测 / 模型。
#
# 创建主机需要 root 权限；不允许时，单元会说明原因，并改为展示一次真实运行保存下来的对应部分。
# 真正运行大约要十秒，大部分花在两个新的 Python 进程导入 torch 上。

# %% tags=["lesson"]
from ddp_lab.labs import shaped_links
from ddp_lab.cluster import hosts

dl.show_source(hosts.tc_commands)

# %% tags=["lesson"]
run = shaped_links.lab(100, sizes=[1 << 10, 16 << 10, 256 << 10])
print(shaped_links.table(run))

# %% [markdown] lang="en" tags=["lesson"]
# The stored run below is the full sweep, at 10 and 100 Mbit/s and sizes from 4 bytes up,
# made by `python -m ddp_lab.labs.shaped_links record` on the machine named in its first line. Read
# the ratio columns: where is the model close, where not? Candidates for the gaps, each one
# checkable: machine load (α is the fastest of 31 small round trips, the times are medians, and
# these runs share a small machine: run it yourself); the hand ring's Python work per step,
# which gloo does in C++; the token bucket's burst (`burst` above: 3028 bytes at 10 and at
# 100 Mbit/s), which lets a smaller message through at once, faster than the
# model says; and TCP, which after an idle moment starts a message with a small congestion
# window again (`tcp_slow_start_after_idle`, on by default; `Documentation/networking/ip-sysctl.rst`
# in the Linux sources), so a message of a few round trips' worth of data pays more than one α.

# %% [markdown] lang="zh" tags=["lesson"]
# 下面保存的运行是完整的扫描：10 和 100 Mbit/s，消息大小从 4 字节起，由
# `python -m ddp_lab.labs.shaped_links record` 在第一行写明的机器上生成。看比值那几列：模型在哪里
# 准，在哪里不准？差距可能的来源（每一条都可以验证）：机器负载（α 取 31 次小消息往返中最快的
# 一次，而各个时间取的是中位数；这些运行在一台不大的共享机器上完成，你可以自己再跑一次）；手写
# 环形每一步都有 Python 的开销，而 gloo 在 C++ 里完成这些工作；令牌桶的突发量（上面的 `burst`：
# 10 和 100 Mbit/s 时都是 3028 字节），比它小的消息一下子就能通过，比模型
# 预测的快；还有 TCP：连接空闲一会儿之后，下一条消息又从很小的拥塞窗口（congestion window）开始发送
# （`tcp_slow_start_after_idle`，默认开启；见 Linux 源码中的 `Documentation/networking/ip-sysctl.rst`），
# 所以一条需要几个往返才能发完的消息，付出的不止一个 α。

# %% tags=["lesson"]
record = shaped_links.stored()
print(record["date"], "|", record["command"], "|", record["machine"], "| torch", record["torch"])
for stored_run in record["runs"]:
    print()
    print(shaped_links.table(stored_run))

# %% [markdown] lang="en" tags=["lesson"]
# ### Where latency stops mattering
#
# For the ring on 2 ranks the model is 2α + Sβ (+ Sγ/2): a latency term that does not
# depend on the size, and a bandwidth term that grows with it. They are equal at the
# **crossover** S* = 2α/β = 2α·B. Well below S* the time hardly changes with the size (latency
# dominates: sending less data buys nothing, sending fewer messages does); well above it the
# time grows in proportion to the size (bandwidth dominates). At S* itself the time is twice the
# smallest messages' time.
#
# Find it yourself first: in each table above, at which size has the time doubled from the
# smallest size's? Then compare with the cell below, which prints the model's S* and the first
# measured size that takes at least twice as long as 4 bytes, and draws the measurements and
# the model for both bandwidths (dotted lines: the model's S*). B grows tenfold from the first
# run to the second: where does S* go? The faster the link, the larger the messages whose time is
# mostly latency; that is one reason DDP sends gradients in buckets of several MiB rather than
# one by one (chapter 07).

# %% [markdown] lang="zh" tags=["lesson"]
# ### 延迟从哪里开始不再重要
#
# 2 个 rank 上环形算法的模型是 2α + Sβ（+ Sγ/2）：一项是与大小无关的延迟项，一项是随大小增长的
# 带宽项。两者相等的地方就是**交叉点**（crossover）S* = 2α/β = 2α·B。远小于 S* 时，时间几乎不随大小变化
# （延迟占主导：少发数据没有用，少发几条消息才有用）；远大于 S* 时，时间与大小成正比（带宽占主导）。
# 恰好在 S* 处，时间是最小消息时间的两倍。
#
# 先自己找一找：在上面每张表里，消息多大时时间变成了最小消息的两倍？然后对照下面的单元：它打印
# 模型给出的 S*，以及第一个耗时达到 4 字节消息两倍的实测大小，并为两种带宽分别画出实测值和模型（虚线
# 是模型的 S*）。从第一次运行到第二次，B 增大十倍：S* 移到了哪里？链路越快，耗时主要花在延迟上的
# 消息就越大；这也是 DDP 把梯度装进几 MiB 的桶里一起发送、而不是逐个发送的原因之一（第 07 章）。

# %% tags=["lesson"]
for stored_run in record["runs"]:
    for name in shaped_links.ALGORITHMS:
        found = shaped_links.measured_crossover(stored_run, name)
        print(f"{stored_run['rate_mbit']:>6g} Mbit/s {name:17s} model S* = "
              f"{shaped_links.crossover(stored_run, name) / 1024:8.1f} KiB | measured: "
              f"{'-' if found is None else shaped_links.size_label(found)}")
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
shaped_links.plot(record["runs"], "ring", ax=axes[0])
shaped_links.plot(record["runs"], "gather_broadcast", ax=axes[1])
plt.show()

# %% [markdown] lang="en" tags=["lesson"]
# The kernel of the machine that made the stored run has no `netem`, the qdisc that adds a
# delay, so α there is only the software's own latency. Where your kernel has it (Debian's and Ubuntu's usually do),
# `hosts.cluster(2, rate_mbit=100, delay_ms=5)` adds 5 ms to everything each host sends, and
# `shaped_links.measure(100, delay_ms=5)` measures with it: watch S* move. Where it does not,
# the call stops with an error that names netem before anything is built:

# %% [markdown] lang="zh" tags=["lesson"]
# 生成上面那次保存运行的机器，内核里没有 `netem`（用来增加延迟的排队规则），所以那里的 α 只是
# 软件自身的延迟。
# 如果你的内核有它（Debian 和 Ubuntu 的内核通常都有），`hosts.cluster(2, rate_mbit=100, delay_ms=5)`
# 会给每台主机发出的所有数据加上 5 毫秒，`shaped_links.measure(100, delay_ms=5)` 就在这样的
# 链路上测量：看看 S* 怎样移动。如果内核没有 netem，这个调用在创建任何东西之前就会停下，报错中
# 会指明缺的是 netem：

# %% tags=["lesson"]
import subprocess

try:
    with hosts.cluster(2, rate_mbit=100, delay_ms=5) as c:
        print(subprocess.run(["tc", "-n", c[0].netns, "qdisc", "show", "dev", "eth0"],
                             capture_output=True, text=True).stdout)
except hosts.HostsUnavailable as err:  # not root, or no netem in this kernel
    print(type(err).__name__, err)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: all-reduce from reduce + broadcast (3 points)
#
# Write `reduce_broadcast_all_reduce(tensor)`: it must sum `tensor` over all ranks **in
# place** (like `dist.all_reduce(tensor)`) using only `dist.reduce` and `dist.broadcast`,
# and return `tensor`. The graded cell runs it on 2 to 4 ranks with hidden shapes and
# dtypes and compares with `dist.all_reduce`; calling `dist.all_reduce` yourself fails.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：用归约 + 广播实现全归约（3 分）
#
# 编写 `reduce_broadcast_all_reduce(tensor)`：只用 `dist.reduce` 和 `dist.broadcast`，
# **原地**（像 `dist.all_reduce(tensor)` 一样）把 `tensor` 在所有 rank 上求和，并返回
# `tensor`。评分单元会在 2 到 4 个 rank 上、用隐藏的形状和数据类型运行它，并与
# `dist.all_reduce` 比较；如果你自己调用了 `dist.all_reduce`，评分不通过。

# %% tags=["exercise"]
def reduce_broadcast_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    dist.reduce(tensor, dst=0)  # rank 0 now holds the sum...
    dist.broadcast(tensor, src=0)  # ...and hands it to everyone
    return tensor
    ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 3
mine = reduce_broadcast_all_reduce(torch.tensor([rank + 1.0]))
want = torch.tensor([sum(r + 1.0 for r in range(world_size))])  # 1 + 2 + 3 on every rank
print(rank, mine.tolist(), dl.compare(mine, want))

# %% tags=["grade"] grade_id="04.all_reduce" points=3
dl.grade("04.all_reduce", reduce_broadcast_all_reduce)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: all-gather from point-to-point messages (3 points)
#
# Write `send_recv_all_gather(tensor_list, tensor)` with the signature of `dist.all_gather`:
# afterwards `tensor_list[i]` (the tensors already in the list, filled in place) holds rank
# i's `tensor`, on every rank. Use only `send`/`recv`/`isend`/`irecv`. Mind the order of
# your messages (remember the deadlock above), and make it work for any world size.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：用点对点通信实现全收集（3 分）
#
# 编写 `send_recv_all_gather(tensor_list, tensor)`，签名与 `dist.all_gather` 相同：
# 调用结束后，每个 rank 上的 `tensor_list[i]`（列表里原有的张量，原地写入）都是
# rank i 的 `tensor`。只能使用 `send`/`recv`/`isend`/`irecv`。注意消息的顺序（回想上面的
# 死锁），并且要适用于任意 world size。

# %% tags=["exercise"]
def send_recv_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> None:
    ### BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    # Post every send without blocking, then receive from each peer in rank order.
    sends = [dist.isend(tensor, dst=peer) for peer in range(n) if peer != rank]
    for peer in range(n):
        if peer == rank:
            tensor_list[peer].copy_(tensor)
        else:
            dist.recv(tensor_list[peer], src=peer)
    for request in sends:
        request.wait()
    ### END SOLUTION


# %% tags=["exercise"]
# %%ddp -n 3
out = [torch.zeros(2) for _ in range(world_size)]
send_recv_all_gather(out, torch.full((2,), float(rank)))
want = [[float(r)] * 2 for r in range(world_size)]  # rank r's tensor at place r, everywhere
print(rank, [t.tolist() for t in out], dl.compare([t.tolist() for t in out], want))

# %% tags=["grade"] grade_id="04.all_gather" points=3
dl.grade("04.all_gather", send_recv_all_gather)

# %% [markdown] lang="en"
# ## What next
#
# An all-reduce as reduce + broadcast (exercise 1 builds one) sends the whole tensor to one
# root and back: its cost grows with N.
# Chapter 05 builds the ring all-reduce, whose traffic per rank stays below 2S for any N,
# and measures it against `dist.all_reduce`.

# %% [markdown] lang="zh"
# ## 接下来
#
# 用归约 + 广播实现的全归约（练习 1 就要实现一个）把整个张量发到一个根 rank 再发回来：
# 代价随 N 增长。第 05 章将实现环形全归约，无论 N 多大，每个 rank 的通信量都低于 2S，
# 并与 `dist.all_reduce` 做性能对比。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`04.concepts`,
# 2 points when all are right).
#
# **1.** The alpha-beta model of a ring all-reduce: N = 4 ranks, S = 100 MB (10^8 bytes), a bandwidth of 10 GB/s (10^10 bytes/s), latency and reduction time ignored. How many milliseconds does it take? (a number)
#
# **2.** 64 ranks all-reduce a 4 KiB message over links with 10 µs latency and 10 GB/s. Which algorithm is faster?
#
# - (a) they take the same time
# - (b) recursive halving and doubling
# - (c) reduce + broadcast through one root
# - (d) the ring
#
# **3.** On Gloo, rank 0 runs `dist.send(a, 1); dist.recv(b, 1)` and rank 1 runs `dist.send(a, 0); dist.recv(b, 0)`. What happens?
#
# - (a) the tensors are swapped
# - (b) a deadlock: each send waits for a receive the other rank never posts
# - (c) an error at once
# - (d) only rank 0 receives
#
# **4.** A loss uses tensors collected with `dist.all_gather(out, x)`, where `x` requires grad. After `loss.backward()`, what does `x.grad` hold?
#
# - (a) nothing from the gathered tensors: `dist.all_gather` is not differentiable, and no error says so
# - (b) an error is raised in backward
# - (c) the gradient through every rank's use of `x`
# - (d) the gradient of rank 0 only


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`04.concepts`，全部答对得 2 分）。
#
# **1.** 环形全归约的 alpha-beta 模型：N = 4 个 rank，S = 100 MB（10^8 字节），带宽 10 GB/s（10^10 字节/秒），忽略延迟和归约计算时间。需要多少毫秒？（填一个数）
#
# **2.** 64 个 rank 对一条 4 KiB 的消息做全归约，链路延迟 10 µs、带宽 10 GB/s。哪种算法更快？
#
# - (a) 两者耗时相同
# - (b) 递归减半加倍（halving-doubling）
# - (c) 经过一个根节点的 reduce + broadcast
# - (d) 环形算法
#
# **3.** 在 Gloo 上，rank 0 执行 `dist.send(a, 1); dist.recv(b, 1)`，rank 1 执行 `dist.send(a, 0); dist.recv(b, 0)`。会发生什么？
#
# - (a) 两个张量互换成功
# - (b) 死锁：每个 send 都在等对方永远不会发出的 recv
# - (c) 立即报错
# - (d) 只有 rank 0 收到
#
# **4.** 损失用到了通过 `dist.all_gather(out, x)` 收集的张量，其中 `x` 需要梯度。`loss.backward()` 之后，`x.grad` 里是什么？
#
# - (a) 没有来自收集张量的梯度：`dist.all_gather` 不可微，而且没有任何报错
# - (b) 反向传播时报错
# - (c) 经过所有 rank 对 `x` 的使用传回来的梯度
# - (d) 只有 rank 0 的梯度


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 15,  # a number
    2: "b",  # a letter
    3: "b",  # a letter
    4: "a",  # a letter
    ### END ANSWERS
}
dl.quiz("04", my_answers)


# %% tags=["grade"] grade_id="04.concepts" points=2
dl.grade("04.concepts", my_answers)
