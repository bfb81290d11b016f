"""Distributed error messages -> cause -> fix: a bilingual table kept as data.

Each entry has a regular expression that matches the real message PyTorch (or a launcher)
prints; ``tests/test_errors.py`` triggers every CPU entry for real and checks that its
pattern still matches, so the table cannot drift from the installed PyTorch.

``expect(key)`` is the context manager of chapter 09's gallery: the cell runs code that
must fail, the manager catches the error, checks that it is the expected one, and prints
the real message with its cause and fix. A cell that unexpectedly succeeds fails.

Teaching version: PyTorch has no such table; its messages are spread over c10d, gloo,
NCCL and torchelastic, and this module only knows the common ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TEXT = {
    "cause": {"en": "cause", "zh": "原因"},
    "fix": {"en": "fix", "zh": "解决办法"},
    "message": {"en": "message", "zh": "报错信息"},
    "unknown_key": {
        "en": "Unknown error key {key!r}: choose one of {choices}.",
        "zh": "未知的错误键 {key!r}：请从 {choices} 中选择。",
    },
    "no_error": {
        "en": "Expected the error {key!r}, but the code ran without one.",
        "zh": "本应出现错误 {key!r}，但代码正常运行结束了。",
    },
    "wrong_error": {
        "en": "Expected the error {key!r}, got a different one:\n{text}",
        "zh": "本应出现错误 {key!r}，却得到另一个错误：\n{text}",
    },
    "expected": {"en": "Expected failure, as planned", "zh": "预期中的失败"},
}


def _lang(lang: str | None) -> str:
    from ddp_lab.course.i18n import get_language

    return lang or get_language()


@dataclass(frozen=True)
class KnownError:
    """One row of the table: how to recognise an error, why it happens, how to fix it."""

    key: str
    pattern: str
    message: str  # a short form of the message, for the table
    cause: dict[str, str]
    fix: dict[str, str]
    gpu_only: bool = False

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text) is not None

    def first_line(self, text: str) -> str:
        """The line of ``text`` that matched, trimmed to a readable length."""
        for line in text.splitlines():
            if re.search(self.pattern, line):
                line = line.strip()
                return line if len(line) <= 300 else line[:297] + "..."
        return self.message


def _e(
    key: str,
    pattern: str,
    message: str,
    cause_en: str,
    cause_zh: str,
    fix_en: str,
    fix_zh: str,
    gpu_only: bool = False,
) -> KnownError:
    return KnownError(
        key,
        pattern,
        message,
        {"en": cause_en, "zh": cause_zh},
        {"en": fix_en, "zh": fix_zh},
        gpu_only,
    )


TABLE: tuple[KnownError, ...] = (
    _e(
        "collective_mismatch",
        r"Detected mismatch between collectives.*Op type",
        "Detected mismatch between collectives ... Op type: ALLREDUCE vs BROADCAST",
        "Ranks called different collectives at the same point (seen with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL; without it the job hangs).",
        "各 rank 在同一位置调用了不同的集合通信（开启 TORCH_DISTRIBUTED_DEBUG=DETAIL 时才报错，"
        "否则程序卡住）。",
        "Every rank must call the same collectives in the same order; keep rank-dependent "
        "branches free of collectives.",
        "所有 rank 必须以相同顺序调用相同的集合通信；依赖 rank 的分支里不要放集合通信。",
    ),
    _e(
        "shape_mismatch",
        r"Detected mismatch between collectives.*shapes",
        "Detected mismatch between collectives ... Tensor shapes: 3 vs 4",
        "Ranks passed tensors of different shapes to one collective (e.g. a smaller last "
        "batch). Without DETAIL, gloo may return wrong numbers or crash a peer.",
        "各 rank 传给同一个集合通信的张量形状不同（例如最后一个批更小）。不开 DETAIL 时，"
        "gloo 可能悄悄算错，或让对端崩溃。",
        "Give every rank the same shape: pad, or exchange sizes first (all_gather of the "
        "shapes) and fail on every rank together.",
        "让每个 rank 的形状一致：填充，或先交换形状（对形状做 all_gather），再在所有 rank 上"
        "一起报错。",
    ),
    _e(
        "recv_timeout",
        r"Timed out waiting \d+ms for (recv|send) operation",
        "Timed out waiting 2000ms for recv operation to complete",
        "A peer never entered the matching collective: it skipped it, is stuck elsewhere, "
        "or is much slower (e.g. rank 0 saving a checkpoint).",
        "对端没有进入与之配对的集合通信：跳过了它、卡在别处，或者慢得多（例如 rank 0 在保存"
        "检查点）。",
        "Make every rank call the collective; find the missing rank with "
        "dist.monitored_barrier; raise timeout= only for work that is really slow.",
        "让每个 rank 都调用该集合通信；用 dist.monitored_barrier 找出缺席的 rank；只有在确实"
        "很慢的工作前才加大 timeout=。",
    ),
    _e(
        "monitored_barrier",
        r"Rank \d+ failed to pass monitoredBarrier",
        "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms",
        "The named rank did not reach the barrier in time.",
        "报错里点名的 rank 没能按时到达屏障。",
        "Look at what that rank does before the barrier (its stack, its branch).",
        "检查该 rank 在屏障之前做了什么（它的调用栈、它走的分支）。",
    ),
    _e(
        "peer_closed",
        r"Connection closed by peer|Connection reset by peer",
        "Connection closed by peer ... typically caused by a remote worker crashing",
        "Another rank exited or crashed; this rank only noticed it.",
        "另一个 rank 已经退出或崩溃；这个 rank 只是察觉到了。",
        "This is not the root cause: read the first failure of the other ranks.",
        "这不是根本原因：去看其他 rank 最早的那个错误。",
    ),
    _e(
        "address_in_use",
        r"EADDRINUSE|[Aa]ddress already in use",
        "The server socket has failed to listen ... EADDRINUSE",
        "MASTER_PORT is taken: another job, or a previous run that is still alive.",
        "MASTER_PORT 已被占用：另一个任务，或者还没退出的上一次运行。",
        "Pick a free port (torchrun --standalone, or --master_port of a free port); "
        "stop leftover processes.",
        "换一个空闲端口（torchrun --standalone，或用空闲端口作 --master_port）；结束残留进程。",
    ),
    _e(
        "store_timeout",
        r"Timed out after \d+ seconds waiting for clients|clients joined",
        "Timed out after 3 seconds waiting for clients. 1/2 clients joined.",
        "Not every rank reached init_process_group: WORLD_SIZE too large, a node not "
        "started, wrong MASTER_ADDR, or a firewall.",
        "并非所有 rank 都到达了 init_process_group：WORLD_SIZE 偏大、有节点没启动、"
        "MASTER_ADDR 写错，或被防火墙挡住。",
        "Check WORLD_SIZE = nnodes x nproc_per_node; start every node; check that "
        "MASTER_ADDR:MASTER_PORT is reachable from every node.",
        "检查 WORLD_SIZE = nnodes × nproc_per_node；启动所有节点；确认每个节点都能连上 "
        "MASTER_ADDR:MASTER_PORT。",
    ),
    _e(
        "env_not_set",
        r"environment variable \w+ expected, but not set",
        "environment variable RANK expected, but not set",
        "init_process_group() with env:// outside a launcher that sets RANK, WORLD_SIZE, "
        "MASTER_ADDR, MASTER_PORT (plain python, mp.spawn).",
        "在没有设置 RANK、WORLD_SIZE、MASTER_ADDR、MASTER_PORT 的启动器之外（直接 python、"
        "mp.spawn）用 env:// 调用了 init_process_group()。",
        "Launch with torchrun, or pass rank=, world_size= and an init_method.",
        "用 torchrun 启动，或者显式传入 rank=、world_size= 和 init_method。",
    ),
    _e(
        "no_interface",
        r"Unable to find address for",
        "Unable to find address for: eth9",
        "GLOO_SOCKET_IFNAME names a network interface this machine does not have.",
        "GLOO_SOCKET_IFNAME 指定的网卡在这台机器上不存在。",
        "Set it to an interface that `ip addr` lists on every node (the same for "
        "NCCL_SOCKET_IFNAME).",
        "设为每个节点上 `ip addr` 都能列出的网卡（NCCL_SOCKET_IFNAME 同理）。",
    ),
    _e(
        "unused_parameters",
        r"Expected to have finished reduction in the prior iteration",
        "Expected to have finished reduction in the prior iteration ...",
        "Some parameters got no gradient (not used in the loss), so DDP's reduction of the "
        "previous step never finished.",
        "有些参数没有得到梯度（没参与计算损失），DDP 上一步的归约因此没有完成。",
        "Use every parameter, or pass find_unused_parameters=True (slower); "
        "TORCH_DISTRIBUTED_DEBUG=INFO names the parameters.",
        "让每个参数都参与计算，或传入 find_unused_parameters=True（更慢）；"
        "TORCH_DISTRIBUTED_DEBUG=INFO 会列出这些参数的名字。",
    ),
    _e(
        "child_failed",
        r"ChildFailedError",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
        "torchrun: a worker exited with an error.",
        "torchrun：有 worker 以错误退出。",
        "Read 'Root Cause (first observed failure)' and that rank's traceback above it.",
        "看 'Root Cause (first observed failure)' 以及它上方该 rank 的 traceback。",
    ),
    _e(
        "death_signal",
        r"death signal, shutting down workers|SignalException",
        "Received 15 death signal, shutting down workers",
        "The torchrun agent was sent a signal from outside (scheduler limit, Ctrl-C, "
        "closed ssh session); not a PyTorch bug.",
        "torchrun 的 agent 收到了来自外部的信号（调度器时限、Ctrl-C、ssh 断开），"
        "并不是 PyTorch 的 bug。",
        "Find who sent it (job time limit, preemption, terminal closed: use tmux/nohup); "
        "save checkpoints and use --max-restarts.",
        "找到发信号的一方（作业时限、抢占、终端关闭：用 tmux/nohup）；保存检查点并使用 "
        "--max-restarts。",
    ),
    _e(
        "bad_flag",
        r"unrecognized arguments: --\w",
        "torchrun: error: unrecognized arguments: --master_adderss=...",
        "A misspelt launcher flag, or a script that does not accept --local-rank.",
        "启动器参数拼错了，或者脚本不接受 --local-rank 参数。",
        "Use torchrun --help for the names (--master_addr); read LOCAL_RANK from the environment.",
        "用 torchrun --help 核对参数名（--master_addr）；从环境变量读取 LOCAL_RANK。",
    ),
    _e(
        "no_local_rank",
        r"has no attribute 'local_rank'",
        "module 'torch.distributed' has no attribute 'local_rank'",
        "torch.distributed has no local_rank(): the launcher gives it.",
        "torch.distributed 里没有 local_rank()：本地 rank 由启动器给出。",
        "int(os.environ['LOCAL_RANK'])",
        "int(os.environ['LOCAL_RANK'])",
    ),
    _e(
        "invalid_ordinal",
        r"invalid device ordinal",
        "CUDA error: invalid device ordinal",
        "LOCAL_RANK >= number of visible GPUs (CUDA_VISIBLE_DEVICES lists fewer GPUs than "
        "--nproc_per_node).",
        "LOCAL_RANK 大于等于可见 GPU 数（CUDA_VISIBLE_DEVICES 列出的 GPU 少于 --nproc_per_node）。",
        "--nproc_per_node = number of GPUs in CUDA_VISIBLE_DEVICES.",
        "--nproc_per_node 等于 CUDA_VISIBLE_DEVICES 中的 GPU 数。",
        gpu_only=True,
    ),
)
BY_KEY = {e.key: e for e in TABLE}


def get(key: str) -> KnownError:
    """The entry named ``key``, or a clear ValueError."""
    if key not in BY_KEY:
        raise ValueError(
            _TEXT["unknown_key"][_lang(None)].format(key=key, choices=", ".join(BY_KEY))
        )
    return BY_KEY[key]


def text_of(error: Any) -> str:
    """Everything an error says: message, each rank's reason and traceback, output."""
    parts = [str(error)]
    for f in getattr(error, "failures", []) or []:
        parts += [f.reason, f.traceback, f.stack]
    for out, err in (getattr(error, "outputs", {}) or {}).values():
        parts += [out, err]
    for attr in ("stdout", "stderr"):  # a LaunchResult
        parts.append(getattr(error, attr, "") or "")
    return "\n".join(p for p in parts if p)


def diagnose(error: Any) -> list[KnownError]:
    """The table entries whose pattern matches ``error`` (an exception, result or text)."""
    text = error if isinstance(error, str) else text_of(error)
    return [e for e in TABLE if e.matches(text)]


def explain(error: Any, key: str, lang: str | None = None) -> KnownError:
    """Check that ``error`` is the ``key`` entry and print its message, cause and fix."""
    entry = get(key)
    text = error if isinstance(error, str) else text_of(error)
    lang = _lang(lang)
    if not entry.matches(text):
        short = text if len(text) < 2000 else text[:2000] + " ..."
        raise AssertionError(_TEXT["wrong_error"][lang].format(key=key, text=short))
    print(f"{_TEXT['message'][lang]}: {entry.first_line(text)}")
    print(f"{_TEXT['cause'][lang]}: {entry.cause[lang]}")
    print(f"{_TEXT['fix'][lang]}: {entry.fix[lang]}")
    return entry


class expect:  # noqa: N801  # used like a function: `with expect("key"):`
    """Context manager: the block must raise the ``key`` error; print its diagnosis."""

    def __init__(self, key: str, lang: str | None = None) -> None:
        self.entry, self.lang = get(key), lang
        self.error: BaseException | None = None

    def __enter__(self) -> expect:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        lang = _lang(self.lang)
        if exc is None:
            raise AssertionError(_TEXT["no_error"][lang].format(key=self.entry.key))
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt and friends pass through
        self.error = exc
        print(f"[{_TEXT['expected'][lang]}: {type(exc).__name__}]")
        explain(exc, self.entry.key, lang)
        return True


def rows(lang: str | None = None) -> list[dict[str, str]]:
    """The table as rows of plain text, in the current language."""
    lang = _lang(lang)
    return [
        {"key": e.key, "message": e.message, "cause": e.cause[lang], "fix": e.fix[lang]}
        for e in TABLE
    ]


def show_table(lang: str | None = None) -> Any:
    """The table as HTML in a notebook (plain text elsewhere)."""
    import html

    lang = _lang(lang)
    head = ["message", "cause", "fix"]
    cells = "".join(f"<th>{_TEXT[h][lang]}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f"<td style='text-align:left'>{html.escape(r[h])}</td>" for h in head)
        + "</tr>"
        for r in rows(lang)
    )
    markup = f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"
    try:
        from IPython.display import HTML

        return HTML(markup)
    except ImportError:
        return "\n".join(" | ".join(r[h] for h in head) for r in rows(lang))
