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
#       en: "09 Launching for real and debugging"
#       zh: "09 真实的启动方式与调试"
# ---

# %% [markdown] lang="en"
# # 09 Launching for real and debugging
#
# Until now `dl.spawn` started your ranks. On a cluster you use PyTorch's own **launchers**:
# `torchrun` (and its deprecated ancestor `torch.distributed.launch`) or
# `torch.multiprocessing.spawn`. This chapter runs each of them from the notebook (as a
# subprocess, with a free port and a timeout), shows what each gives to your processes,
# runs a two-node job on this one machine, and then triggers, for real, the errors you will
# meet, with their cause and fix.

# %% [markdown] lang="zh"
# # 09 真实的启动方式与调试
#
# 到目前为止，都是 `dl.spawn` 替你启动各个 rank（进程编号）。在集群上，你会用 PyTorch 自己
# 的**启动器**（launcher）：`torchrun`（以及它已弃用的前身 `torch.distributed.launch`）或
# `torch.multiprocessing.spawn`。本章在 notebook 里把它们逐一作为子进程运行，每次都用空闲端口
# 并设置超时（timeout），看看它们分别给你的进程提供了什么；然后在这一台机器上运行一个跨两个节
# 点（node）的任务；最后亲手触发你迟早会遇到的各种错误，并给出原因和解决办法。

# %%
import argparse
import datetime
import os
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

import ddp_lab as dl
from ddp_lab.tools import errors
from ddp_lab.labs import launch_demo as ld

dl.setup()
print(torch.__version__)

# %% [markdown] lang="en" tags=["lesson"]
# ## 1. What a launcher gives each process
#
# Every launcher does two things: it starts one process per rank, and it tells each process
# who it is. Our demo workers are small functions in `ddp_lab.labs.launch_demo`, started as
# `python -m ddp_lab.labs.launch_demo WORKER`; each prints one line with what it received.
# The launches take a few seconds each, so the next cell starts all of this chapter's launches
# in the background (two at a time); the cells below wait for their own one.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 1. 启动器给每个进程提供了什么
#
# 每个启动器都做两件事：为每个 rank 启动一个进程，并告诉每个进程“你是谁”。我们的演示 worker 是
# `ddp_lab.labs.launch_demo` 里的小函数，用 `python -m ddp_lab.labs.launch_demo WORKER` 启动；每个
# worker 打印一行，列出它收到的信息。每次启动要几秒钟，所以下一个单元会在后台一次性开始本章所
# 有的启动（每次同时运行两个）；后面的单元各自等待自己那一次的结果。

# %% tags=["lesson"]
dl.show_source(ld.worker_env)

# %% tags=["lesson"]
pool = ThreadPoolExecutor(max_workers=2)
save_dir = str(dl.scratch("shared"))  # one folder both "nodes" see
runs = {
    "torchrun": pool.submit(ld.torchrun, "env", nproc_per_node=2),
    "legacy": pool.submit(ld.legacy_launch, "legacy_args", nproc_per_node=2),
    "mp_spawn": pool.submit(ld.mp_spawn, "init", nprocs=2),
    "crash": pool.submit(ld.torchrun, "crash", nproc_per_node=2, max_restarts=1),
    "signal": pool.submit(ld.signal_agent, "sleep"),
    "two_nodes": pool.submit(ld.two_nodes, "env", nproc_per_node=2),
    "c10d": pool.submit(ld.two_nodes, "env", nproc_per_node=2, rdzv_backend="c10d"),
    "habits": pool.submit(ld.two_nodes, "node_habits", nproc_per_node=2,
                          env={"DEMO_SAVE_DIR": save_dir}),
}
print(sorted(runs))

# %% [markdown] lang="en" tags=["lesson"]
# ### `torchrun`
#
# `torchrun --standalone --nproc_per_node=2 script.py` starts an *agent* process, which
# starts two workers and sets their environment: `RANK` (global rank), `LOCAL_RANK` (rank on
# this node), `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK` (the node's rank),
# `MASTER_ADDR`/`MASTER_PORT` (where the job's key-value store listens) and
# `TORCHELASTIC_RESTART_COUNT`. Under torchrun that store is hosted by the *agent* of node 0,
# not by rank 0: torchrun sets `TORCHELASTIC_USE_AGENT_STORE=True`, and then every worker,
# rank 0 included, connects as a client (`_create_c10d_store` in
# `torch/distributed/rendezvous.py`; section 3 prints the variable). `--standalone` sets up a private **rendezvous** on a
# free port, so two jobs on one machine never collide. Each rank is its own process (its own
# pid): data parallel with DDP uses processes, not threads.

# %% [markdown] lang="zh" tags=["lesson"]
# ### `torchrun`
#
# `torchrun --standalone --nproc_per_node=2 script.py` 会启动一个*代理*（agent）进程，由它启动
# 两个 worker 并设置它们的环境变量：`RANK`（全局 rank）、`LOCAL_RANK`（本节点上的 rank）
# 、`WORLD_SIZE`、`LOCAL_WORLD_SIZE`、`GROUP_RANK`（节点的编号）
# 、`MASTER_ADDR`/`MASTER_PORT`（整个任务的键值 store 监听的地址）以及
# `TORCHELASTIC_RESTART_COUNT`。在 torchrun 下，这个 store 由 0 号节点的*代理*托管，而不是由
# rank 0 托管：torchrun 设置了 `TORCHELASTIC_USE_AGENT_STORE=True`，于是包括 rank 0 在内的每个
# worker 都以客户端身份连接（见 `torch/distributed/rendezvous.py` 的 `_create_c10d_store`；第
# 3 节会打印这个变量）。`--standalone` 在空闲端口上建立一个私有的**会合**（rendezvous），所以
# 同一台机器上的两个任务不会冲突。每个 rank 都是一个独立的进程（pid 各不相同）：DDP 的数据并行
# （data parallel）用的是进程，不是线程。

# %% tags=["lesson"]
r = runs["torchrun"].result()
r.show(pattern="^(?!.*OMP_NUM_THREADS)")
print(ld.format_table(r.records(), ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                    "MASTER_ADDR", "MASTER_PORT", "pid", "nice")))
assert [rec["RANK"] for rec in r.records()] == ["0", "1"]

# %% [markdown] lang="en" tags=["lesson"]
# **A common claim in notes and blog posts: the rank is "the priority of the process".**
# It is only an index: the `nice` column above is the scheduling priority the OS uses, and it
# is the same for every rank. Rank 0 is special only because your code (and the rendezvous
# store) treat it so.

# %% [markdown] lang="zh" tags=["lesson"]
# **常见说法：rank 是“进程的优先级”**。其实它只是一个编号：上表中的 `nice` 列才
# 是操作系统调度用的优先级，而它在每个 rank 上都一样。rank 0 之所以特殊，只是因为你的代码（以
# 及会合用的 store）这样对待它。

# %% [markdown] lang="en" tags=["lesson"]
# ### `torch.distributed.launch` (deprecated) and `--local-rank`
#
# The old launcher still runs, prints a `FutureWarning`, and passes `--local-rank=N`
# (with a hyphen since PyTorch 2.0) as a command-line argument, in addition to the
# environment. A parser often copied from notes and blog posts reads `--local_rank`
# (underscore) with `type=str`. The worker below uses that parser and then a fixed one.

# %% [markdown] lang="zh" tags=["lesson"]
# ### `torch.distributed.launch`（已弃用）与 `--local-rank`
#
# 旧的启动器仍然能运行，会打印一条 `FutureWarning`，并且除了设置环境变量，还会在命令行上传入
# `--local-rank=N`（从 PyTorch 2.0 起用连字符）。网上流传的一种解析器用 `type=str` 解析
# `--local_rank`（下划线）。下面的 worker 先用这个解析器，再用修正后的解析器。

# %% tags=["lesson"]
dl.show_source(ld.worker_legacy_args)

# %% tags=["lesson"]
r = runs["legacy"].result()
r.show(pattern="FutureWarning|unrecognized")
for rec in r.records():
    print(f"argv={rec['argv']}  type=str parser: {rec['notes_parser']}  fixed: {rec['fixed_parser']!r}")
errors.explain(r, "bad_flag")

# %% [markdown] lang="en" tags=["lesson"]
# Even when the old spelling arrives (`--local_rank=0`, as PyTorch 1.x passed it), `type=str`
# gives the string `"0"`, and `"0" == 0` is false: a guard like `if local_rank == 0: save()`
# then never saves on any rank. The fix: read `int(os.environ["LOCAL_RANK"])` (every launcher
# sets it), or at least `type=int`.

# %% [markdown] lang="zh" tags=["lesson"]
# 即使收到的是旧写法（`--local_rank=0`，PyTorch 1.x 就是这样传的），`type=str` 得到的也是字符
# 串 `"0"`，而 `"0" == 0` 为假：像 `if local_rank == 0: save()` 这样的判断在任何 rank 上都不会
# 保存。解决办法：读取 `int(os.environ["LOCAL_RANK"])`（每个启动器都会设置它），至少也要用
# `type=int`。

# %% tags=["lesson"]
str_parser = argparse.ArgumentParser()
str_parser.add_argument("--local_rank", type=str, default=-1)  # as often copied
local_rank = str_parser.parse_args(["--local_rank=0"]).local_rank
print(repr(local_rank), "== 0 ->", local_rank == 0)

fixed_parser = argparse.ArgumentParser()
fixed_parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int)
print(repr(fixed_parser.parse_args(["--local_rank=0"]).local_rank),
      repr(fixed_parser.parse_args(["--local-rank=0"]).local_rank))

# %% [markdown] lang="en" tags=["lesson"]
# Another line seen in the wild calls `torch.distributed.local_rank()`. That function does
# not exist:

# %% [markdown] lang="zh" tags=["lesson"]
# 还有一种常见写法调用 `torch.distributed.local_rank()`。这个函数并不存在：

# %% tags=["lesson"]
with errors.expect("no_local_rank"):
    dist.local_rank()

# %% [markdown] lang="en" tags=["lesson"]
# ### `torch.multiprocessing.spawn`
#
# `mp.spawn(fn, nprocs=N)` starts `N` fresh Python processes and calls `fn(i, ...)`: it
# passes only the index `i` and sets **no** environment variable. So
# `init_process_group()` with the default `env://` fails, and you must pass `rank`,
# `world_size` and an address yourself. (It also pickles `fn` by name, which is why it
# cannot run functions defined in a notebook; `dl.spawn` can.)

# %% [markdown] lang="zh" tags=["lesson"]
# ### `torch.multiprocessing.spawn`
#
# `mp.spawn(fn, nprocs=N)` 启动 `N` 个全新的 Python 进程并调用 `fn(i, ...)`：它只传入编号 `i`，
# **不**设置任何环境变量。因此用默认 `env://` 调用 `init_process_group()` 会失败，你必须自己传入
# `rank`、`world_size` 和地址。（它还按名字 pickle `fn`，所以无法运行 notebook 里定义的函数；
# `dl.spawn` 可以。）

# %% tags=["lesson"]
r = runs["mp_spawn"].result()
print(ld.format_table(r.records(), ("DEMO_SPAWN_INDEX", "RANK", "WORLD_SIZE", "MASTER_PORT", "pid")))
print(r.records()[0]["init"])
errors.explain(r.records()[0]["init"], "env_not_set")

# %% [markdown] lang="en" tags=["lesson"]
# `dl.spawn` behaves like `torchrun` here: it sets the same variables, so the default
# `env://` works.

# %% [markdown] lang="zh" tags=["lesson"]
# `dl.spawn` 在这一点上和 `torchrun` 一样：它设置同样的环境变量，所以默认的 `env://` 可以直接使用。

# %% tags=["lesson"]
def show_env(rank):
    return {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")}


for env in dl.spawn(show_env, nprocs=2):
    print(env)

# %% [markdown] lang="en" tags=["lesson"]
# ## 2. When a worker dies, and the "death signal"
#
# With `--max-restarts=1`, when a worker fails the agent stops the others and restarts the
# whole group once (`TORCHELASTIC_RESTART_COUNT` becomes 1). If it fails again, torchrun
# exits with a `ChildFailedError` report whose *Root Cause* names the first rank to fail.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 2. worker 挂掉之后，以及“death signal”
#
# 使用 `--max-restarts=1` 时，一旦有 worker 失败，代理会停掉其余的 worker，并把整组重启一次
# （`TORCHELASTIC_RESTART_COUNT` 变为 1）。如果再次失败，torchrun 会以 `ChildFailedError` 报告
# 退出，其中的 *Root Cause* 指出第一个失败的 rank。

# %% tags=["lesson"]
r = runs["crash"].result()
print(ld.format_table(r.records(), ("TORCHELASTIC_RESTART_COUNT", "RANK", "pid")))
r.show(pattern="RuntimeError: simulated|Root Cause|rank +:|exitcode|ChildFailedError")
errors.explain(r, "child_failed")

# %% [markdown] lang="en" tags=["lesson"]
# A common claim in notes and blog posts: "torch 1.8 rarely fails, torch>=1.9 is
# unstable", quoting `Received 1 death signal, shutting down workers`. That line is the agent saying it was
# *sent a signal* from outside (1 is SIGHUP: the terminal or ssh session closed). Here we
# send SIGTERM to the agent while the workers train:

# %% [markdown] lang="zh" tags=["lesson"]
# 常见说法：“torch 1.8 基本不出错，torch>=1.9 不稳定”，证据是这行日志
# `Received 1 death signal, shutting down workers`。这行日志是代理在说它*从外部收到了信号*（1
# 是 SIGHUP：终端或 ssh 会话关闭了）。下面我们在 worker 训练时向代理发送 SIGTERM：

# %% tags=["lesson"]
r = runs["signal"].result()
r.show(pattern="death signal|closing signal|SignalException")
errors.explain(r, "death_signal")

# %% [markdown] lang="en" tags=["lesson"]
# The fix is not an older PyTorch: run long jobs under `tmux`/`nohup` or a scheduler, save
# checkpoints, and let `--max-restarts` (or the scheduler) resume.

# %% [markdown] lang="zh" tags=["lesson"]
# 解决办法不是换回旧版 PyTorch：在 `tmux`/`nohup` 或调度器下运行长任务，保存检查点
# （checkpoint），并让 `--max-restarts`（或调度器）恢复运行。

# %% [markdown] lang="en" tags=["lesson"]
# ## 3. Two nodes on one machine
#
# A multi-node job runs one `torchrun` per node with the same `--nnodes`,
# `--master_addr` and `--master_port`, and a different `--node_rank`. Here both
# "nodes" are this machine (127.0.0.1), each with `--nproc_per_node=2`:

# %% [markdown] lang="zh" tags=["lesson"]
# ## 3. 在一台机器上跑两个节点
#
# 多节点任务在每个节点上各运行一个 `torchrun`，它们的 `--nnodes`、`--master_addr`、`--master_port`
# 相同，`--node_rank` 不同。这里两个“节点”都是本机（127.0.0.1），每个节点 `--nproc_per_node=2`：

# %% tags=["lesson"]
for r in runs["two_nodes"].result():
    r.show(pattern="^$")
rows = [rec for r in runs["two_nodes"].result() for rec in r.records()]
print(ld.format_table(sorted(rows, key=lambda rec: int(rec["RANK"]))))

# %% [markdown] lang="en" tags=["lesson"]
# `RANK = GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK` here, and `WORLD_SIZE` is 4 on both
# nodes. The formula holds only when every node runs the same number of workers: torchrun
# gives each node a base rank equal to the sum of the `LOCAL_WORLD_SIZE` of the nodes before
# it (`_assign_worker_ranks` in `torch/distributed/elastic/agent/server/api.py`), so with
# 2 + 3 workers the second node's ranks are 2, 3, 4. Read `RANK`; do not compute it.
# A common habit computes the world size as `torch.cuda.device_count()`: that is the GPU count of
# *one* node (2 here, like `LOCAL_WORLD_SIZE`), not 4. Read `WORLD_SIZE` (or
# `dist.get_world_size()`).
#
# With the **c10d rendezvous** (`--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT`) you do not
# give `--node_rank`: the agents get their node ranks when they meet, and nodes may join
# late or be replaced (elastic training). The same job again, c10d this time:

# %% [markdown] lang="zh" tags=["lesson"]
# 这里 `RANK = GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK`，两个节点上的 `WORLD_SIZE` 都是 4。
# 这个公式只在每个节点的 worker 数相同时才成立：torchrun 给每个节点的起始 rank 是它前面所有节
# 点的 `LOCAL_WORLD_SIZE` 之和（见 `torch/distributed/elastic/agent/server/api.py` 的
# `_assign_worker_ranks`），所以两个节点分别有 2 个和 3 个 worker 时，第二个节点的 rank 是
# 2、3、4。请读取 `RANK`，不要自己算。有一种常见写法用 `torch.cuda.device_count()` 作为
# world size（进程总数）：那只是*一个*节点上的 GPU 数（这里是 2，和 `LOCAL_WORLD_SIZE` 一样），而不
# 是 4。请读取 `WORLD_SIZE`（或 `dist.get_world_size()`）。
#
# 使用 **c10d 会合**（`--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT`）时不需要
# `--node_rank`：各个代理在会合时得到各自的节点编号，节点还可以晚到或被替换（弹性训练）。同一
# 个任务，这次用 c10d：

# %% tags=["lesson"]
results = runs["c10d"].result()
results[0].show(pattern="^$")
rows = [rec for r in results for rec in r.records()]
print(ld.format_table(sorted(rows, key=lambda rec: int(rec["RANK"]))))
assert sorted(int(rec["RANK"]) for rec in rows) == [0, 1, 2, 3]

# %% [markdown] lang="en" tags=["lesson"]
# ### Two habits that break on the second node
#
# Both are common in notes and blog posts, and both work on one node, which is why they
# survive. `torch.cuda.set_device(args.rank)` uses the *global* rank as a GPU index: on
# node 1 the ranks are 2 and 3, but the node has GPUs 0 and 1, so it fails with `invalid
# device ordinal`. `if local_rank == 0: save()` saves once per *node*: on two
# nodes two processes write the same checkpoint path, at the same time on a shared disk.
# The worker `node_habits` acts both out on the two-node job (`LOCAL_WORLD_SIZE` stands for
# the node's GPU count; it appends to one file in a folder both "nodes" share):

# %% [markdown] lang="zh" tags=["lesson"]
# ### 到第二个节点就出错的两个习惯
#
# 教程和博客里这两种写法都很常见，而且在单节点上都能正常工作，所以一直流传下来
# 。`torch.cuda.set_device(args.rank)` 把*全局* rank 当作 GPU 编号：在 1 号节点上
# rank 是 2 和 3，而该节点只有 GPU 0 和 1，于是以 `invalid device ordinal` 失败
# 。`if local_rank == 0: save()` 每个*节点*保存一次：两个节点上就有两个进程写同一
# 个检查点路径，在共享磁盘上还是同时写。worker `node_habits` 在两节点任务上把两者都演示一遍（
# 用 `LOCAL_WORLD_SIZE` 代表节点的 GPU 数；它往两个“节点”共享的目录里的同一个文件追加内容）：

# %% tags=["lesson"]
dl.show_source(ld.worker_node_habits)

# %% tags=["lesson"]
rows = [rec for r in runs["habits"].result() for rec in r.records()]
print(ld.format_table(sorted(rows, key=lambda rec: int(rec["RANK"])),
                      ("RANK", "GROUP_RANK", "LOCAL_RANK", "set_device_RANK",
                       "set_device_LOCAL_RANK", "saved", "TORCHELASTIC_USE_AGENT_STORE")))
checkpoint = os.path.join(save_dir, "checkpoint.txt")
print(open(checkpoint).read().strip().splitlines(), "<- one file, two writers")

# %% [markdown] lang="en" tags=["lesson"]
# The fixes: the device is `LOCAL_RANK` (`torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`),
# and the saver is the global rank 0 (`if dist.get_rank() == 0: save()`). Save per node only
# when each node has its own disk, and then say so in the code.

# %% [markdown] lang="zh" tags=["lesson"]
# 修正方法：设备用 `LOCAL_RANK`（`torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`），保
# 存由全局 rank 0 负责（`if dist.get_rank() == 0: save()`）。只有每个节点各有自己的磁盘时才按
# 节点保存，而且要在代码里写明这一点。

# %% [markdown] lang="en" tags=["lesson"]
# A misspelt flag, like `--master_adderss` (seen in copied scripts) or `--master_address`, is refused
# before anything starts:

# %% [markdown] lang="zh" tags=["lesson"]
# 拼错的参数，比如网上脚本里出现过的 `--master_adderss`（或 `--master_address`），在任何进程启动之前就
# 会被拒绝：

# %% tags=["lesson"]
cmd = ld.torchrun_command("env", 2, nnodes=2, node_rank=0)
cmd = [a.replace("--master_addr", "--master_adderss") for a in cmd]
r = ld.run(cmd, timeout=30)
errors.explain(r, "bad_flag")

# %% [markdown] lang="en" tags=["lesson"]
# **On real machines** `--master_addr` is the address of node 0 that every node can reach,
# the port must be open in the firewall between nodes, and every node must start (else the
# others wait until the rendezvous timeout). When a machine has several network interfaces,
# choose the one to use with `GLOO_SOCKET_IFNAME` (gloo) or `NCCL_SOCKET_IFNAME` (NCCL). The
# two read their value differently. NCCL takes *prefixes* (`eth` matches eth0 and eth1; `=`
# in front asks for exact names, `^` excludes: `ncclOsFindInterfaces` in NCCL's
# `src/os/linux.cc`). Gloo takes a comma-separated list of *exact* names (`lookupAddrForIface`
# in gloo's `gloo/transport/tcp/device.cc` compares with `strcmp`), and ignores a value of one
# character (the `strlen(ifnameEnv) > 1` test in `torch/csrc/distributed/c10d/init.cpp`).
# A name the machine does not have fails at once, and so does a prefix of a real one:

# %% [markdown] lang="zh" tags=["lesson"]
# **在真实的多台机器上**，`--master_addr` 是每个节点都能访问到的 0 号节点的地址，节点之间的防
# 火墙必须放行该端口，而且每个节点都必须启动（否则其他节点会一直等到会合超时）。机器有多块网卡
# 时，用 `GLOO_SOCKET_IFNAME`（gloo）或 `NCCL_SOCKET_IFNAME`（NCCL）指定使用哪一块。两者对取值
# 的解析方式不同。NCCL 接受*前缀*（`eth` 能匹配 eth0 和 eth1；前面加 `=` 表示精确匹配，加 `^` 表
# 示排除：见 NCCL `src/os/linux.cc` 中的 `ncclOsFindInterfaces`）。Gloo 接受用逗号分隔的*精
# 确*网卡名（gloo 的 `gloo/transport/tcp/device.cc` 中，`lookupAddrForIface` 用 `strcmp` 比较
# ），而且会忽略只有一个字符的值（`torch/csrc/distributed/c10d/init.cpp` 中的
# `strlen(ifnameEnv) > 1` 判断）。写一个本机没有的网卡名会立即失败，写真实网卡名的前缀也一样：

# %% tags=["lesson"]
def wrong_interface(rank):
    os.environ["GLOO_SOCKET_IFNAME"] = "eth9"  # no such interface here
    dist.init_process_group("gloo")


with errors.expect("no_interface"):
    dl.spawn(wrong_interface, nprocs=2, quiet=True, timeout=30)


def gloo_interface(rank, name):
    os.environ["GLOO_SOCKET_IFNAME"] = name
    dist.init_process_group("gloo")
    return "ok"


def has_ipv4(name):
    """Whether interface ``name`` has an IPv4 address (the SIOCGIFADDR ioctl)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            return True
        except OSError:
            return False


names = [name for _, name in socket.if_nameindex() if has_ipv4(name)]
print("interfaces with an IPv4 address:", names)
print("GLOO_SOCKET_IFNAME=lo:", dl.spawn(gloo_interface, args=("lo",), nprocs=2)[0])
print("GLOO_SOCKET_IFNAME=l (one letter, ignored):",
      dl.spawn(gloo_interface, args=("l",), nprocs=2)[0])
real = next((name for name in names if len(name) >= 3 and name != "lo"), None)  # e.g. eth0
if real:
    print(f"GLOO_SOCKET_IFNAME={real}:", dl.spawn(gloo_interface, args=(real,), nprocs=2)[0])
    with errors.expect("no_interface"):  # a prefix: NCCL would accept it, Gloo does not
        dl.spawn(gloo_interface, args=(real[:-1],), nprocs=2, quiet=True, timeout=30)
else:
    print(dl.tr(en="No interface besides lo has an address here: the prefix case is skipped.",
                zh="这里除了 lo 没有其他带地址的网卡：跳过前缀的例子。"))

# %% [markdown] lang="en" tags=["lesson"]
# When you outgrow one machine, a cluster launcher starts the `torchrun` of every node for
# you: Slurm (`srun torchrun ...`, node list from `SLURM_*` variables), Kubernetes
# (TorchX, the Kubeflow PyTorchJob), or libraries such as Accelerate and Lightning. They all
# end up setting the same variables you saw above.

# %% [markdown] lang="zh" tags=["lesson"]
# 当一台机器不够用时，集群启动器会替你在每个节点上启动 `torchrun`：Slurm（`srun torchrun ...`，
# 节点列表来自 `SLURM_*` 环境变量）、Kubernetes（TorchX、Kubeflow 的 PyTorchJob），或者
# Accelerate、Lightning 这样的库。它们最终设置的都是上面看到的那些变量。

# %% [markdown] lang="en" tags=["lesson"]
# ### GPUs and `CUDA_VISIBLE_DEVICES`
#
# A command often copied runs `CUDA_VISIBLE_DEVICES=0,1,2,3 ... --nproc_per_node=8`: local
# ranks 4-7 then ask for GPUs that are not visible and fail with `invalid device ordinal`
# (the first run below, in small: one GPU visible, local rank 1).
#
# Another habit sets `CUDA_VISIBLE_DEVICES` inside the script, after start. The CUDA driver
# reads the variable once, when the process initialises CUDA (`cuInit`), so a late setting
# counts only if nothing has touched CUDA yet. `torch.cuda.is_available()` already has: it
# calls `cudaGetDeviceCount`, which runs `cuInit` (unless `PYTORCH_NVML_BASED_CUDA_CHECK=1`
# is set), and so does any CUDA tensor. `torch.cuda.device_count()` alone has not: until
# torch initialises CUDA it counts through NVML and reads the variable again at every call
# (`torch/cuda/__init__.py`: `is_available`, `device_count`, `_device_count_nvml`). After a
# late change the two can disagree, as the second run shows. Set the variable on the command
# line instead.

# %% [markdown] lang="zh" tags=["lesson"]
# ### GPU 与 `CUDA_VISIBLE_DEVICES`
#
# 一条常被照抄的命令是 `CUDA_VISIBLE_DEVICES=0,1,2,3 ... --nproc_per_node=8`：本地 rank（local
# rank）4～7 会请求看不见的 GPU，并以 `invalid device ordinal` 失败（下面第一次运行是它的缩小版：
# 只有一块 GPU 可见，本地 rank 为 1）。
#
# 另一种习惯是在脚本启动之后才在脚本里设置 `CUDA_VISIBLE_DEVICES`。CUDA 驱动只在进程初始化 CUDA
# （`cuInit`）时读一次这个变量，所以晚设的值只有在此之前还没碰过 CUDA 才算数。而
# `torch.cuda.is_available()` 已经碰过了：它调用 `cudaGetDeviceCount`，后者会执行 `cuInit`（除非设
# 置了 `PYTORCH_NVML_BASED_CUDA_CHECK=1`）；创建任何 CUDA 张量也一样。单独调用
# `torch.cuda.device_count()` 则不会：在 torch 初始化 CUDA 之前，它通过 NVML 计数，每次调用都重新
# 读取这个变量（`torch/cuda/__init__.py` 中的 `is_available`、`device_count`、
# `_device_count_nvml`）。所以晚改之后，两者可能对不上，第二次运行就是这样。正确的做法是在命令行上
# 设置。

# %% tags=["lesson"]
if torch.cuda.is_available():
    # 1. The copied command in small: one GPU visible, local rank 1.
    copied = ld.run([sys.executable, "-c",
                     "import os, torch; torch.cuda.set_device(int(os.environ['LOCAL_RANK']))"],
                    env={"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "1"}, timeout=60)
    errors.explain(copied, "invalid_ordinal")
    # 2. Set late: is_available() has started CUDA, then every GPU is hidden.
    late = ("import os, torch; torch.cuda.is_available(); "
            "os.environ['CUDA_VISIBLE_DEVICES'] = ''; "
            "print('device_count() after hiding every GPU late:', torch.cuda.device_count()); "
            "print('yet a tensor lands on', torch.ones(1, device='cuda').device)")
    print(ld.run([sys.executable, "-c", late], timeout=60).stdout)
else:
    print(dl.tr(en="Skipped: no GPU here. On a GPU machine: local rank 1 with one visible GPU "
                   "fails in torch.cuda.set_device with 'CUDA error: invalid device ordinal'; "
                   "and once torch.cuda.is_available() has run, hiding every GPU makes "
                   "torch.cuda.device_count() say 0 while a tensor still lands on cuda:0.",
                zh="已跳过：这里没有 GPU。在有 GPU 的机器上：只有一块 GPU 可见时，本地 rank 1 在 "
                   "torch.cuda.set_device 处以“CUDA error: invalid device ordinal”失败；而在 "
                   "torch.cuda.is_available() 运行之后再隐藏所有 GPU，torch.cuda.device_count() "
                   "会说 0，张量却照样放在 cuda:0 上。"))

# %% [markdown] lang="en" tags=["lesson"]
# ## 4. Init methods and timeouts
#
# `init_process_group` finds its peers through an *init method*: `env://` (the default:
# `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`), `tcp://HOST:PORT` (explicit
# address, plus `rank=` and `world_size=`), or `file:///path` (a file all ranks can see).

# %% [markdown] lang="zh" tags=["lesson"]
# ## 4. 初始化方法与超时
#
# `init_process_group` 通过*初始化方法*（init method）找到其他 rank：`env://`（默认：读取
# `MASTER_ADDR`、`MASTER_PORT`、`RANK`、`WORLD_SIZE`）、`tcp://HOST:PORT`（显式地址，另需
# `rank=` 和 `world_size=`）或 `file:///path`（所有 rank 都能访问的文件）。

# %% tags=["lesson"]
def join(rank, init_method, world_size, crash=False):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=3))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    if crash:
        raise RuntimeError("crash before destroy_process_group")
    return total.item()


port = ld.free_port()
print("tcp://", dl.spawn(join, args=(f"tcp://127.0.0.1:{port}", 2), nprocs=2))
path = tempfile.mktemp(prefix="ddp_init_")
print("file://", dl.spawn(join, args=(f"file://{path}", 2), nprocs=2),
      "| file left:", os.path.exists(path))

# %% [markdown] lang="en" tags=["lesson"]
# A clean exit removes the file. A crash leaves it behind ("stale"), and the next job that
# uses the same path reads the old job's entries: it may work, hang, or fail, depending on
# what the file holds. Use a new path per job (or `env://`).

# %% [markdown] lang="zh" tags=["lesson"]
# 正常退出时会删掉这个文件，崩溃则会把它留下（“陈旧文件”），下一个使用同一路径的任务会读到旧任务
# 的记录：可能正常运行，可能卡住，也可能报错，取决于文件里有什么。每个任务都用新的路径（或者用
# `env://`）。

# %% tags=["lesson"]
try:
    dl.spawn(join, args=(f"file://{path}", 2, True), nprocs=2, quiet=True)
except dl.DistributedError as err:
    print("crashed:", err.failures[0].reason)
print("stale file left:", os.path.exists(path), os.path.getsize(path), "bytes")
for attempt in (1, 2):
    try:
        outcome = dl.spawn(join, args=(f"file://{path}", 2), nprocs=2, quiet=True, timeout=4)
    except dl.DistributedError as err:
        outcome = type(err).__name__
    print(f"reuse {attempt}:", outcome, "| file size:", os.path.getsize(path))
os.remove(path)

# %% [markdown] lang="en" tags=["lesson"]
# `timeout=` of `init_process_group` bounds both the wait for peers at start and each
# collective. Here a group of 2 is started with only one process:

# %% [markdown] lang="zh" tags=["lesson"]
# `init_process_group` 的 `timeout=` 既限制启动时等待其他 rank 的时间，也限制每一次集合通信
# （collective）。下面只用一个进程去组建一个大小为 2 的进程组（process group）：

# %% tags=["lesson"]
def lonely(rank):
    dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=2))


with errors.expect("store_timeout"):
    dl.spawn(lonely, nprocs=1, quiet=True, timeout=30)

# %% [markdown] lang="en" tags=["lesson"]
# ## 5. A gallery of real failures
#
# ### Mismatched collectives: a hang
#
# Rank 0 calls `all_reduce`, rank 1 calls `broadcast`. Nothing fails: both wait forever.
# `dl.spawn` stops them at its timeout and prints where each rank is stuck (torchrun would
# wait until the process group's timeout: 30 minutes by default for gloo, 10 minutes for
# NCCL, `kProcessGroupDefaultTimeout` in `torch/csrc/distributed/c10d/ProcessGroup.hpp` and
# `kProcessGroupNCCLDefaultTimeout` in `ProcessGroupNCCL.hpp`; the cell prints both as
# `torch.distributed.constants` sees them, `None` for NCCL in a CPU build).

# %% [markdown] lang="zh" tags=["lesson"]
# ## 5. 真实故障集锦
#
# ### 不匹配的集合通信：卡住（hang）
#
# rank 0 调用 `all_reduce`，rank 1 调用 `broadcast`。不会报错：两者都会一直等下去
# 。`dl.spawn` 在超时后停止它们，并打印每个 rank 卡在哪里（torchrun 则会一直等到进程组超时
# ：gloo 默认 30 分钟，NCCL 默认 10 分钟，见 `torch/csrc/distributed/c10d/ProcessGroup.hpp` 的
# `kProcessGroupDefaultTimeout` 和 `ProcessGroupNCCL.hpp` 的
# `kProcessGroupNCCLDefaultTimeout`；单元会打印 `torch.distributed.constants` 看到的这两个值
# ，CPU 版本中 NCCL 的值是 `None`）。

# %% tags=["lesson"]
def mismatched(rank, detail=False):
    if detail:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()  # read at import; re-read it in this process
    dist.init_process_group("gloo")
    t = torch.ones(3)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


from torch.distributed import constants

print("default timeout gloo:", constants.default_pg_timeout,
      "| nccl:", constants.default_pg_nccl_timeout)
try:
    dl.spawn(mismatched, nprocs=2, quiet=True, timeout=3)
except dl.DistributedTimeoutError as err:
    for f in err.failures:
        where = [line.strip() for line in f.stack.splitlines() if "line" in line][:2]
        print(f"rank {f.rank} stuck at:", where)

# %% [markdown] lang="en" tags=["lesson"]
# `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks, before every collective, that all ranks call the
# same one with the same shapes, and turns the hang into an error that names both sides.
# It is read when `torch.distributed` is imported, so set it before the process starts
# (`TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun ...`); inside a running process call
# `dist.set_debug_level_from_env()` after setting it, as the function above does.

# %% [markdown] lang="zh" tags=["lesson"]
# `TORCH_DISTRIBUTED_DEBUG=DETAIL` 会在每次集合通信之前检查所有 rank 调用的是否是同一个操作、形状
# 是否相同，并把“卡住”变成一个同时指出双方的错误。`torch.distributed` 在导入时读取这个变量，所以要在
# 进程启动前设置（`TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun ...`）；在已经运行的进程里，设置之后要调用
# `dist.set_debug_level_from_env()`，就像上面的函数那样。

# %% tags=["lesson"]
with errors.expect("collective_mismatch"):
    dl.spawn(mismatched, args=(True,), nprocs=2, quiet=True, timeout=30)

# %% [markdown] lang="en" tags=["lesson"]
# ### A rank that skips a collective
#
# Rank 1 skips the `all_reduce` (say, it has no batch left) and goes on working. With a
# short `timeout=` on the process group, rank 0 gets an error instead of a hang.
# `dist.monitored_barrier` goes further: rank 0 reports *which* rank did not arrive. It
# exists for Gloo only (`monitored_barrier` in `torch/distributed/distributed_c10d.py` raises
# `ValueError` for any other backend, shown at the end of the cell with the `fake` backend);
# a job on NCCL creates a second, Gloo group for it (`dist.new_group(backend="gloo")`).

# %% [markdown] lang="zh" tags=["lesson"]
# ### 跳过集合通信的 rank
#
# 假设 rank 1 已经没有剩余的批（batch），于是跳过了 `all_reduce`，继续往下执行。给进程组设置较短的
# `timeout=` 后，rank 0 得到的是错误而不是卡住。`dist.monitored_barrier` 更进一步：rank 0 会报
# 告*哪一个* rank 没有到达。它只支持 Gloo：对其他任何后端（backend）
# ，`torch/distributed/distributed_c10d.py` 中的 `monitored_barrier` 都会抛出 `ValueError`（单
# 元最后用 `fake` 后端演示）；使用 NCCL 的任务要为它另建一个 Gloo 进程组
# （`dist.new_group(backend="gloo")`）。

# %% tags=["lesson"]
def skips(rank):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        dist.all_reduce(torch.ones(3))
    else:
        time.sleep(5)  # busy elsewhere


def late_for_barrier(rank):
    dist.init_process_group("gloo")
    if rank == 1:
        time.sleep(4)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))


with errors.expect("recv_timeout"):
    dl.spawn(skips, nprocs=2, quiet=True, timeout=30)
with errors.expect("monitored_barrier"):
    dl.spawn(late_for_barrier, nprocs=2, quiet=True, timeout=30)


def monitored_barrier_elsewhere(rank):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
    try:
        dist.monitored_barrier()
    except ValueError as exc:
        return f"ValueError: {exc}"


print(dl.spawn(monitored_barrier_elsewhere, nprocs=1)[0])

# %% [markdown] lang="en" tags=["lesson"]
# ### Shapes that differ across ranks
#
# Rank 0 all-reduces 3 numbers, rank 1 all-reduces 4. With gloo this does not even hang:
# rank 0 *returns a result*, and rank 1 then fails because its peer left. With DETAIL, the
# shapes are compared first.

# %% [markdown] lang="zh" tags=["lesson"]
# ### 各 rank 的形状不同
#
# rank 0 对 3 个数做全归约（all-reduce），rank 1 对 4 个数做全归约。在 gloo 上这甚至不会卡住
# ：rank 0 *返回了一个结果*，随后 rank 1 因为对端已退出而失败。开启 DETAIL 后，会先比较形状。

# %% tags=["lesson"]
def uneven(rank, detail=False):
    if detail:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()
    dist.init_process_group("gloo")
    t = torch.ones(3 + rank) * (rank + 1)
    dist.all_reduce(t)
    print("result:", t.tolist())


with errors.expect("peer_closed") as caught:
    dl.spawn(uneven, nprocs=2, quiet=True, timeout=30)
print("rank 0 printed:", caught.error.outputs[0][0].strip())
with errors.expect("shape_mismatch"):
    dl.spawn(uneven, args=(True,), nprocs=2, quiet=True, timeout=30)

# %% [markdown] lang="en" tags=["lesson"]
# ### Address already in use; a rank that crashes
#
# A port that another program holds cannot host rank 0's store. And when one rank raises,
# the others see only "connection closed by peer": the root cause is the first failure.

# %% [markdown] lang="zh" tags=["lesson"]
# ### 地址已被占用；崩溃的 rank
#
# 如果端口已被其他程序占用，rank 0 就无法在上面启动 store。而当某个 rank 抛出异常时，其他 rank 只会看到
# “connection closed by peer”：根本原因是最早出现的那个错误。

# %% tags=["lesson"]
def on_port(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with errors.expect("address_in_use"):
        dl.spawn(on_port, args=(busy.getsockname()[1],), nprocs=1, quiet=True, timeout=30)


def crashes(rank):
    dist.init_process_group("gloo")
    if rank == 1:
        raise RuntimeError("simulated crash on rank 1")
    dist.all_reduce(torch.ones(1))


try:
    dl.spawn(crashes, nprocs=2, quiet=True, timeout=30)
except dl.DistributedError as err:
    print("first failure:", err.failures[0].reason)

# %% [markdown] lang="en" tags=["lesson"]
# ### Unused parameters in DDP
#
# A layer that does not take part in the loss gets no gradient, and DDP's second step fails.
# `TORCH_DISTRIBUTED_DEBUG=INFO` adds the parameter names. The fix is to use every
# parameter, or `find_unused_parameters=True` (an extra pass over the graph each step).

# %% [markdown] lang="zh" tags=["lesson"]
# ### DDP 中未使用的参数
#
# 没有参与计算损失（loss）的层得不到梯度（gradient），DDP 的第二步就会失败
# 。`TORCH_DISTRIBUTED_DEBUG=INFO` 会补上参数名。解决办法是让每个参数都参与计算，或者使用
# `find_unused_parameters=True`（每步多遍历一次计算图）。

# %% tags=["lesson"]
class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.unused_head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.body(x)  # unused_head never takes part


def train_two_steps(rank, find_unused):
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "INFO"
    dist.set_debug_level_from_env()
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(TwoHeads(), find_unused_parameters=find_unused)
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
    return "two steps done"


with errors.expect("unused_parameters") as caught:
    dl.spawn(train_two_steps, args=(False,), nprocs=2, quiet=True, timeout=60)
print([line for line in errors.text_of(caught.error).splitlines() if "Parameters which" in line][0])
print(dl.spawn(train_two_steps, args=(True,), nprocs=2, quiet=True, timeout=60))

# %% [markdown] lang="en" tags=["lesson"]
# ### Three common small slips, run
#
# - `DDP(model, device_ids=[i], output_devices=i)`: the keyword is `output_device`
#   (singular). Python refuses the misspelt one before anything is built.
# - `model.module().state_dict()`: `.module` is an attribute holding your model, so
#   `model.module()` *calls* the model with no input and fails; write
#   `model.module.state_dict()`.
# - "the rank is the process's priority": it is only an index, as section 1's `nice` column
#   showed.

# %% [markdown] lang="zh" tags=["lesson"]
# ### 三个常见的小错误，运行一下
#
# - `DDP(model, device_ids=[i], output_devices=i)`：关键字是 `output_device`（单数）。Python 在构造任
#   何东西之前就会拒绝拼错的关键字。
# - `model.module().state_dict()`：`.module` 是保存原模型的属性，`model.module()` 会在没有输入的
#   情况下*调用*模型并失败；应写 `model.module.state_dict()`。
# - “rank 是进程的优先级”：rank 只是一个编号，见第 1 节表中的 `nice` 列。

# %% tags=["lesson"]
def three_slips(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(torch.nn.Linear(4, 2))
    try:
        DDP(torch.nn.Linear(4, 2), output_devices=None)
    except TypeError as e:
        print("output_devices=  ->", type(e).__name__, str(e).split("got ")[-1])
    try:
        ddp.module().state_dict()
    except TypeError as e:
        print("module()         ->", type(e).__name__, str(e).split(".forward() ")[-1])
    return sorted(ddp.module.state_dict())


print("model.module.state_dict() keys:", dl.spawn(three_slips, nprocs=2, backend="gloo")[0])

# %% [markdown] lang="en" tags=["lesson"]
# ### More logging: `TORCH_CPP_LOG_LEVEL` and `NCCL_DEBUG`
#
# `TORCH_CPP_LOG_LEVEL=INFO` shows the C++ side of c10d (stores, sockets, rendezvous).
# `NCCL_DEBUG=INFO` prints NCCL's choices (interfaces, rings, transports) on GPU machines.

# %% [markdown] lang="zh" tags=["lesson"]
# ### 更多日志：`TORCH_CPP_LOG_LEVEL` 与 `NCCL_DEBUG`
#
# `TORCH_CPP_LOG_LEVEL=INFO` 会显示 c10d 的 C++ 部分（store、套接字、会合）
# 。`NCCL_DEBUG=INFO` 在 GPU 机器上打印 NCCL 的选择（网卡、环、传输方式）。

# %% tags=["lesson"]
probe = ("import torch.distributed as dist; "
         f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{ld.free_port()}', "
         "rank=0, world_size=1); dist.destroy_process_group()")
r = ld.run([sys.executable, "-c", probe], timeout=60, env={"TORCH_CPP_LOG_LEVEL": "INFO"})
r.show(pattern="c10d|socket|store", limit=6)
if torch.cuda.is_available() and dist.is_nccl_available():
    print(dl.tr(en="A GPU is here: run NCCL jobs with NCCL_DEBUG=INFO to see NCCL's log.",
                zh="这里有 GPU：用 NCCL_DEBUG=INFO 运行 NCCL 任务即可看到 NCCL 的日志。"))
else:
    print(dl.tr(en="Skipped: no GPU here. NCCL_DEBUG=INFO needs the nccl backend.",
                zh="已跳过：这里没有 GPU。NCCL_DEBUG=INFO 需要 nccl 后端。"))

# %% [markdown] lang="en" tags=["lesson"]
# ### torchrun's own help: error files and logs
#
# When a worker raises, the agent's `ChildFailedError` report names the rank but says
# `error_file: <N/A>` and "To enable traceback see ...": the exception itself stayed in the
# worker. Decorate your entry function with `@record`
# (`from torch.distributed.elastic.multiprocessing.errors import record`): it writes the
# exception and its traceback as JSON to the file named by `TORCHELASTIC_ERROR_FILE`, which
# the agent sets for each worker and reads into the report's *Root Cause*
# (`torch/distributed/elastic/multiprocessing/errors/__init__.py`). For many ranks, four
# torchrun flags keep the output readable; the cell prints their help from
# `torch/distributed/run.py`:

# %% [markdown] lang="zh" tags=["lesson"]
# ### torchrun 自带的帮助：错误文件与日志
#
# worker 抛出异常时，代理的 `ChildFailedError` 报告会指出是哪个 rank，但写着
# `error_file: <N/A>` 和“To enable traceback see ...”：异常本身留在了 worker 里。给入口函数加
# 上 `@record`（`from torch.distributed.elastic.multiprocessing.errors import record`）：它把
# 异常及其调用栈以 JSON 格式写入 `TORCHELASTIC_ERROR_FILE` 指定的文件；代理为每个 worker 设置
# 这个变量，并把文件内容读进报告的 *Root
# Cause*（`torch/distributed/elastic/multiprocessing/errors/__init__.py`）。rank 多的时候，下
# 面四个 torchrun 参数能让输出保持可读；单元从 `torch/distributed/run.py` 打印它们的帮助：

# %% tags=["lesson"]
from torch.distributed.run import get_args_parser

for action in get_args_parser()._actions:
    if {"--log-dir", "--redirects", "--tee", "--local-ranks-filter"} & set(action.option_strings):
        print(" ".join(action.option_strings), "->", " ".join(action.help.split())[:150])

# %% [markdown] lang="en" tags=["lesson"]
# ### NCCL's watchdog and flight recorder
#
# On NCCL a hang is found by a *watchdog* thread of `ProcessGroupNCCL`: it checks the running
# collectives against the timeout (10 minutes by default), and when one is late it aborts
# the communicator and takes the process down. Before that it can write what each rank was
# doing: the **flight recorder** keeps the last `TORCH_FR_BUFFER_SIZE` collective events
# per process (default 2000; torch 2.13 also reads the older name
# `TORCH_NCCL_TRACE_BUFFER_SIZE`, `FlightRecorder.hpp`), and with
# `TORCH_NCCL_DUMP_ON_TIMEOUT=1` the dump goes to one file per rank, named by
# `TORCH_FR_DUMP_TEMP_FILE` (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` in older releases). In
# torch 2.13 both are on by default (`getCvarBool(TORCH_NCCL_DUMP_ON_TIMEOUT, true)` in
# `ProcessGroupNCCL.cpp`), but older releases had other defaults: set them yourself where
# the version may vary. Compare the files with
# `python -m torch.distributed.flight_recorder.fr_trace` (`torch/distributed/flight_recorder/`):
# it points at the rank that did not join a collective, like `monitored_barrier` for Gloo.
# The variables are in `torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp`. All of this
# needs NCCL and a GPU; not run here.

# %% [markdown] lang="zh" tags=["lesson"]
# ### NCCL 的看门狗（watchdog）与飞行记录器（flight recorder）
#
# 在 NCCL 上，卡住是由 `ProcessGroupNCCL` 的*看门狗*线程发现的：它按超时（默认 10 分钟）检
# 查正在运行的集合通信，一旦某个超时，就中止通信器并结束进程。在此之前，它可以把每个 rank 正在
# 做什么记下来：**飞行记录器**在每个进程里保留最近 `TORCH_FR_BUFFER_SIZE` 个集合通信
# 事件（默认 2000；torch 2.13 也读取旧名字 `TORCH_NCCL_TRACE_BUFFER_SIZE`，见
# `FlightRecorder.hpp`）；设置 `TORCH_NCCL_DUMP_ON_TIMEOUT=1` 后，每个 rank 各把记录转
# 储到一个文件，文件名由 `TORCH_FR_DUMP_TEMP_FILE` 指定（旧版本中是
# `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`）。torch 2.13 默认两者都打开（`ProcessGroupNCCL.cpp` 中的
# `getCvarBool(TORCH_NCCL_DUMP_ON_TIMEOUT, true)`），但旧版本的默认值不同：版本可能不一致的地
# 方，请自己设置。用
# `python -m torch.distributed.flight_recorder.fr_trace`（`torch/distributed/flight_recorder/`）
# 比较这些文件：它会指出哪个 rank 没有参加某次集合通信，作用类似 Gloo 的 `monitored_barrier`。
# 这些变量定义在 `torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp` 里。以上都需要 NCCL 和
# GPU，这里不运行。

# %% [markdown] lang="en" tags=["lesson"]
# ### The table
#
# Every row below was triggered for real in this chapter (except the GPU-only one, unless
# you have a GPU).

# %% [markdown] lang="zh" tags=["lesson"]
# ### 速查表
#
# 下表的每一行都在本章里实际触发过；只在 GPU 上出现的那一行，要有 GPU 才会触发。

# %% tags=["lesson"]
pool.shutdown()
errors.show_table()

# %% [markdown] lang="en" tags=["lesson"]
# ## 6. Two hosts for real
#
# Section 3's two "nodes" shared one network stack, one hostname and one loopback, so the
# failures that make multi-node training painful could not show. `ddp_lab.cluster.hosts` builds
# real ones on this machine: each host is a Linux **network namespace** with its own address
# (`10.77.0.1`, `10.77.0.2`), its own interface `eth0` (a veth pair plugged into a bridge),
# its own loopback, its own `/etc/hosts` and its own hostname (`host0`, `host1`). One call
# builds them and always removes them (`with hosts.cluster(2) as c:`); in a terminal,
# `ddp-lab hosts up 2` / `status` / `down`. It needs root: where the machine does not allow
# it, the cells below show the stored output of a real run (with its date) instead.
#
# The next cell starts every run of this section in the background (two at a time, each on
# two fresh hosts, with 10-second timeouts); the cells below wait for their own one.

# %% [markdown] lang="zh" tags=["lesson"]
# ## 6. 真正的两台主机
#
# 第 3 节的两个“节点”共用一个网络栈、一个主机名和一个回环接口，所以让多节点训练头疼的那些故障
# 根本不会出现。`ddp_lab.cluster.hosts` 在这台机器上造出真正分开的主机：每台主机是一个 Linux
# **网络命名空间**（network namespace），有自己的地址（`10.77.0.1`、`10.77.0.2`）、自己的网卡
# `eth0`（一对 veth，另一端接在网桥上）、自己的回环接口、自己的 `/etc/hosts` 和自己的主机名
# （`host0`、`host1`）。一次调用就能创建，并且一定会删除（`with hosts.cluster(2) as c:`）；
# 在终端里则是 `ddp-lab hosts up 2` / `status` / `down`。这需要 root 权限：如果机器不允许，
# 下面的单元会改为展示一次真实运行保存下来的输出（带日期）。
#
# 下一个单元在后台启动本节的所有运行（每次两个，每个都在两台新建的主机上，超时都是 10 秒）；
# 后面的单元各自等待自己那一次的结果。

# %% tags=["lesson"]
from ddp_lab.cluster import hosts
from ddp_lab.labs import two_hosts as th

gallery = th.Gallery()
dl.show_source(hosts.Cluster.up)

# %% [markdown] lang="en" tags=["lesson"]
# Each host answers with its own name, address and `/etc/hosts`, and `ddp-lab doctor` (its
# `gloo_interface` line) says which interface gloo will bind to and why. The `/etc/hosts` is
# the one Debian's installer writes: the machine's own name on `127.0.1.1`. Remember that line.

# %% [markdown] lang="zh" tags=["lesson"]
# 每台主机都报出自己的主机名、地址和 `/etc/hosts`；`ddp-lab doctor`（它的 `gloo_interface` 一行）
# 说明 gloo 会绑定到哪块网卡以及原因。这里的 `/etc/hosts` 和 Debian 安装程序写的一样：本机的名字
# 指向 `127.0.1.1`。请记住这一行。

# %% tags=["lesson"]
gallery.show("look", limit=8)

# %% [markdown] lang="en" tags=["lesson"]
# ### Chapter 08's program on two hosts
#
# One `torchrun` per host, one worker each, **static rendezvous**: the same `--nnodes=2`,
# `--master-addr=10.77.0.1` (host0's address) and `--master-port` on both, `--node-rank` 0
# and 1, and `GLOO_SOCKET_IFNAME=eth0` (why, in a moment). For comparison the same program
# runs on one host with two workers: the world size is 2 both times, so both runs see the
# same batches and reach the same accuracy.

# %% [markdown] lang="zh" tags=["lesson"]
# ### 第 08 章的程序跑在两台主机上
#
# 每台主机一个 `torchrun`，各一个 worker，**静态会合**（static rendezvous）：两边的
# `--nnodes=2`、`--master-addr=10.77.0.1`（host0 的地址）和 `--master-port` 相同
# ，`--node-rank` 分别为 0 和 1，并设置 `GLOO_SOCKET_IFNAME=eth0`（原因马上就讲）。作为对照，
# 同一个程序在一台主机上用两个 worker 再跑一次：两次的 world size 都是 2，所以看到的批完全相同
# ，准确率也相同。

# %% tags=["lesson"]
gallery.show("one_host")
gallery.show("static")
one, two = gallery["one_host"], gallery["static"]
print("one host:", one.nodes[0].accuracy(), "% / two hosts:", two.nodes[0].accuracy(), "%")
assert one.nodes[0].accuracy() == two.nodes[0].accuracy()

# %% [markdown] lang="en" tags=["lesson"]
# With the **c10d rendezvous** (`--rdzv-backend=c10d --rdzv-endpoint=host0:PORT`) there is no
# `--node-rank`. This run uses an `/etc/hosts` that lists both hosts with their real
# addresses, and no `GLOO_SOCKET_IFNAME`: with names that resolve properly, neither is needed.

# %% [markdown] lang="zh" tags=["lesson"]
# 使用 **c10d 会合**（`--rdzv-backend=c10d --rdzv-endpoint=host0:PORT`）时没有 `--node-rank`。
# 这次运行用的 `/etc/hosts` 列出了两台主机的真实地址，也没有设置 `GLOO_SOCKET_IFNAME`：名字能
# 正确解析时，两者都不需要。

# %% tags=["lesson"]
gallery.show("c10d")
c10d = gallery["c10d"]
assert c10d.nodes[0].accuracy() == two.nodes[0].accuracy()

# %% [markdown] lang="en" tags=["lesson"]
# Both hosts exit with code 0, yet host1's log (and some of the Slurm jobs' logs below)
# ends with C++ frames of a `DistNetworkError` and "The node
# '...' has failed to shutdown the rendezvous 'job' due to an error of type
# RendezvousConnectionError". It is harmless when the exit code is 0: the store lived in
# host0's agent, which finished first and took the store with it, and host1's agent, on
# its way out, could no longer mark the rendezvous closed.

# %% [markdown] lang="zh" tags=["lesson"]
# 两台主机的退出码都是 0，但 host1 的日志（以及下面某些 Slurm 作业的日志）末尾有一段
# `DistNetworkError` 的 C++ 栈帧，以及“The node '...' has failed to shutdown the rendezvous
# 'job' due to an error of type RendezvousConnectionError”。只要退出码是 0，这段报错就无
# 害：store 在 host0 的代理里，host0 先结束，store 也随之消失；host1 的代理在退出前想把会合标记
# 为关闭，却已经连不上 store 了。

# %% [markdown] lang="en" tags=["lesson"]
# ### Failure gallery, across two hosts
#
# **Gloo on the loopback.** The same static job without `GLOO_SOCKET_IFNAME`: gloo asks for
# the hostname, resolves it, and binds to the first address it can bind (`createDefaultDevice`
# in `torch/csrc/distributed/c10d/ProcessGroupGloo.cpp`; only when the name does not resolve
# does it fall back to `127.0.0.1` with the warning "Unable to resolve hostname to a (local)
# address"). Here each hostname resolves to `127.0.1.1`, so every rank advertises that
# loopback address in the store, and rank 1, dialing rank 0 at `127.0.1.1`, reaches its *own*
# loopback, where nobody listens:

# %% [markdown] lang="zh" tags=["lesson"]
# ### 故障集锦：跨两台主机
#
# **gloo 用上了回环接口**。同一个静态任务，但不设置 `GLOO_SOCKET_IFNAME`：gloo 取得主机名，解
# 析它，并绑定到第一个能绑定的地址（`torch/csrc/distributed/c10d/ProcessGroupGloo.cpp` 的
# `createDefaultDevice`；只有名字解析不了时，才会退回 `127.0.0.1`，并警告“Unable to resolve
# hostname to a (local) address”）。这里每个主机名都解析为 `127.0.1.1`，于是每个 rank 在 store
# 里登记的都是这个回环地址；rank 1 按 `127.0.1.1` 去连 rank 0，连到的却是它*自己*的回环接口，
# 那里没有人在监听：

# %% tags=["lesson"]
gallery.show("loopback", limit=1)

# %% [markdown] lang="en" tags=["lesson"]
# `Connection refused, remote=[127.0.1.1]` is the tell. The fix is either
# `GLOO_SOCKET_IFNAME=eth0` on every host (the static run above) or an `/etc/hosts` where each
# name maps to its address on the network between the nodes (the c10d run above).
# `ddp-lab doctor` prints the choice on each host (see its `gloo_interface` line above).
# NCCL chooses differently: it does not resolve the hostname but picks interfaces by name,
# `ib*` first, then any but `docker*`, `lo*` and `virbr*`, and only when there is none of
# those `docker*`, then `lo*`, then `virbr*` (`ncclFindInterfaces` in NCCL's
# `src/misc/socket.cc`). On these hosts it would take `eth0`
# untold; it goes wrong when the first such interface is not the one between the nodes (a
# management network, a second card), and then `NCCL_SOCKET_IFNAME` names the right one.
# The doctor's `nccl_interface` line applies that rule to your machine (no GPU here: NCCL
# itself does not run). That interface carries NCCL's bootstrap and its socket transport
# only. On an InfiniBand or RoCE cluster the data goes through the verbs devices NCCL finds
# (`NCCL_IB_HCA` restricts them; `NCCL_IB_DISABLE=1` falls back to sockets; on RoCE,
# `NCCL_IB_GID_INDEX` picks which GID of the port to use), so
# `NCCL_SOCKET_IFNAME` does not pick the fabric; `NCCL_DEBUG=INFO
# NCCL_DEBUG_SUBSYS=INIT,NET` logs which network NCCL uses (`NET/IB` or `NET/Socket`) and
# on which devices. Needs NCCL and GPUs; not run here.
#
# **A c10d endpoint that no agent hosts.** With Debian's `/etc/hosts` and
# `--rdzv-endpoint=10.77.0.1:PORT`, the c10d backend starts the store only on an agent that
# recognises the endpoint as itself (`_matches_machine_hostname` in
# `torch/distributed/elastic/rendezvous/utils.py` compares it to the addresses the hostname
# resolves to). `host0` resolves to `127.0.1.1`, so nobody hosts it and every agent waits for
# a store that never starts. Fix: name the endpoint by a hostname that resolves to it, or
# pass `--rdzv-conf is_host=1` on the node that should host it.

# %% [markdown] lang="zh" tags=["lesson"]
# 关键线索是 `Connection refused, remote=[127.0.1.1]`。解决办法：要么在每台主机上设置
# `GLOO_SOCKET_IFNAME=eth0`（上面的静态会合运行），要么让 `/etc/hosts` 把每个名字映射到它在节点
# 之间那张网络上的地址（上面的 c10d 运行）。`ddp-lab doctor` 会在每台主机上打印这个选择（见上面
# 的 `gloo_interface` 一行）。NCCL 的选法不同：它不解析主机名，而是按网卡名挑选，先找 `ib*`，再
# 找 `docker*`、`lo*`、`virbr*` 以外的网卡，都没有时才依次用 `docker*`、`lo*`、`virbr*`（NCCL
# `src/misc/socket.cc` 中的 `ncclFindInterfaces`）。在这两台主机上，不用指定它也会选 `eth0`；出问题的情形是排在最前面
# 的那块网卡并不在节点之间的网络上（比如管理网络、第二块网卡），这时用 `NCCL_SOCKET_IFNAME` 指
# 定正确的网卡。doctor 的 `nccl_interface` 一行会把这条规则套用到你的机器上（这里没有 GPU，NCCL
# 本身不运行）。这块网卡只承载 NCCL 的引导连接（bootstrap）和套接字（socket）传输。在 InfiniBand 或
# RoCE 集群上，数据走的是 NCCL 找到的 verbs 设备（`NCCL_IB_HCA` 用来限定范围；设置
# `NCCL_IB_DISABLE=1` 则退回套接字；在 RoCE 上，`NCCL_IB_GID_INDEX` 选择使用端口的哪个
# GID），所以 `NCCL_SOCKET_IFNAME` 决定不了数据走哪张高速网
# 络；`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` 会在日志里写出 NCCL 用的是哪种网络（`NET/IB`
# 或 `NET/Socket`），以及用了哪些设备。这些需要 NCCL 和 GPU，这里不运行。
#
# **没有任何代理托管的 c10d 端点**。使用 Debian 的 `/etc/hosts` 和
# `--rdzv-endpoint=10.77.0.1:PORT` 时，c10d 后端只在认出“端点就是自己”的代理上启动
# store（`torch/distributed/elastic/rendezvous/utils.py` 的 `_matches_machine_hostname` 会把端
# 点和主机名解析出的地址做比较）。`host0` 解析为 `127.0.1.1`，所以谁也不托管 store，每个代理都
# 在等一个永远不会启动的 store。解决办法：用能解析到该地址的主机名作为端点，或者在应当托管它的
# 节点上传入 `--rdzv-conf is_host=1`。

# %% tags=["lesson"]
gallery.show("c10d_no_host", limit=2)

# %% [markdown] lang="en" tags=["lesson"]
# **`MASTER_ADDR=localhost` on the second host.** A habit from one-machine runs: host1 is told
# `--master-addr=localhost`, so its agent looks for the store on its own loopback. It times
# out (`--rdzv-conf timeout=10`, the static rendezvous's own timeout, read in
# `torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py`), and host0's store gives
# up waiting with `1/2 clients joined`. Fix: the same `--master-addr`, host0's address, on
# every node.

# %% [markdown] lang="zh" tags=["lesson"]
# **第二台主机上的 `MASTER_ADDR=localhost`**。这是单机运行留下的习惯：host1 拿到的是
# `--master-addr=localhost`，于是它的代理在自己的回环接口上找 store。它会超时
# （`--rdzv-conf timeout=10`，这是静态会合自己的超时，在
# `torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py` 里读取），而 host0 的 store
# 等不到人，报出 `1/2 clients joined`。解决办法：每个节点都用同一个 `--master-addr`，即 host0
# 的地址。

# %% tags=["lesson"]
gallery.show("localhost", limit=2)

# %% [markdown] lang="en" tags=["lesson"]
# **A firewall that drops the rendezvous port.** In host0's namespace,
# `nft add rule inet f input tcp dport PORT drop`. A dropped packet gets no answer at all (a
# rejected one would fail at once with "Connection refused"), so the agents learn nothing
# until their connect timeout, and then report a timeout, not a firewall. host0 fails the
# same way: its own agent reaches the store through `10.77.0.1` too, and the input chain
# filters that as well. When a multi-node job
# hangs and then times out on the master port, test that port from the other node
# (`nc -zv host0 PORT`) and open it.

# %% [markdown] lang="zh" tags=["lesson"]
# **防火墙丢弃了会合端口的包**。在 host0 的命名空间里执行
# `nft add rule inet f input tcp dport PORT drop`。被丢弃（drop）的包得不到任何回应（被拒绝的
# 包会立刻报“Connection refused”），所以各个代理直到连接超时才知道出了问题，而且报的是超时，不
# 是防火墙。host0 也以同样的方式失败：它自己的代理同样通过 `10.77.0.1` 连接 store，input 链也
# 会过滤这些包。多节点任务先卡住、然后在 `MASTER_PORT` 上超时时，请从另一个节点测试这个端口
# （`nc -zv host0 PORT`），然后放行它。

# %% tags=["lesson"]
gallery.show("firewall", limit=2)

# %% [markdown] lang="en" tags=["lesson"]
# **A node that joins late.** c10d rendezvous, host1 started only after host0 has given up:
# host0 waits `join_timeout` seconds (`--rdzv-conf join_timeout=10`; the default is 600, see
# the table in `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`) and raises
# `RendezvousTimeoutError`; the late node then finds no store. Fix: start the nodes together
# (a scheduler does), or give `join_timeout` room for the slowest node to start.

# %% [markdown] lang="zh" tags=["lesson"]
# **晚到的节点**。c10d 会合，host1 在 host0 放弃之后才启动：host0 等待 `join_timeout` 秒
# （`--rdzv-conf join_timeout=10`；默认是 600，见
# `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py` 里的表格）后抛出
# `RendezvousTimeoutError`；晚到的节点随后找不到 store。解决办法：让各节点同时启动（调度器就是
# 这么做的），或者把 `join_timeout` 设得足够长，让最慢的节点也来得及启动。

# %% tags=["lesson"]
gallery.show("late_node", limit=2)

# %% [markdown] lang="en" tags=["lesson"]
# **Mismatched `--nnodes`.** c10d rendezvous, host0 with `--nnodes=2` and host1 with
# `--nnodes=3`. Each agent applies *its own* `--nnodes` at the moment it joins
# (`_add_to_participants` in `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`
# completes the round when the participants reach its `max_nodes`), so the node that joins
# second decides. Here host1 joins second: two participants are not its three, the round
# never completes, and host0 times out (`RendezvousTimeoutError`). The store of the c10d
# rendezvous lived in host0's agent, so host1 then loses it: `DistNetworkError: Failed to
# recv, got 0 bytes. Connection was likely closed`, then `RendezvousConnectionError: The
# connection to the C10d store has failed`:

# %% [markdown] lang="zh" tags=["lesson"]
# **`--nnodes` 不一致**。c10d 会合，host0 用 `--nnodes=2`，host1 用 `--nnodes=3`。每个代理在
# 加入的那一刻按*它自己*的 `--nnodes` 判断（`torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`
# 的 `_add_to_participants` 在参与者数达到它的 `max_nodes` 时宣布这一轮完成），所以由第二个加入
# 的节点说了算。这里 host1 第二个加入：两个参与者不够它要的三个，这一轮永远完成不了，host0 超时
# （`RendezvousTimeoutError`）。c10d 会合的 store 在 host0 的代理里，所以 host1 随后就失去了它：
# 先是 `DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed`，然后是
# `RendezvousConnectionError: The connection to the C10d store has failed`：

# %% tags=["lesson"]
gallery.show("nnodes", limit=2)

# %% [markdown] lang="en" tags=["lesson"]
# The same two command lines, but host0 joins second (host1 starts first and hosts the
# store): two participants are host0's two, it completes the round, and the job trains on two
# nodes without a word about the third node host1 asked for. Neither outcome mentions
# `--nnodes`: compare the command lines of every node first, and read the world size in
# rank 0's first line.

# %% [markdown] lang="zh" tags=["lesson"]
# 同样的两条命令行，但这次 host0 第二个加入（host1 先启动并托管 store）：两个参与者正好是
# host0 要的两个，它宣布这一轮完成，任务就在两个节点上训练，对 host1 要求的第三个节点只字不提。
# 两种结果都没有提到 `--nnodes`：请先逐一比较每个节点的命令行，并看 rank 0 第一行里的 world
# size。

# %% tags=["lesson"]
gallery.show("nnodes_silent", limit=2)
for name in th.EXPECT:  # every run above showed the line it is about
    assert gallery[name].key_lines(), name
if not gallery.reason:
    print("namespaces left:", [n for n in hosts.namespaces() if n in gallery.netns])

# %% [markdown] lang="en" tags=["lesson"]
# One more failure you may meet in a job that *did* train: a worker dies with SIGABRT,
# "terminate called without an active exception", after its last line of output, and
# torchrun reports the job failed. Chapter 08's program, when it lets Python shut down the
# ordinary way, does that in about one run in thirty. The cause is in PyTorch, not in the job:
# `destroy_process_group` does not free a gloo group that a DDP model used, so its threads
# live on, and one of them may still be releasing the last collective while Python shuts
# down. So the program ends its workers with `os._exit`; the cell shows the reasoning, and `tests/test_train.py` checks both halves.
# Before you copy it into a real job: `os._exit` also skips `atexit` handlers and the
# flushing of logs, so call it only after every writer is closed (log files, TensorBoard,
# experiment trackers).

# %% [markdown] lang="zh" tags=["lesson"]
# 还有一种故障出现在*已经*训练完的任务里：某个 worker 打印完最后一行之后以 SIGABRT 终止，报
# “terminate called without an active exception”，torchrun 于是报告任务失败。第 08 章的程序如果
# 让 Python 照常退出，大约每运行三十次就会遇到一次。问题出在 PyTorch，而不在任务本身：DDP 用过的 gloo 进程组，
# `destroy_process_group` 并不会释放，它的线程继续存活；Python 退出时，其中一个线程可能还在
# 清理最后一次集合通信留下的对象。所以程序用 `os._exit` 结束 worker；下面的单元展示了完整的推理，
# `tests/test_train.py` 对这两点都做了检查。把它抄进真实的任务之前请注意：`os._exit` 也会跳过
# `atexit` 处理函数和日志的刷新，所以只能在所有写入者（日志文件、TensorBoard、实验跟踪工具）都
# 关闭之后再调用。

# %% tags=["lesson"]
from ddp_lab.tools import train as ddp_train

dl.show_source(ddp_train.exit_without_finalizing)

# %% [markdown] lang="en" tags=["lesson"]
# ## 7. The same program under Slurm
#
# On a university or lab cluster you do not type one `torchrun` per node: you write a job
# script and hand it to the scheduler, which picks the nodes and starts your tasks on them.
# Slurm is the common one. Its parts: `slurmctld`, the controller, on one machine; `slurmd` on
# every node, which starts the tasks; `munged`, which signs every message between them with a
# shared key. You submit a script with `sbatch`; inside it, `srun` starts one *task* per slot on
# every node of the allocation. `ddp_lab.cluster.slurm` runs exactly these daemons (Debian's
# `slurm-wlm` and `munge`) on the two hosts of section 6: `slurmctld` on host0, one `slurmd`
# on each host (`ddp-lab slurm up` / `status` / `down` in a terminal). Without root or Slurm
# the cells show a stored real run.
#
# The next cell builds the cluster and submits four job scripts at once, in the background:
# the right one and three common mistakes. This is the right one, chapter 08's program:

# %% [markdown] lang="zh" tags=["lesson"]
# ## 7. 同一个程序交给 Slurm 运行
#
# 在高校或实验室的集群上，你不会在每个节点上手敲一遍 `torchrun`：你写一个作业脚本交给调度器，
# 由它挑选节点、在节点上启动你的任务。最常见的调度器是 Slurm。它由三部分组成：一台机器上的
# 控制器 `slurmctld`；每个节点上的 `slurmd`，负责启动任务；`munged`，用一把共享密钥给它们之间的
# 每条消息签名。用 `sbatch` 提交脚本；在脚本里，`srun` 在分配到的每个节点上按槽位各启动一个
# *任务*（task）。`ddp_lab.cluster.slurm` 在第 6 节的两台主机上运行的正是这些守护进程（Debian 的
# `slurm-wlm` 和 `munge`）：`slurmctld` 在 host0 上，每台主机各一个 `slurmd`（在终端里是
# `ddp-lab slurm up` / `status` / `down`）。没有 root 权限或没有安装 Slurm 时，下面的单元会
# 展示一次保存下来的真实运行。
#
# 下一个单元搭建集群，并在后台一次提交四个作业脚本：一个正确的，三个常见的错误写法。下面是
# 正确的那个，运行第 08 章的程序：

# %% tags=["lesson"]
from ddp_lab.labs import slurm_jobs
from ddp_lab.cluster import slurm

jobs = slurm_jobs.Jobs()
print(slurm.script("ddp08", folder="$HOME/logs"))

# %% [markdown] lang="en" tags=["lesson"]
# Line by line: `--nodes=2` asks for two nodes; `--ntasks-per-node=1` makes `srun` start **one
# task per node**, and that task is `torchrun`, which starts the node's workers itself
# (`--nproc-per-node=2`: two per node, standing in for two GPUs); `--cpus-per-task=2` gives
# that one task the node's CPUs, and `srun` asks for them again
# (`--cpus-per-task="$SLURM_CPUS_PER_TASK"`): from Slurm 22.05, the version Debian 12 ships,
# `srun` no longer inherits `--cpus-per-task` from `sbatch` (the `sbatch` man page: "srun will
# not inherit the --cpus-per-task value requested by salloc or sbatch"; later releases went
# back). On a cluster that binds tasks to CPUs (`task/affinity` or `task/cgroup`), without it
# torchrun and all its workers share one CPU. This small cluster binds nothing
# (`TaskPlugin=task/none`), so it cannot show the difference. `SLURM_JOB_NODELIST` holds the
# allocation in Slurm's compact form (`host[0-1]`); `scontrol show hostnames` expands it, and
# the first node hosts the c10d rendezvous. `--nnodes="$SLURM_NNODES"` and
# `--rdzv-id="$SLURM_JOB_ID"` come from the job, so the script does not change when you ask
# for 4 nodes. The port is derived from the job id, so two jobs sharing a node do not fight
# over one. `sbatch` passes your environment on (`--export=ALL` is its default, see `man
# sbatch`): the `torchrun` and `PYTHONPATH` of this notebook reach the nodes.
#
# On a real GPU cluster the script also asks for the GPUs, as many per node as
# `--nproc-per-node`: `#SBATCH --gpus-per-node=2` (or the older `#SBATCH --gres=gpu:2`).
# This cluster has no GPUs to give, so its scripts leave that line out.
#
# `sinfo` shows the nodes, `squeue` the queue. Right after the four submissions, the first job
# runs (`ST` = `R`) and the others wait (`PD`, pending): each wants both nodes, so the next
# waits for `Resources` and the ones behind it for `Priority`:

# %% [markdown] lang="zh" tags=["lesson"]
# 逐行来看：`--nodes=2` 申请两个节点；`--ntasks-per-node=1` 让 `srun`
# **每个节点只启动一个任务**，这个任务就是 `torchrun`，由它自己启动本节点的
# worker（`--nproc-per-node=2`：每个节点两个，代表两块 GPU）；`--cpus-per-task=2` 把节点的 CPU
# 都分给这一个任务，`srun` 那一行还要再申请一次（`--cpus-per-task="$SLURM_CPUS_PER_TASK"`）：从
# Slurm 22.05（Debian 12 自带的版本）起，`srun` 不再继承 `sbatch` 的
# `--cpus-per-task`（`sbatch` 手册：“srun will not inherit the --cpus-per-task value requested
# by salloc or sbatch”；之后的版本又改了回去）。在把任务绑定到 CPU 的集群上（`task/affinity` 或
# `task/cgroup`），少了这一项，torchrun 和它的所有 worker 就会挤在一个 CPU 上。这个小集群不做绑
# 定（`TaskPlugin=task/none`），所以看不出区别。`SLURM_JOB_NODELIST` 以 Slurm 的紧凑写法
# （`host[0-1]`）给出分配到的节点，`scontrol show hostnames` 把它展开，由第一个节点托管 c10d 会
# 合。`--nnodes="$SLURM_NNODES"` 和 `--rdzv-id="$SLURM_JOB_ID"` 都取自作业本身，所以申请 4 个节
# 点时脚本不用改。端口由作业号算出，两个作业共用一个节点时不会抢同一个端口。`sbatch` 会把你的环
# 境变量带过去（默认就是 `--export=ALL`，见 `man sbatch`）：这个 notebook 里的 `torchrun` 和
# `PYTHONPATH` 在各个节点上同样可用。
#
# 在真正的 GPU 集群上，脚本还要申请 GPU，每个节点的数量与 `--nproc-per-node` 相同：
# `#SBATCH --gpus-per-node=2`（或者旧写法 `#SBATCH --gres=gpu:2`）。这个集群没有 GPU 可分，
# 所以它的脚本里没有这一行。
#
# `sinfo` 显示节点，`squeue` 显示队列。四个作业刚提交时，第一个在运行（`ST` 为 `R`），其余的在
# 等待（`PD`，pending）：每个作业都要占满两个节点，所以排第二的在等 `Resources`（资源），后面的
# 在等 `Priority`（优先级）：

# %% tags=["lesson"]
print(jobs.run.sinfo)
print(jobs.run.squeue)
job = jobs.show("ddp08")
assert job.state == "COMPLETED"

# %% [markdown] lang="en" tags=["lesson"]
# World size 4: two nodes × two workers, and the accuracy is the one the same 4 ranks reach
# on one host (the tests compare them). Only rank 0 prints; the job's output file collects
# the output of every task.
#
# ### Three mistakes, for real
#
# **One task per GPU, and torchrun in each.** Other launchers want one Slurm task per GPU
# (`--ntasks-per-node=2`), and `torchrun` also starts one process per GPU. Together:
# 2 nodes × 2 tasks × 2 workers = **8 ranks** for 4 GPUs. With `--nnodes="$SLURM_NTASKS"` the
# 4 agents meet and form a group of 8. Every (host, `LOCAL_RANK`) pair appears twice, so on
# GPUs two processes would pick the same device, and the global batch and scaled learning
# rate are twice what you planned:

# %% [markdown] lang="zh" tags=["lesson"]
# world size 为 4：两个节点 × 两个 worker，准确率和同样 4 个 rank 在一台主机上跑出来的一致
# （测试会比较两者）。只有 rank 0 打印；作业的输出文件收集了所有任务的输出。
#
# ### 三种常见错误，实际跑一遍
#
# **每块 GPU 一个任务，每个任务里再跑 torchrun**。有些启动方式要求每块 GPU 对应一个 Slurm 任务
# （`--ntasks-per-node=2`），而 `torchrun` 也会为每块 GPU 启动一个进程。两者叠加：2 个节点 ×
# 2 个任务 × 2 个 worker = **8 个 rank**，而 GPU 只有 4 块。用 `--nnodes="$SLURM_NTASKS"` 时，
# 4 个代理会合后组成一个 8 进程的组。每个（主机，`LOCAL_RANK`）组合都出现两次，在 GPU 上就是
# 两个进程选中同一块设备，全局批大小和按比例缩放的学习率也都变成计划的两倍：

# %% tags=["lesson"]
columns = ("host", "SLURM_PROCID", "SLURM_LOCALID", "GROUP_RANK", "LOCAL_RANK", "RANK",
           "WORLD_SIZE")
job = jobs.show("n_by_n", limit=0)
print(ld.format_table(job.records(), columns))
assert len(job.records()) == 8

# %% [markdown] lang="en" tags=["lesson"]
# **The same, with `--nnodes="$SLURM_NNODES"`.** Now 4 agents arrive for a rendezvous of 2
# nodes. The first two to arrive form the group (4 ranks; which two depends on timing, so
# both may even sit on one host) and train; the other two wait for a next round that never
# comes, and fail when the store goes away with the agent that hosted it. The job ends
# `FAILED` although training finished:

# %% [markdown] lang="zh" tags=["lesson"]
# **同样的写法，但用 `--nnodes="$SLURM_NNODES"`**。这时 4 个代理去赶一个只要 2 个节点的会合。
# 最先到的两个组成进程组（4 个 rank；是哪两个取决于先后，甚至可能都在同一台主机上）并开始训练；
# 另外两个在等一个永远不会到来的下一轮，托管 store 的代理退出、store 随之消失时，它们就失败了。
# 训练明明跑完了，作业却以 `FAILED` 结束：

# %% tags=["lesson"]
job = jobs.show("extra_agents", limit=0)
print(ld.format_table(job.records(), columns))
for line in job.lines(r"^srun: error|RendezvousConnectionError: The connection")[:3]:
    print("    " + line)
assert job.state == "FAILED"

# %% [markdown] lang="en" tags=["lesson"]
# **srun without torchrun.** One task per GPU, and each task runs the program directly
# (`srun python -m ddp_lab.tools.train`). Nobody sets `RANK`, `WORLD_SIZE` or `MASTER_ADDR`: a
# program that calls `init_process_group()` with the default `env://` fails with "environment
# variable RANK expected, but not set" (`_env_rendezvous_handler` in
# `torch/distributed/rendezvous.py`). Chapter 08's program is friendlier, and that hides the
# mistake: without `RANK` it runs as a one-rank job (`_ensure_launcher_env` in
# `ddp_lab/tools/train.py`). So four independent trainings run, each on the whole dataset with world
# size 1, and the job `COMPLETED`:

# %% [markdown] lang="zh" tags=["lesson"]
# **只用 srun，不用 torchrun**。每块 GPU 一个任务，每个任务直接运行程序
# （`srun python -m ddp_lab.tools.train`）。没有谁去设置 `RANK`、`WORLD_SIZE` 和 `MASTER_ADDR`：用默认
# `env://` 调用 `init_process_group()` 的程序会报“environment variable RANK expected, but not
# set”错误而失败（`torch/distributed/rendezvous.py` 的 `_env_rendezvous_handler`）。第 08 章的程序
# 更“友好”，反而掩盖了这个错误：没有 `RANK` 时它按单 rank 任务运行（`ddp_lab/tools/train.py` 的
# `_ensure_launcher_env`）。于是跑了四个互不相干的训练，每个都在整个数据集上以 world size 1 运行，
# 作业状态却是 `COMPLETED`：

# %% tags=["lesson"]
job = jobs.show("no_torchrun", limit=8)
assert len(job.lines(r"^world size 1,")) == 4

# %% [markdown] lang="en" tags=["lesson"]
# The fixes: one task per node with `torchrun` (the right script), or one task per GPU
# *without* `torchrun`; never both. In the second case the program builds its environment from
# Slurm's: `RANK` from `SLURM_PROCID`, `WORLD_SIZE` from `SLURM_NTASKS`, `LOCAL_RANK` from
# `SLURM_LOCALID`, `MASTER_ADDR` from the first host of `SLURM_JOB_NODELIST`, and
# `MASTER_PORT` derived from the job id as above (`env://` needs it too); start that step with
# `srun --kill-on-bad-exit=1`, so that one dead task ends the step instead of leaving the
# others waiting until the process group's timeout. Whatever you choose, the first line of
# rank 0's log (world size, global batch) tells you whether the job is the one you meant.
#
# **After the job.** `squeue` forgets a job soon after it ends; `sacct` reads the accounting
# database that `slurmdbd` keeps. This small cluster runs no database (plain `sacct` says
# accounting storage is disabled), so it keeps a job completion log instead
# (`JobCompType=jobcomp/filetxt` in its `slurm.conf`), which `sacct -c` reads: state, nodes
# and end time of each job. The cluster is gone afterwards, with its daemons and namespaces:

# %% [markdown] lang="zh" tags=["lesson"]
# 修正方法：要么每个节点一个任务并使用 `torchrun`（上面正确的脚本），要么每块 GPU 一个任务
# 但*不用* `torchrun`，两者不能同时用。第二种做法要由程序根据 Slurm 的环境变量自己设置这些变量：`RANK` 取
# `SLURM_PROCID`，`WORLD_SIZE` 取 `SLURM_NTASKS`，`LOCAL_RANK` 取
# `SLURM_LOCALID`，`MASTER_ADDR` 取 `SLURM_JOB_NODELIST` 里的第一台主机，`MASTER_PORT` 像上面那
# 样由作业号算出（`env://` 也需要它）；这种作业步要用 `srun --kill-on-bad-exit=1` 启动，这样一
# 个任务死掉，整个作业步就随之结束，不会让其他任务一直等到进程组超时。无论选哪种，rank 0 日志的
# 第一行（world size、全局批大小）都能告诉你这个作业是不是你想要的那个。
#
# **作业结束之后**。`squeue` 在作业结束后不久就不再显示它；`sacct` 读取的是 `slurmdbd` 维护的
# 记账数据库。这个小集群没有运行数据库（直接运行 `sacct` 会提示记账存储已禁用），所以改为记录
# 作业完成日志（`slurm.conf` 里的 `JobCompType=jobcomp/filetxt`），用 `sacct -c` 读取：每个作业的
# 状态、节点和结束时间。之后集群连同它的守护进程和命名空间都会被删除：

# %% tags=["lesson"]
print(jobs.run.sacct)
print("sacct:", jobs.run.sacct_db)
print("namespaces left:", jobs.left())


# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 1: fix a hanging evaluation (3 points)
#
# Each rank counts its correct predictions and its samples; the global accuracy is
# `sum(correct) / sum(total)`. The function below hangs. Run it, read the stacks the
# launcher prints, and say why.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 1：修复卡住的评估（3 分）
#
# 每个 rank 统计自己预测正确的样本数和样本总数；全局准确率是 `sum(correct) / sum(total)`。
# 下面的函数会卡住。运行它，阅读启动器打印的调用栈，并说明原因。

# %% tags=["exercise"]
def global_accuracy_buggy(correct, total):
    if dist.get_rank() == 0:  # only rank 0 reports the accuracy...
        counts = torch.tensor([correct, total], dtype=torch.float64)
        dist.all_reduce(counts)
        return (counts[0] / counts[1]).item()
    return None


def evaluate(rank, fn):
    accuracy = fn(correct=10 * (rank + 1), total=50)
    dist.barrier()  # the training loop goes on with its next collective
    return accuracy


try:
    dl.spawn(evaluate, args=(global_accuracy_buggy,), nprocs=2, backend="gloo", timeout=3)
except dl.DistributedTimeoutError as err:
    print(type(err).__name__)

# %% [markdown] lang="en" tags=["exercise"]
# Write `global_accuracy(correct, total)`: called on **every** rank, it returns the global
# accuracy (a float) on every rank. The graded cell runs it on hidden world sizes with a
# timeout, with totals that differ across ranks (so the mean of the ranks' accuracies is
# wrong).

# %% [markdown] lang="zh" tags=["exercise"]
# 编写 `global_accuracy(correct, total)`：**每个** rank 都会调用它，它要在每个 rank 上都返回全
# 局准确率（一个浮点数）。评分单元（graded cell）会在几种隐藏的 world size 下运行它并设置超时，
# 而且各 rank 的样本总数不同（所以对各 rank 的准确率求平均是错的）。

# %% tags=["exercise"]
def global_accuracy(correct, total):
    ### BEGIN SOLUTION
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)  # every rank takes part
    return (counts[0] / counts[1]).item()
    ### END SOLUTION

# %% tags=["exercise"]
print(dl.spawn(evaluate, args=(global_accuracy,), nprocs=2, backend="gloo", timeout=30))

# %% tags=["grade"] grade_id="09.global_accuracy" points=3
dl.grade("09.global_accuracy", global_accuracy)

# %% [markdown] lang="en" tags=["exercise"]
# ## Exercise 2: an all-reduce that fails together (3 points)
#
# Write `safe_all_reduce(tensor)`: like `dist.all_reduce(tensor)` (sum, in place), but it
# first checks that every rank has the same shape and dtype. If not, it must raise
# `ValueError` on **every** rank: a rank that raises alone leaves the others waiting in the
# all-reduce. Shapes may even differ in their number of dimensions. The graded cell checks
# the sum against `dist.all_reduce` and the errors on hidden world sizes.

# %% [markdown] lang="zh" tags=["exercise"]
# ## 练习 2：要错一起错的全归约（3 分）
#
# 编写 `safe_all_reduce(tensor)`：与 `dist.all_reduce(tensor)` 一样（求和、原地修改），但先检
# 查每个 rank 的形状和数据类型是否相同。如果不同，必须在**每个** rank 上抛出 `ValueError`：只
# 有一个 rank 抛出异常的话，其他 rank 就会一直等在全归约里。各 rank 形状的维数甚至都可能不同。
# 评分单元会在几种隐藏的 world size 下，对照 `dist.all_reduce` 检查求和结果，并检查报错行为。

# %% tags=["exercise"]
def safe_all_reduce(tensor):
    ### BEGIN SOLUTION
    meta = (tuple(tensor.shape), str(tensor.dtype))
    metas = [None] * dist.get_world_size()
    dist.all_gather_object(metas, meta)  # any shape length: objects, not tensors
    if len(set(metas)) > 1:
        raise ValueError(f"shapes or dtypes differ across ranks: {metas}")
    dist.all_reduce(tensor)
    ### END SOLUTION

# %% tags=["exercise"]
def try_safe(rank):
    t = torch.ones(2 + rank)
    try:
        safe_all_reduce(t)
    except ValueError as exc:
        return f"ValueError: {exc}"
    return t.tolist()


print(dl.spawn(try_safe, nprocs=2, backend="gloo", timeout=30))

# %% tags=["grade"] grade_id="09.safe_all_reduce" points=3
dl.grade("09.safe_all_reduce", safe_all_reduce)

# %% [markdown] lang="en"
# ## Summary
#
# - `torchrun` sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, ...; read them from the
#   environment. `torch.distributed.launch` is deprecated; `mp.spawn` sets nothing.
# - Multi-node: the same `--nnodes`/`--master_addr`/`--master_port` (or a c10d endpoint)
#   on every node; `WORLD_SIZE` spans all nodes.
# - Hangs come from ranks that disagree on the collectives; DETAIL, timeouts and
#   `monitored_barrier` (Gloo) or the flight recorder (NCCL) turn them into errors that
#   name the culprit.
# - On several nodes: the GPU index is `LOCAL_RANK`, the one saver is global rank 0.
# - On real separate hosts, gloo binds to what the hostname resolves to: set
#   `GLOO_SOCKET_IFNAME` (or fix `/etc/hosts`), use one `--master-addr` everywhere, open the
#   rendezvous port, start nodes together and give them the same `--nnodes`.
# - Under Slurm: one task per node (`--ntasks-per-node=1`) running `torchrun
#   --nproc-per-node=<GPUs>`, the endpoint from `SLURM_JOB_NODELIST`; or one task per GPU
#   without torchrun, `RANK`/`WORLD_SIZE`/`LOCAL_RANK` from `SLURM_PROCID`/`SLURM_NTASKS`/
#   `SLURM_LOCALID`. Never both. Check the world size in rank 0's first line.

# %% [markdown] lang="zh"
# ## 小结
#
# - `torchrun` 会设置 `RANK`、`LOCAL_RANK`、`WORLD_SIZE` 等变量；从环境变量读取它们
#   。`torch.distributed.launch` 已弃用；`mp.spawn` 什么都不设置。
# - 多节点：每个节点使用相同的 `--nnodes`/`--master_addr`/`--master_port`（或同一个 c10d 端点
#   ）；`WORLD_SIZE` 覆盖所有节点。
# - 卡住源于各 rank 对集合通信的调用不一致；DETAIL、超时和 `monitored_barrier`（Gloo）或
#   飞行记录器（NCCL）能把它变成指明元凶的错误。
# - 多节点时：GPU 编号用 `LOCAL_RANK`，只由全局 rank 0 负责保存。
# - 在真正分开的主机上，gloo 绑定到主机名解析出的地址：请设置 `GLOO_SOCKET_IFNAME`（或修好
#   `/etc/hosts`），所有节点用同一个 `--master-addr`，放行会合端口，让节点同时启动，并使用相同
#   的 `--nnodes`。
# - 在 Slurm 下：要么每个节点一个任务（`--ntasks-per-node=1`），运行
#   `torchrun --nproc-per-node=<GPU 数>`，端点取自 `SLURM_JOB_NODELIST`；要么每块 GPU 一个任务、
#   不用 torchrun，`RANK`/`WORLD_SIZE`/`LOCAL_RANK` 分别取 `SLURM_PROCID`/`SLURM_NTASKS`/
#   `SLURM_LOCALID`。两者不能同时用。看 rank 0 第一行里的 world size 来核对。


# %% [markdown] lang="en"
# ## Concept checks
#
# 4 questions on this chapter's ideas. Answer in the cell below, a letter for a choice and a
# number where one is asked, then run it: `dl.quiz` says which answers are right and explains
# each one, a wrong choice included. Work the numbers out from the chapter's models before you
# run anything. In the exercise notebook the same answers are graded (`09.concepts`,
# 2 points when all are right).
#
# **1.** A script is started with `torch.multiprocessing.spawn(fn, nprocs=4)` and calls `dist.init_process_group("gloo")` with no other argument. What happens?
#
# - (a) it works on one node only
# - (b) it works: `mp.spawn` sets `RANK` and `WORLD_SIZE`
# - (c) it fails: `mp.spawn` passes only the index `i` to `fn` and sets no environment variable, so `env://` finds nothing
# - (d) all four processes become rank 0
#
# **2.** A two-node job with 2 GPUs per node calls `torch.cuda.set_device(rank)` (the global rank). What happens on node 1?
#
# - (a) CUDA picks free GPUs
# - (b) ranks 2 and 3 ask for GPUs 2 and 3, which the node does not have: `invalid device ordinal`
# - (c) it works as on node 0
# - (d) both ranks share GPU 0
#
# **3.** A DDP model has a layer that the loss never uses, and `find_unused_parameters` is left `False`. What happens?
#
# - (a) nothing: that layer just gets no gradient
# - (b) DDP's second step fails: the reducer is still waiting for that layer's gradient from the first step
# - (c) it hangs forever
# - (d) the first forward raises
#
# **4.** On a Gloo group made with `timeout=timedelta(seconds=2)`, rank 1 skips an `all_reduce` that rank 0 calls. What does rank 0 get?
#
# - (a) rank 1's next collective's data
# - (b) its own tensor, unchanged
# - (c) an error after about 2 s instead of a hang
# - (d) a hang until the job is killed


# %% [markdown] lang="zh"
# ## 概念检查
#
# 关于本章要点的 4 道题。在下面的单元里作答：选择题填字母，要求数值的填数字，然后运行它：
# `dl.quiz` 会告诉你哪些答对了，并逐题解释，包括你选错的那个选项。数值题请先用本章的模型算出来，
# 再运行任何代码。练习笔记本会对同样的答案评分（`09.concepts`，全部答对得 2 分）。
#
# **1.** 脚本用 `torch.multiprocessing.spawn(fn, nprocs=4)` 启动，并且只调用 `dist.init_process_group("gloo")`，没有其他参数。会发生什么？
#
# - (a) 只在单节点上能运行
# - (b) 能运行：`mp.spawn` 设置了 `RANK` 和 `WORLD_SIZE`
# - (c) 失败：`mp.spawn` 只把编号 `i` 传给 `fn`，不设置任何环境变量，所以 `env://` 什么也找不到
# - (d) 四个进程都成为 rank 0
#
# **2.** 一个两节点、每节点 2 块 GPU 的作业调用 `torch.cuda.set_device(rank)`（全局 rank）。节点 1 上会发生什么？
#
# - (a) CUDA 自动挑空闲的 GPU
# - (b) rank 2 和 3 请求 GPU 2 和 3，而这个节点没有：`invalid device ordinal`
# - (c) 和节点 0 上一样正常
# - (d) 两个 rank 共用 GPU 0
#
# **3.** 一个 DDP 模型里有一层从未参与损失计算，而 `find_unused_parameters` 保持 `False`。会发生什么？
#
# - (a) 没事：那一层只是没有梯度
# - (b) DDP 的第二步报错：归约器还在等第一步里那一层的梯度
# - (c) 永远卡住
# - (d) 第一次前向就报错
#
# **4.** 在用 `timeout=timedelta(seconds=2)` 创建的 Gloo 进程组上，rank 0 调用了 `all_reduce`，而 rank 1 跳过了它。rank 0 会得到什么？
#
# - (a) rank 1 下一次集合通信的数据
# - (b) 它自己的张量，没有变化
# - (c) 大约 2 秒后报错，而不是卡住
# - (d) 一直卡住，直到作业被强行结束


# %%
my_answers = {
    ### BEGIN ANSWERS
    1: "c",  # a letter
    2: "b",  # a letter
    3: "b",  # a letter
    4: "c",  # a letter
    ### END ANSWERS
}
dl.quiz("09", my_answers)


# %% tags=["grade"] grade_id="09.concepts" points=2
dl.grade("09.concepts", my_answers)
