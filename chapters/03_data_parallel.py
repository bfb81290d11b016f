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
#       en: "03 DataParallel from the inside"
#       zh: "03 从内部看 DataParallel"
# ---

# %% [markdown] lang="en"
# # 03 DataParallel from the inside
#
# `nn.DataParallel` (DP) is **data parallel** training in one process: every forward it
# **scatters** the batch over the GPUs, **replicates** the model onto each of them, runs the
# **replicas** in parallel threads and **gathers** the outputs on GPU 0. In this chapter
# you run each of these steps yourself, check that the result equals the single-device
# model, measure where the time and the memory go, and build the "balanced" variant.
#
# You need no GPU: `ddp_lab.parallel` holds teaching versions of `torch.nn.parallel`
# with the same names, signatures and autograd rules, where "device `i`" is a label on a
# copied CPU tensor.

# %% [markdown] lang="zh"
# # 03 从内部看 DataParallel
#
# `nn.DataParallel`（DP）在**一个进程**里完成**数据并行**（data parallel）训练：每次前向传播，
# 它都把一批数据**切分分发**（scatter）到各块 GPU，把模型**复制**（replicate）到每块 GPU 上，
# 在多个线程里并行运行这些**副本**（replica），最后把输出**收集**（gather）到 GPU 0。本章你会亲手
# 执行每一步，验证结果与单设备模型完全一致，测量时间和显存都花在了哪里，并实现“均衡”版本。
#
# 你不需要 GPU：`ddp_lab.parallel` 是 `torch.nn.parallel` 的教学版本，名字、签名和自动求导规则
# 都与 PyTorch 相同，只不过“设备 `i`”是贴在一份 CPU 张量拷贝上的标签。

# %%
import copy
import threading
import time
import unicodedata
import warnings

import torch
from torch import nn

import ddp_lab as dl
import ddp_lab.parallel as P
from ddp_lab.parallel import viz

dl.setup()
torch.manual_seed(0)
N_GPUS = torch.cuda.device_count()
print("torch", torch.__version__, "| GPUs:", N_GPUS)

# %% [markdown] lang="en"
# ## Why you cannot watch the real one on a CPU
#
# PyTorch's primitives need CUDA tensors, and `nn.DataParallel` without GPUs has an empty
# `device_ids` and simply calls the module. The next cell shows both on this machine.

# %% [markdown] lang="zh"
# ## 为什么在 CPU 上看不到真正的 DataParallel
#
# PyTorch 自己的 `scatter`、`replicate` 和 `gather` 都要求 CUDA 张量；没有 GPU 时，
# `nn.DataParallel` 的 `device_ids` 是空列表，它只是直接调用模型。下一个单元在本机上展示这两点。

# %%
import torch.nn.parallel as tp

for name, call in [("scatter", lambda: tp.scatter(torch.ones(4), [0, 1])),
                   ("replicate", lambda: tp.replicate(nn.Linear(2, 2), [0, 1])),
                   ("gather", lambda: tp.gather([torch.ones(2), torch.ones(2)], 0))]:
    try:
        call()
        print(f"torch.nn.parallel.{name}: ran (this machine has GPUs)")
    except Exception as err:  # noqa: BLE001  # we show whatever torch raises
        print(f"torch.nn.parallel.{name}: {type(err).__name__}: {err}")
print("nn.DataParallel(...).device_ids =", nn.DataParallel(nn.Linear(2, 2)).device_ids)

# %% [markdown] lang="en"
# ## The four steps
#
# Here is the `forward` of our mini `DataParallel`. Compare it with
# `torch/nn/parallel/data_parallel.py`: the same calls in the same order. Only the
# `phase(...)` blocks are new; they time each step for the timeline later.

# %% [markdown] lang="zh"
# ## 四个步骤
#
# 下面是我们的迷你 `DataParallel` 的 `forward`。把它和 `torch/nn/parallel/data_parallel.py`
# 对照着读：调用的函数一样，顺序也一样。新增的只有 `phase(...)` 块，它们记下每一步的耗时，
# 供后面画时间线。

# %%
dl.show_source(P.DataParallel.forward)

# %% [markdown] lang="en"
# ### Step 1: scatter
#
# `scatter` cuts every tensor along `dim` with `torch.chunk`, which rounds the chunk size
# **up**: 10 rows on 4 devices give 3, 3, 3, 1, and 6 rows on 4 devices give only
# **three** chunks, so device 3 gets no replica at all. Non-tensors are passed by reference
# to every device; tuples, lists and dicts are walked; keyword arguments are scattered the
# same way (`scatter_kwargs`).

# %% [markdown] lang="zh"
# ### 第 1 步：切分分发（`scatter`）
#
# `scatter` 用 `torch.chunk` 沿 `dim` 切开每个张量，而 `torch.chunk` 把每块的大小**向上取整**：
# 10 行分给 4 个设备得到 3、3、3、1；6 行分给 4 个设备只得到**三块**，于是设备 3 根本没有副本。
# 非张量参数按引用原样传给每个设备；tuple、list 和 dict 会逐层展开；关键字参数也按同样的方式
# 切分（`scatter_kwargs`）。

# %%
devices = [0, 1, 2, 3]
for rows in (10, 6, 3):
    chunks = P.scatter(torch.arange(rows), devices)
    print(f"{rows:2d} rows ->", [c.tolist() for c in chunks],
          "on devices", [P.get_device(c) for c in chunks])

inputs, kwargs = P.scatter_kwargs((torch.arange(4.0), "relu"), {"mask": torch.ones(4, 2)},
                                  [0, 1])
for i in range(2):
    print(f"device {i}: args={inputs[i]}, mask shape={tuple(kwargs[i]['mask'].shape)}")

# %% [markdown] lang="en"
# ### Step 2: replicate
#
# `replicate` copies the parameters with the `Broadcast` autograd function. The replica on
# device 0 *shares storage* with your model; the others are copies. A replica's
# "parameters" are not leaves any more: they have a `grad_fn`, and that is how backward
# finds its way back to your model's parameters.

# %% [markdown] lang="zh"
# ### 第 2 步：复制模型（`replicate`）
#
# `replicate` 用自动求导函数 `Broadcast` 把参数**广播**（broadcast）到各个设备。设备 0 上的副本
# 与你的模型**共享存储**，其他副本则是拷贝。副本里的“参数”已经不是叶子张量了：它们带有
# `grad_fn`，反向传播正是顺着它找回你的模型参数。

# %%
model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
r0, r1 = P.replicate(model, [0, 1])
w = model[0].weight
print("replica 0 shares storage:", r0[0].weight.data_ptr() == w.data_ptr())
print("replica 1 shares storage:", r1[0].weight.data_ptr() == w.data_ptr(),
      "| lives on device", P.get_device(r1[0].weight))
print("replica weight is a leaf:", r1[0].weight.is_leaf, "| grad_fn:", r1[0].weight.grad_fn)
print("parameters() of a replica:", list(r1.parameters()))

# %% [markdown] lang="en"
# ### Step 3: parallel_apply
#
# `parallel_apply` starts one Python **thread** per replica (DP uses threads; DDP uses one
# **process** per GPU, as the next chapters show; the common claim that both use threads
# is wrong for DDP). The model below prints what each replica sees.

# %% [markdown] lang="zh"
# ### 第 3 步：并行执行（`parallel_apply`）
#
# `parallel_apply` 为每个副本启动一个 Python **线程**。DP 用线程，DDP 则是每块 GPU 一个**进程**
# （后面几章会看到）；常见的“两者都用线程”的说法，对 DDP 来说是错的。下面的模型会打印每个副本
# 看到了什么。

# %%
class Talker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        print(f"  in {threading.current_thread().name} on device {P.current_device()}: "
              f"input {tuple(x.shape)} -> output {tuple(out.shape)}")
        return out


out = P.DataParallel(Talker(), device_ids=[0, 1, 2])(torch.randn(6, 8))
print("outside: output", tuple(out.shape), "on device", P.get_device(out))

# %% [markdown] lang="en"
# When a replica raises, `parallel_apply` re-raises the same exception type in your thread,
# with the replica's index, device and original traceback in the message.

# %% [markdown] lang="zh"
# 某个副本抛出异常时，`parallel_apply` 会在你的线程里重新抛出同一类型的异常，消息里写明
# 副本编号、设备和原来的 traceback。

# %%
class FailsOnSmallChunks(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) < 3:
            raise ValueError(f"chunk of {len(x)} rows is too small")
        return x


try:
    P.DataParallel(FailsOnSmallChunks(), device_ids=[0, 1, 2, 3])(torch.randn(10, 2))
except ValueError as err:
    print(str(err).splitlines()[0], "...", str(err).splitlines()[-1])

# %% [markdown] lang="en"
# ### Step 4: gather, and what backward sends back
#
# `gather` concatenates the outputs on device 0. Backward runs the steps in reverse:
# `Gather`'s backward **scatters the gradient of the output** (a common description, "the
# main GPU scatters the loss to the other GPUs", gets this wrong: it is this gradient, not
# the loss), each
# replica runs its own backward, and `Broadcast`'s backward **sums the replicas' parameter
# gradients** onto device 0 (`ReduceAddCoalesced`). The picture comes from a traced step of
# a model with 500 outputs: every arrow is a copy that really happened, with its size.

# %% [markdown] lang="zh"
# ### 第 4 步：收集（`gather`），以及反向传播送回了什么
#
# `gather` 把各个输出拼接到设备 0 上。反向传播按相反的顺序执行：`Gather` 的反向把**输出的梯度
# 切分分发**到各个设备；每个副本各自做反向传播；`Broadcast` 的反向把各副本的**参数梯度求和**到
# 设备 0（`ReduceAddCoalesced`）。常见的说法是“主 GPU 把损失（loss）分发给其余 GPU”，其实
# 分发的是输出的梯度，而不是损失。下图是一个有 500 个输出的模型的一次训练步：每个箭头都是
# 真实发生过的一次拷贝，旁边标着它的大小。

# %%
wide = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 500))
x, y = torch.randn(48, 16), torch.randint(0, 500, (48,))
step_trace = viz.traced_step(P.DataParallel(wide, [0, 1, 2]), x, y,
                             nn.functional.cross_entropy)
fig = viz.plot_transfers(step_trace, 3)

# %% [markdown] lang="en"
# ## Check: mini-DP computes what one device computes
#
# A small CNN on the scikit-learn digits (8×8 images). We compare the outputs and every
# parameter gradient of the single-device model with those of mini-DP on 3 devices,
# including an uneven batch (50 rows: chunks 17, 17, 16), in float64.

# %% [markdown] lang="zh"
# ## 验证：迷你 DP 算出的结果与单设备相同
#
# 模型是 scikit-learn 手写数字数据集（8×8 的图像）上的一个小 CNN。我们在 float64 下比较单设备
# 模型与 3 个设备上的迷你 DP 的输出和每个参数的梯度，其中包括不能均分的批（50 行，分成
# 17、17、16）。

# %%
from sklearn.datasets import load_digits

digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float64).unsqueeze(1) / 16
labels = torch.tensor(digits.target)


def make_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 10)).double()


def outputs_and_grads(model: nn.Module, net: nn.Module, xb: torch.Tensor, yb: torch.Tensor):
    model.zero_grad()
    out = net(xb)
    nn.functional.cross_entropy(out, yb).backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


cnn = make_cnn()
for batch in (48, 50):
    xb, yb = images[:batch], labels[:batch]
    ref_out, ref_grads = outputs_and_grads(cnn, cnn, xb, yb)
    dp_out, dp_grads = outputs_and_grads(cnn, P.DataParallel(cnn, [0, 1, 2]), xb, yb)
    grad_diff = max((a - b).abs().max().item() for a, b in zip(ref_grads, dp_grads))
    print(f"batch {batch}: max |output diff| = {(ref_out - dp_out).abs().max().item():.1e}, "
          f"max |grad diff| = {grad_diff:.1e}")

# %% [markdown] lang="en"
# And five SGD steps with mini-DP end at the same parameters as five steps on one device.
# The optimizer is built from the model's parameters as usual: it is not wrapped.

# %% [markdown] lang="zh"
# 再各用 SGD 训练五步：迷你 DP 与单设备最后得到的参数相同。优化器照常用模型的参数创建，
# 不需要包装。

# %%
single, wrapped = make_cnn(), P.DataParallel(make_cnn(), [0, 1, 2])
opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (single, wrapped)]
for step in range(5):
    xb, yb = images[step * 64:(step + 1) * 64], labels[step * 64:(step + 1) * 64]
    losses = []
    for net, opt in zip((single, wrapped), opts):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"step {step}: loss one device {losses[0]:.6f} | mini-DP {losses[1]:.6f}")
print("max |param diff| after 5 steps:",
      max((a - b).abs().max().item()
          for a, b in zip(single.parameters(), wrapped.module.parameters())))

# %% [markdown] lang="en"
# ## BatchNorm under DataParallel
#
# A model with **buffers** behaves differently. In training mode each replica normalises
# its chunk with *that chunk's* mean and variance, so the output is not the full-batch
# BatchNorm. And the running statistics: only the replica on device 0 shares its buffers
# with your model, so after the step `running_mean` holds **device 0's chunk only**; the
# other replicas' updates are thrown away with the replicas. In eval mode the running
# stats are used and DP matches one device again. (DDP has the same per-chunk
# normalisation; `SyncBatchNorm` fixes it, chapter 07 section 6.)

# %% [markdown] lang="zh"
# ## DataParallel 下的 BatchNorm
#
# 带**缓冲区**（buffer）的模型就不一样了。训练模式下，每个副本用*自己那一块*数据的均值和方差
# 做归一化，所以输出并不等于在整批上做 BatchNorm。再看运行统计量（running statistics）：只有
# 设备 0 上的副本与你的模型共享缓冲区，所以这一步之后，`running_mean` 里**只有设备 0 那一块**的
# 统计；其他副本的更新随副本一起被丢掉了。评估（eval）模式下用的是运行统计量，DP 又与单设备一致。
# （DDP 同样是按块归一化，第 07 章第 6 节用 `SyncBatchNorm` 解决这个问题。）

# %%
torch.manual_seed(1)
bn = nn.BatchNorm1d(4).double()
xb = torch.randn(12, 4, dtype=torch.float64) * 2 + 3
fresh = copy.deepcopy(bn)
out_dp = P.DataParallel(bn, [0, 1, 2])(xb)
out_full = copy.deepcopy(fresh)(xb)
out_chunks = torch.cat([copy.deepcopy(fresh)(c) for c in xb.chunk(3)])
print("train: equals full-batch BN:", torch.allclose(out_dp, out_full),
      "| equals per-chunk BN:", torch.allclose(out_dp, out_chunks))
only_chunk0 = copy.deepcopy(fresh)
only_chunk0(xb[:4])
whole = copy.deepcopy(fresh)
whole(xb)
print("running_mean after DP      :", bn.running_mean.numpy().round(3))
print("... from chunk 0 alone     :", only_chunk0.running_mean.numpy().round(3))
print("... from the whole batch   :", whole.running_mean.numpy().round(3))
bn.eval()
whole.load_state_dict(bn.state_dict())
whole.eval()
print("eval: equals one device:", torch.allclose(P.DataParallel(bn, [0, 1, 2])(xb), whole(xb)))

# %% [markdown] lang="en"
# ## Returning per-device losses
#
# To save memory on device 0 (next sections) models often compute the loss *inside*
# `forward`. Each replica then returns a scalar, `gather` turns the scalars into a vector
# with one loss per device (with a warning), and you call `loss.mean()`. That mean
# weights every **chunk** equally: with uneven chunks it is not the batch mean. This is
# the "slight difference" blog posts report between a Hugging Face model's loss under
# DataParallel and the loss computed by hand; it is not noise. Weight by the chunk sizes, or make the chunks equal.

# %% [markdown] lang="zh"
# ## 每个设备各返回一个损失
#
# 为了节省设备 0 的显存（见后面几节），模型常常在 `forward` 里直接算出损失。这时每个副本返回
# 一个标量，`gather` 把这些标量拼成一个向量，每个设备一个损失（同时给出警告），你再调用
# `loss.mean()`。这个平均对每一**块**同等加权：块大小不等时，它不等于整批的平均损失。有些
# 博客发现，DataParallel 下 Hugging Face 模型返回的损失与手工计算的结果有“细微差异”，原因就在
# 这里，并不是噪声。解决办法是按块大小
# 加权，或者让各块一样大。

# %%
class WithLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_cnn()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(x), y)


with_loss = WithLoss()
xb, yb = images[:10], labels[:10]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "all input tensors were scalars": expected here
    per_device = P.DataParallel(with_loss, [0, 1, 2, 3])(xb, yb)
sizes = P.default_chunk_sizes(10, 4)
print("chunk sizes:", sizes, "| per-device losses:", per_device.detach().numpy().round(4))
print(f"loss.mean()          = {per_device.mean().item():.6f}")
weighted = (per_device * torch.tensor(sizes, dtype=per_device.dtype)).sum() / 10
print(f"weighted by sizes    = {weighted.item():.6f}")
print(f"loss of whole batch  = {with_loss(xb, yb).item():.6f}")

# %% [markdown] lang="en"
# ## Where the time goes, and why DDP is faster
#
# A traced training step of the CNN on 3 devices (after one warm-up step). Every step
# pays for `replicate` again (the replicas are thrown away after `forward`), starts new
# threads, and runs the loss and the optimizer on device 0 alone.

# %% [markdown] lang="zh"
# ## 时间花在哪里，以及为什么 DDP 更快
#
# 下面记录 CNN 在 3 个设备上的一次训练步（之前先预热一步）。每一步都要重新 `replicate`
# （`forward` 结束后副本就被丢掉了）、重新启动线程，而损失和优化器只在设备 0 上运行。

# %%
def pad(text, width):
    """Left-justify to ``width`` terminal columns: a Chinese character takes two."""
    return text + " " * (width - sum(1 + (unicodedata.east_asian_width(c) in "WF") for c in text))


dp_cnn = P.DataParallel(make_cnn(), [0, 1, 2])
xb, yb = images[:256], labels[:256]
viz.traced_step(dp_cnn, xb, yb, nn.functional.cross_entropy)  # warm-up
step_trace = viz.traced_step(dp_cnn, xb, yb, nn.functional.cross_entropy)
for row, name, start, dur in viz.timeline_data(step_trace):
    print(dl.tr(en=f"{pad(row, 12)} {name:10s} starts {start:7.2f} ms, takes {dur:6.2f} ms",
                zh=f"{pad(row, 12)} {name:10s} 开始于 {start:7.2f} ms，耗时 {dur:6.2f} ms"))
fig = viz.plot_timeline(step_trace)

# %% [markdown] lang="en"
# The threads share one interpreter, so Python code in `forward` runs one thread at a
# time (the GIL); only time inside torch kernels can overlap. A forward made of many small
# operations shows it: more "devices" do not make it faster here. DDP avoids all of this:
# it replicates once at construction, runs one process per GPU (one interpreter each),
# keeps outputs and loss on each GPU, and overlaps the gradient all-reduce with backward.
# (Without GPUs all simulated devices share the same few CPU cores, so these timings show
# the overheads, not GPU speed-ups.)

# %% [markdown] lang="zh"
# 这些线程共用一个解释器，`forward` 里的 Python 代码同一时刻只能有一个线程在执行（GIL）；
# 只有花在 torch 算子内部的时间才能重叠。一个由许多小运算组成的 `forward` 就能说明这一点：
# 在这里，“设备”越多并不会越快。DDP 避开了所有这些开销：只在构造时复制一次模型，每块 GPU
# 一个进程（各有各的解释器），输出和损失都留在各自的 GPU 上，并让梯度的全归约（all-reduce）
# 与反向传播重叠（overlap）。（没有 GPU 时，所有模拟设备都挤在同几个 CPU 核上，所以这些
# 时间反映的是额外开销，而不是 GPU 带来的加速。）

# %%
class ManySmallOps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(300):  # Python-bound: each op is tiny
            x = x * self.w + 0.001
        return x


def median_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


small = ManySmallOps()
xs = torch.randn(64, 8)
with torch.no_grad():
    base = median_ms(lambda: small(xs))
    for n in (1, 2, 4):
        t_n = median_ms(lambda: P.DataParallel(small, list(range(n)))(xs))
        print(f"{n} device(s): {t_n:6.1f} ms per forward (one device, no DP: {base:.1f} ms)")

# %% [markdown] lang="en"
# ## Why device 0 needs more memory
#
# Device 0 holds what every device holds for its own chunk, plus the gathered output of
# the **whole** batch and its gradient, the tensors the loss saves for the whole batch,
# and the summed gradients. The bars count these bytes in a traced step of a small
# segmentation-style CNN (8 class scores per pixel, so the output is large), split evenly
# over 4 devices.

# %% [markdown] lang="zh"
# ## 为什么设备 0 需要更多显存
#
# 每个设备都要为自己那一块数据保存一些张量；设备 0 除此之外，还要保存收集来的**整批**输出及其
# 梯度、损失函数为整批数据保存的张量，以及求和后的梯度。下面的柱状图统计了一次训练步中这些
# 张量的字节数。模型是一个小的分割式 CNN（每个像素 8 个类别分数，所以输出很大），数据均分给
# 4 个设备。

# %%
class Segmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        scores = self.net(x)
        # with labels, return this replica's loss instead of its (large) scores
        return scores if y is None else nn.functional.cross_entropy(scores, y)


seg = Segmenter()
xs_img, ys_img = torch.randn(32, 3, 16, 16), torch.randint(0, 8, (32, 16, 16))


def memory_kib(dp_model, loss_fn) -> dict:
    step = viz.traced_step(dp_model, xs_img, ys_img, loss_fn)
    return viz.memory_by_device(step, seg, 4)


even_mem = memory_kib(P.DataParallel(seg, [0, 1, 2, 3]), nn.functional.cross_entropy)
for d, kinds in even_mem.items():
    print(f"device {d}: {sum(kinds.values()) / 1024:5.0f} KiB")
fig = viz.plot_memory(even_mem, dl.tr("even split, loss on device 0", "均分，损失在设备 0 上计算"))

# %% [markdown] lang="en"
# ## A balanced DataParallel
#
# The fix widely copied in blog posts (`BalancedDataParallel`, from the
# `kimiyoung/transformer-xl` repository): give device 0 a smaller chunk (`gpu0_bsz`) and
# spread the rest over the other devices. Our rule: if the default split already gives device 0 at
# most `gpu0_bsz` rows, keep it; otherwise device 0 gets exactly `gpu0_bsz` and the others
# share the rest, the lower-numbered devices taking one extra row each for the remainder.
# `gpu0_bsz=0` leaves device 0 out of the computation (it still gathers).

# %% [markdown] lang="zh"
# ## 均衡的 DataParallel
#
# 博客里广为转抄的办法（`BalancedDataParallel`，出自 `kimiyoung/transformer-xl` 仓库）：给设备 0
# 一个更小的块（`gpu0_bsz`），其余数据分给其他设备。我们的规则是：
# 如果默认切分给设备 0 的行数已经不超过 `gpu0_bsz`，就保持默认切分；否则设备 0 恰好分到
# `gpu0_bsz` 行，其余设备平分剩下的行，除不尽的余数由编号较小的设备各多分一行。`gpu0_bsz=0`
# 时设备 0 不参与计算（但仍负责收集）。

# %%
dl.show_source(P.balanced_chunk_sizes)

# %% [markdown] lang="en"
# Below, three set-ups side by side: the even split, the balanced split with
# `gpu0_bsz=2`, and the even split with the loss computed *inside* each replica (the
# per-device losses above). Balancing only moves the chunk-sized part;
# the whole-batch output and loss stay on device 0. Computing the loss in the replicas
# removes them: device 0 then gathers 4 numbers.

# %% [markdown] lang="zh"
# 下面并排比较三种做法：均分；`gpu0_bsz=2` 的均衡切分；均分，但在每个副本*内部*计算损失
# （即前面“每个设备各返回一个损失”一节的做法）。均衡切分只能挪走随块大小变化的那部分；整批的
# 输出和损失仍然留在设备 0 上。在副本内部计算损失，才能把这两样去掉：设备 0 只需收集 4 个数。

# %%
print("balanced chunk sizes:", P.balanced_chunk_sizes(32, 4, 2))
bal_mem = memory_kib(P.BalancedDataParallel(2, seg, [0, 1, 2, 3]), nn.functional.cross_entropy)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # per-device scalar losses: expected
    inside_mem = memory_kib(P.DataParallel(seg, [0, 1, 2, 3]), None)
for d in range(4):
    print(f"device {d}: even {sum(even_mem[d].values()) / 1024:5.0f} KiB | "
          f"balanced {sum(bal_mem[d].values()) / 1024:5.0f} KiB | "
          f"loss inside {sum(inside_mem[d].values()) / 1024:5.0f} KiB")
fig = viz.plot_memory(bal_mem, dl.tr("balanced, gpu0_bsz=2", "均衡，gpu0_bsz=2"))
fig = viz.plot_memory(inside_mem, dl.tr("even, loss inside the replicas", "均分，损失在副本内计算"))

# %% [markdown] lang="en"
# ### What `gpu0_bsz=0` also turns off
#
# Only the replica on device 0 shares its parameters and buffers with your model; every
# other replica is a copy that is thrown away after the forward. torch says so in the
# warning of `nn.DataParallel`'s docstring (`torch/nn/parallel/data_parallel.py`):
# "updates to the running module in `forward` will be lost" (a counter stays at its
# initial value), and only **in-place** updates to device 0's parameters and buffers are
# recorded, which is how BatchNorm's running statistics survive. So with `gpu0_bsz=0`
# device 0 runs no replica and BatchNorm's `running_mean`, `running_var` and
# `num_batches_tracked` **never change**: at evaluation time the model normalises with its
# initial statistics (mean 0, variance 1). The cell runs it with the package's
# `BalancedDataParallel` on 3 simulated devices, with a model that also counts its calls
# and records the rows it saw in `forward`: attributes set in `forward` are set on the
# replicas and lost in every case.
#
# Dropout is no exception to "each replica on its own device": on GPUs each replica's
# dropout mask comes from **its device's** random generator, so seeding for a
# reproducible DP run needs `torch.cuda.manual_seed_all` (or `torch.manual_seed`, which
# seeds every device), and the masks are not those of a one-device run with the same seed.
# (Not run here: it needs 2 GPUs. The simulated devices share the one CPU generator.)

# %% [markdown] lang="zh"
# ### `gpu0_bsz=0` 还会关掉什么
#
# 只有设备 0 上的副本与你的模型共享参数和缓冲区；其他副本都是拷贝，前向传播结束后就被丢掉。
# torch 在 `nn.DataParallel` 文档字符串的警告里写明了这一点（`torch/nn/parallel/data_parallel.py`）：
# “在 `forward` 中对模块的更新会丢失”（计数器会一直停在初始值），只有对设备 0 上的参数和
# 缓冲区的**原地**（in-place）更新才会保留下来，BatchNorm 的运行统计量正是靠这一点更新的。所以
# `gpu0_bsz=0` 时，设备 0 上不运行任何副本，BatchNorm 的 `running_mean`、`running_var` 和
# `num_batches_tracked` **始终不变**：评估时，模型仍然用初始统计量（均值 0、方差 1）做归一化。
# 下面的单元用本包的 `BalancedDataParallel` 在 3 个模拟设备上运行；模型还会统计自己被调用的
# 次数，并在 `forward` 里记下看到的行数：在 `forward` 里设置的属性都落在副本上，无论哪种切分
# 都会丢失。
#
# dropout 也一样，每个副本都在自己的设备上运行：在 GPU 上，每个副本的 dropout 掩码来自**它所在
# 设备**的随机数生成器。所以要让 DP 的结果可复现，需要用 `torch.cuda.manual_seed_all` 设定种子
# （`torch.manual_seed` 也可以，它会给所有设备设定种子）；而且即使种子相同，这些掩码也与单设备
# 运行时的不同。（这里不运行这个例子：它需要 2 块 GPU，而模拟设备共用同一个 CPU 随机数生成器。）

# %%
class CountingBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4).double()
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # state set in forward: on the replica
        self.rows_seen = x.shape[0]
        return self.bn(x)


rows = torch.randn(12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2 + 3
for gpu0 in (4, 2, 0):
    m = CountingBN()
    P.BalancedDataParallel(gpu0, m, [0, 1, 2])(rows)
    print(f"gpu0_bsz={gpu0}: rows {P.balanced_chunk_sizes(len(rows), 3, gpu0)} | "
          f"running_mean {m.bn.running_mean.numpy().round(3)} | "
          f"num_batches_tracked {int(m.bn.num_batches_tracked)} | calls {m.calls} | "
          f"rows_seen {getattr(m, 'rows_seen', 'never set')}")
one = CountingBN()
one(rows[:2])
print("one device, device 0's 2 rows: running_mean", one.bn.running_mean.numpy().round(3), "| calls", one.calls)

# %% [markdown] lang="en"
# ### Two mistakes in the copied `BalancedDataParallel`
#
# 1. Its rule falls back to the default split whenever `gpu0_bsz` is not *smaller than the
#    other devices' share*. With 10 rows, 4 devices and `gpu0_bsz=2` the others' share is
#    (10 - 2) // 3 = 2, so it falls back to `torch.chunk`, which gives device 0 **three**
#    rows: more than the cap it was asked to respect. Compare device 0's *default* share
#    instead (below, its rule re-implemented).
# 2. It passes `chunk_sizes` to its own `scatter_kwargs`; copied next to
#    `torch.nn.parallel.scatter_kwargs` instead, the call fails, because torch's function
#    has no such parameter.

# %% [markdown] lang="zh"
# ### 转抄的 `BalancedDataParallel` 里的两个错误
#
# 1. 只要 `gpu0_bsz` 不*小于其他设备的份额*，它就退回默认切分。10 行、4 个设备、`gpu0_bsz=2`
#    时，其他设备的份额是 (10 - 2) // 3 = 2，于是退回 `torch.chunk`，结果设备 0 分到了**三**行，
#    超过了它本该遵守的上限。应当比较的是设备 0 在*默认切分*下的份额（下面重新实现了它的
#    规则，以便对照）。
# 2. 它把 `chunk_sizes` 传给自己定义的 `scatter_kwargs`；如果转抄时换成了
#    `torch.nn.parallel.scatter_kwargs`，调用就会直接失败，因为 torch 的这个函数没有这个参数。

# %%
import inspect


def copied_rule(batch: int, n: int, gpu0: int) -> list[int]:
    unit = (batch - gpu0) // (n - 1)
    if gpu0 >= unit:  # BalancedDataParallel's test
        return P.default_chunk_sizes(batch, n)
    sizes = [gpu0] + [unit] * (n - 1)
    for i in range(batch - sum(sizes)):
        sizes[i + 1] += 1
    return sizes


for case in [(52, 3, 16), (53, 3, 16), (10, 4, 2)]:
    print(case, "copied:", copied_rule(*case), "| fixed:", P.balanced_chunk_sizes(*case))
from torch.nn.parallel.scatter_gather import scatter_kwargs

print("torch scatter_kwargs", inspect.signature(scatter_kwargs))
try:
    scatter_kwargs((torch.ones(10, 2),), {}, [0, 1], [4, 6], dim=0)
except TypeError as err:
    print("TypeError:", err)

# %% tags=["lesson"]
# Move the sliders: the default split (torch.chunk) vs the balanced one; the dotted line is
# gpu0_bsz.
viz.chunk_sizes_widget()

# %% [markdown] lang="en"
# ## `.module`, saving and loading
#
# The wrapper keeps your model as `.module`, so every key of its `state_dict` starts with
# `"module."`. Save `dp.module.state_dict()` (plain keys) and load into `dp.module` or
# into a plain model. A common slip saves `model.module.state_dict()` and then loads it
# into a fresh `DataParallel(...)`: the keys do not match. If you have a file with
# `module.` keys, `consume_prefix_in_state_dict_if_present` strips the prefix.

# %% [markdown] lang="zh"
# ## `.module`、保存与加载
#
# 包装器把你的模型保存在 `.module` 里，所以包装器 `state_dict` 中的每个键都以 `"module."` 开头。
# 应当保存 `dp.module.state_dict()`（键不带前缀），再加载到 `dp.module` 或普通模型里。一个常见
# 的失误是保存 `model.module.state_dict()`，却加载进一个新建的 `DataParallel(...)`：键对不上。
# 如果你手里的文件带有 `module.` 前缀，可以用 `consume_prefix_in_state_dict_if_present` 去掉。

# %%
import io

from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

dp = P.DataParallel(make_cnn(), [0, 1])
print("keys of dp.state_dict():", list(dp.state_dict())[:2])
buffer = io.BytesIO()
torch.save(dp.module.state_dict(), buffer)
buffer.seek(0)
saved = torch.load(buffer)
try:
    P.DataParallel(make_cnn(), [0, 1]).load_state_dict(saved)  # the common slip
except RuntimeError as err:
    print("RuntimeError:", str(err).splitlines()[0], "...")
P.DataParallel(make_cnn(), [0, 1]).module.load_state_dict(saved)
prefixed = dict(dp.state_dict())
consume_prefix_in_state_dict_if_present(prefixed, "module.")
print("plain model loads the stripped keys:", make_cnn().load_state_dict(prefixed))

# %% [markdown] lang="en"
# ## Two more common mistakes
#
# **Unwrapping right after wrapping.** `net = DataParallel(model); net = net.module` gives
# back the original model: nothing is scattered and one device does all the work. Keep the
# wrapper for training and use `.module` only to save or inspect.
#
# **Wrapping the optimizer.** `DataParallel(optimizer)` makes no sense: an optimizer is
# not a Module, and it only updates the parameters of the model you built it from, which
# is what you want. Where PyTorch fails depends on the machine
# (`torch/nn/parallel/data_parallel.py`, `DataParallel.__init__`): with no GPU, or with
# several, it accepts the optimizer without a word and the wrapper then has no `step()`;
# with exactly one GPU the constructor moves the wrapped object to it
# (`self.module.to(...)`) and fails at once: `'SGD' object has no attribute 'to'`. Ours
# refuses it with a clear message everywhere.

# %% [markdown] lang="zh"
# ## 另外两个常见错误
#
# **包装后立刻解包**。`net = DataParallel(model); net = net.module` 拿回的就是原来的模型：
# 数据不会被切分，所有工作都由一个设备完成。训练时要保留包装器，只在保存或查看时使用
# `.module`。
#
# **包装优化器**。`DataParallel(optimizer)` 没有意义：优化器不是 Module，它只更新创建它时传入的
# 那个模型的参数，而这正是你想要的。PyTorch 在哪一步报错取决于机器
# （`torch/nn/parallel/data_parallel.py` 中的 `DataParallel.__init__`）：没有 GPU 或有多块 GPU
# 时，它一声不吭地接受了优化器，但包装出来的对象没有 `step()`；恰好只有一块 GPU 时，构造函数
# 会把被包装的对象移到这块 GPU 上（`self.module.to(...)`），当场报错：
# `'SGD' object has no attribute 'to'`。我们的版本在哪里都会直接拒绝，并给出清楚的提示。

# %%
net = P.DataParallel(Talker(), [0, 1, 2])
net = net.module  # the mistake
with P.trace() as tr:
    net(torch.randn(6, 8))
print("copies after unwrapping:", len(tr.copies()), "| threads used:",
      {e.thread for e in tr.phases()} or "none (one plain call)")

optimizer = torch.optim.SGD(make_cnn().parameters(), lr=0.1)
try:
    wrapped_opt = nn.DataParallel(optimizer)  # one GPU: fails here, in .to(...)
    wrapped_opt.step()  # no GPU or several: accepted above, fails here
except AttributeError as err:
    print(f"torch ({N_GPUS} GPU(s)):", type(err).__name__, err)
try:
    P.DataParallel(optimizer)
except TypeError as err:
    print("ddp_lab:", err)

# %% [markdown] lang="en"
# ## On a machine with two or more GPUs
#
# The next cell runs PyTorch's own `scatter`, `replicate`, `parallel_apply`, `gather` and
# `nn.DataParallel` and compares them with ours. Without two GPUs it says so and skips.
# On a GPU, cuDNN runs float32 convolutions in TF32 by default (a 10-bit mantissa:
# `torch.backends.cudnn.allow_tf32`, on since PyTorch 1.7), which differs from float32
# by about 1e-3; the cell turns it off so that both sides compute in float32.

# %% [markdown] lang="zh"
# ## 在有两块或更多 GPU 的机器上
#
# 下一个单元会运行 PyTorch 自己的 `scatter`、`replicate`、`parallel_apply`、`gather` 和
# `nn.DataParallel`，并与我们的版本比较。没有两块 GPU 时，它会说明原因并跳过。
# 在 GPU 上，cuDNN 默认用 TF32 计算 float32 卷积（尾数只有 10 位：
# `torch.backends.cudnn.allow_tf32`，从 PyTorch 1.7 起默认开启），与 float32 的结果相差约
# 1e-3；所以这个单元先把它关掉，让两边都按 float32 计算。

# %%
if N_GPUS >= 2:
    tf32, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, False
    try:
        gpu_model = make_cnn().float().cuda(0)
        xg = images[:50].float()
        theirs = tp.gather(tp.parallel_apply(tp.replicate(gpu_model, [0, 1]),
                                             tp.scatter(xg.cuda(0), [0, 1])), 0)
        ours = P.gather(P.parallel_apply(P.replicate(copy.deepcopy(gpu_model).cpu(), [0, 1]),
                                         P.scatter(xg, [0, 1])), 0)
        print("torch chunks:", [c.shape[0] for c in tp.scatter(xg.cuda(0), [0, 1])],
              "| ours:", [c.shape[0] for c in P.scatter(xg, [0, 1])])
        print("same outputs:", torch.allclose(theirs.cpu(), ours, atol=1e-5))
        print("nn.DataParallel same:", torch.allclose(
            nn.DataParallel(gpu_model, [0, 1])(xg.cuda(0)).cpu(), ours, atol=1e-5))
    finally:  # the setting is the kernel's: give it back even if a comparison fails
        torch.backends.cudnn.allow_tf32 = tf32
else:
    print(dl.tr(en=f"Skipped: this machine has {N_GPUS} GPU(s); torch.nn.parallel needs 2.",
                zh=f"已跳过：这台机器有 {N_GPUS} 块 GPU，torch.nn.parallel 需要 2 块。"))

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: balanced chunk sizes (2 points)
#
# Write `balanced_chunk_sizes(batch_size, num_devices, gpu0_bsz)` returning a list with the
# rows of each device, following the rule of the balanced section: keep `torch.chunk`'s
# split (padded with zeros to `num_devices` entries) when it gives device 0 at most
# `gpu0_bsz` rows or there is one device; otherwise device 0 gets `gpu0_bsz` and the others
# share the rest, lower-numbered devices taking the remainder's extra rows. Do not call
# `P.balanced_chunk_sizes`. The hidden cases include `gpu0_bsz=0`, batches smaller than
# the device count, and the case where the copied rule goes wrong.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：均衡切分的块大小（2 分）
#
# 编写 `balanced_chunk_sizes(batch_size, num_devices, gpu0_bsz)`，返回每个设备分到的行数列表，
# 规则与“均衡的 DataParallel”一节相同：当 `torch.chunk` 的切分（用 0 补齐到 `num_devices` 项）
# 给设备 0 的行数不超过 `gpu0_bsz`，或者只有一个设备时，保持这个切分；否则设备 0 分到
# `gpu0_bsz` 行，其余设备平分剩下的行，余数由编号较小的设备各多分一行。不要调用
# `P.balanced_chunk_sizes`。隐藏测试用例包括 `gpu0_bsz=0`、批大小小于设备数，以及转抄的规则
# 出错的情况。

# %% tags=["exercise"]
def balanced_chunk_sizes(batch_size: int, num_devices: int, gpu0_bsz: int) -> list[int]:
    ### BEGIN SOLUTION
    chunks = [len(c) for c in torch.arange(batch_size).chunk(num_devices)]
    even = chunks + [0] * (num_devices - len(chunks))
    if num_devices == 1 or gpu0_bsz >= even[0]:
        return even
    base, extra = divmod(batch_size - gpu0_bsz, num_devices - 1)
    return [gpu0_bsz] + [base + (1 if i < extra else 0) for i in range(num_devices - 1)]
    ### END SOLUTION


# %% tags=["exercise"]
print(balanced_chunk_sizes(53, 3, 16), balanced_chunk_sizes(10, 4, 2))

# %% tags=["grade"] grade_id="03.balanced_chunks" points=2
dl.grade("03.balanced_chunks", balanced_chunk_sizes)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: gather with its backward (3 points)
#
# Write the autograd function `MyGather`: `MyGather.apply(target_device, dim, *inputs)`
# concatenates the inputs along `dim` (ours also copies them to `target_device`; you may
# ignore devices). Its `backward` must give each input the slice of the output gradient
# that came from it: chunks can have **different sizes**, and `dim` can be 1. Return one
# gradient per argument of `forward` (`None` for `target_device` and `dim`). The graded
# cell compares values and gradients with single-device `torch.cat` on hidden shapes.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：带反向传播的收集 `gather`（3 分）
#
# 编写自动求导函数 `MyGather`：`MyGather.apply(target_device, dim, *inputs)` 沿 `dim` 拼接各个
# 输入（我们的版本还会把它们拷贝到 `target_device`；你可以不管设备）。它的 `backward` 必须把
# 输出梯度中来自每个输入的那一段交还给这个输入：各块的**大小可以不同**，`dim` 也可能是 1。
# 要为 `forward` 的每个参数各返回一个梯度（`target_device` 和 `dim` 返回 `None`）。评分单元会
# 在隐藏的形状上，把数值和梯度与单设备的 `torch.cat` 比较。

# %% tags=["exercise"]
class MyGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target_device, dim, *inputs):
        ### BEGIN SOLUTION
        ctx.dim = dim
        ctx.sizes = [t.size(dim) for t in inputs]
        return torch.cat(inputs, dim)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return (None, None, *grad_output.split(ctx.sizes, ctx.dim))
        ### END SOLUTION


# %% tags=["grade"] grade_id="03.gather" points=3
dl.grade("03.gather", MyGather)

# %% [markdown] lang="en"
# ## Summary
#
# - DP's forward is scatter, replicate, parallel_apply, gather, every step; backward runs
#   them in reverse: the output gradient is scattered, the parameter gradients are summed.
# - It computes what one device computes, except for layers that use batch statistics.
# - It is slow because of the replication every step, the GIL and the work on device 0;
#   device 0 also needs the most memory: a balanced split helps, the loss inside the
#   replicas helps more.
# - Save `dp.module.state_dict()`; never unwrap before training; never wrap an optimizer.
#
# Next: chapter 04, collective communication between processes, the building block of
# DistributedDataParallel (one process per device), which chapter 07 builds from scratch.

# %% [markdown] lang="zh"
# ## 小结
#
# - DP 每个训练步的前向传播依次执行切分分发、复制、并行执行、收集（`scatter`、`replicate`、
#   `parallel_apply`、`gather`）；反向按相反的顺序执行：输出的梯度被切分分发，参数梯度被求和。
# - 除了用到批统计量的层，它算出的结果与单设备完全相同。
# - 它慢，是因为每一步都要重新复制模型、受 GIL 限制，而且很多工作集中在设备 0 上；设备 0
#   的显存占用也最大：均衡切分能缓解一些，在副本内部计算损失效果更好。
# - 保存 `dp.module.state_dict()`；不要在训练前解包；不要包装优化器。
#
# 下一步：第 04 章讲进程之间的集合通信（collective communication），它是
# DistributedDataParallel（每个设备一个进程）的基础；第 07 章会从零实现 DistributedDataParallel。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`03.concepts`,
# 2 points when all are right).
#
# **1.** `DataParallel` scatters a batch of 6 rows over 4 devices with `torch.chunk`. How many devices get any rows? (a number)
#
# **2.** A model with BatchNorm is trained one step under `DataParallel` on 2 devices. What does its `running_mean` hold afterwards?
#
# - (a) the mean of both devices' statistics
# - (b) statistics of device 0's chunk only
# - (c) statistics of the whole batch
# - (d) nothing: running statistics are not updated under DataParallel
#
# **3.** Why does device 0 need more memory than the others under `DataParallel`?
#
# - (a) it holds the gathered outputs of all devices (and the loss on them) besides its own chunk's work
# - (b) it keeps a second copy of the optimizer
# - (c) it runs two replicas
# - (d) it keeps fp32 master weights
#
# **4.** You save `dp.state_dict()` of a `DataParallel` model and load it with `load_state_dict` into a plain (unwrapped) model. What happens?
#
# - (a) it loads onto device 0
# - (b) it loads
# - (c) an error: every key starts with "module.", so keys are missing and unexpected
# - (d) it loads nothing, silently


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`03.concepts`，全部答对得 2 分）。
#
# **1.** `DataParallel` 用 `torch.chunk` 把 6 行的批次分到 4 个设备上。有几个设备分到了数据？（填一个数）
#
# **2.** 一个带 BatchNorm 的模型在 2 个设备上用 `DataParallel` 训练了一步。之后它的 `running_mean` 里是什么？
#
# - (a) 两个设备统计量的平均
# - (b) 只有设备 0 那一块的统计量
# - (c) 整个批次的统计量
# - (d) 什么都没有：DataParallel 下不更新运行统计量
#
# **3.** 在 `DataParallel` 下，为什么设备 0 比其他设备需要更多显存？
#
# - (a) 除了自己那一块的计算，它还要存放收集来的所有设备的输出（以及在其上计算的损失）
# - (b) 它多存了一份优化器
# - (c) 它运行两个副本
# - (d) 它保存 fp32 主权重
#
# **4.** 你保存了 `DataParallel` 模型的 `dp.state_dict()`，然后用 `load_state_dict` 加载到一个普通（未包装）的模型里。会发生什么？
#
# - (a) 加载到设备 0 上
# - (b) 正常加载
# - (c) 报错：每个键都以“module.”开头，于是有缺失的键，也有多余的键
# - (d) 什么都没加载，也不报错


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: 3,  # a number
    2: "b",  # a letter
    3: "a",  # a letter
    4: "c",  # a letter
    ### END ANSWERS
}
dl.quiz("03", my_answers)


# %% tags=["grade"] grade_id="03.concepts" points=2
dl.grade("03.concepts", my_answers)
