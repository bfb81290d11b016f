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

from ddp_lab.course.i18n import LANGUAGES, Messages, get_language

MESSAGES = Messages(
    __name__,
    {
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
        # One cause and one fix per entry of TABLE, keyed "<entry key>.cause" / ".fix".
        "collective_mismatch.cause": {
            "en": "Ranks called different collectives at the same point (seen with "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL; without it the job hangs).",
            "zh": "各 rank 在同一位置调用了不同的集合通信（开启 TORCH_DISTRIBUTED_DEBUG=DETAIL "
            "时才报错，否则程序卡住）。",
        },
        "collective_mismatch.fix": {
            "en": "Every rank must call the same collectives in the same order; keep rank-dependent "
            "branches free of collectives.",
            "zh": "所有 rank 必须以相同顺序调用相同的集合通信；依赖 rank 的分支里不要放集合通信。",
        },
        "shape_mismatch.cause": {
            "en": "Ranks passed tensors of different shapes to one collective (e.g. a smaller last "
            "batch). Without DETAIL, gloo may return wrong numbers or crash a peer.",
            "zh": "各 rank 传给同一个集合通信的张量形状不同（例如最后一个批更小）。不开 DETAIL 时，"
            "gloo 可能悄悄算错，或让对端崩溃。",
        },
        "shape_mismatch.fix": {
            "en": "Give every rank the same shape: pad, or exchange sizes first (all_gather of the "
            "shapes) and fail on every rank together.",
            "zh": "让每个 rank 的形状一致：填充，或先交换形状（对形状做 all_gather），再在所有 rank "
            "上一起报错。",
        },
        "recv_timeout.cause": {
            "en": "A peer never entered the matching collective: it skipped it, is stuck elsewhere, "
            "or is much slower (e.g. rank 0 saving a checkpoint).",
            "zh": "对端没有进入与之配对的集合通信：跳过了它、卡在别处，或者慢得多（例如 rank 0 "
            "在保存检查点）。",
        },
        "recv_timeout.fix": {
            "en": "Make every rank call the collective; find the missing rank with "
            "dist.monitored_barrier; raise timeout= only for work that is really slow.",
            "zh": "让每个 rank 都调用该集合通信；用 dist.monitored_barrier 找出缺席的 rank；"
            "只有在确实很慢的工作前才加大 timeout=。",
        },
        "monitored_barrier.cause": {
            "en": "The named rank did not reach the barrier in time.",
            "zh": "报错里点名的 rank 没能按时到达屏障。",
        },
        "monitored_barrier.fix": {
            "en": "Look at what that rank does before the barrier (its stack, its branch).",
            "zh": "检查该 rank 在屏障之前做了什么（它的调用栈、它走的分支）。",
        },
        "peer_closed.cause": {
            "en": "Another rank exited or crashed; this rank only noticed it.",
            "zh": "另一个 rank 已经退出或崩溃；这个 rank 只是察觉到了。",
        },
        "peer_closed.fix": {
            "en": "This is not the root cause: read the first failure of the other ranks.",
            "zh": "这不是根本原因：去看其他 rank 最早的那个错误。",
        },
        "address_in_use.cause": {
            "en": "MASTER_PORT is taken: another job, or a previous run that is still alive.",
            "zh": "MASTER_PORT 已被占用：另一个任务，或者还没退出的上一次运行。",
        },
        "address_in_use.fix": {
            "en": "Pick a free port (torchrun --standalone, or --master_port of a free port); stop "
            "leftover processes.",
            "zh": "换一个空闲端口（torchrun --standalone，或用空闲端口作 --master_port）；"
            "结束残留进程。",
        },
        "store_timeout.cause": {
            "en": "Not every rank reached init_process_group: WORLD_SIZE too large, a node not "
            "started, wrong MASTER_ADDR, or a firewall.",
            "zh": "并非所有 rank 都到达了 init_process_group：WORLD_SIZE 偏大、有节点没启动、"
            "MASTER_ADDR 写错，或被防火墙挡住。",
        },
        "store_timeout.fix": {
            "en": "Check WORLD_SIZE = nnodes x nproc_per_node; start every node; check that "
            "MASTER_ADDR:MASTER_PORT is reachable from every node.",
            "zh": "检查 WORLD_SIZE = nnodes × nproc_per_node；启动所有节点；确认每个节点都能连上 "
            "MASTER_ADDR:MASTER_PORT。",
        },
        "env_not_set.cause": {
            "en": "init_process_group() with env:// outside a launcher that sets RANK, WORLD_SIZE, "
            "MASTER_ADDR, MASTER_PORT (plain python, mp.spawn).",
            "zh": "在没有设置 RANK、WORLD_SIZE、MASTER_ADDR、MASTER_PORT 的启动器之外（直接 python、"
            "mp.spawn）用 env:// 调用了 init_process_group()。",
        },
        "env_not_set.fix": {
            "en": "Launch with torchrun, or pass rank=, world_size= and an init_method.",
            "zh": "用 torchrun 启动，或者显式传入 rank=、world_size= 和 init_method。",
        },
        "no_interface.cause": {
            "en": "GLOO_SOCKET_IFNAME names a network interface this machine does not have.",
            "zh": "GLOO_SOCKET_IFNAME 指定的网卡在这台机器上不存在。",
        },
        "no_interface.fix": {
            "en": "Set it to an interface that `ip addr` lists on every node (the same for "
            "NCCL_SOCKET_IFNAME).",
            "zh": "设为每个节点上 `ip addr` 都能列出的网卡（NCCL_SOCKET_IFNAME 同理）。",
        },
        "unused_parameters.cause": {
            "en": "Some parameters got no gradient (not used in the loss), so DDP's reduction of "
            "the previous step never finished.",
            "zh": "有些参数没有得到梯度（没参与计算损失），DDP 上一步的归约因此没有完成。",
        },
        "unused_parameters.fix": {
            "en": "Use every parameter, or pass find_unused_parameters=True (slower); "
            "TORCH_DISTRIBUTED_DEBUG=INFO names the parameters.",
            "zh": "让每个参数都参与计算，或传入 find_unused_parameters=True（更慢）；"
            "TORCH_DISTRIBUTED_DEBUG=INFO 会列出这些参数的名字。",
        },
        "child_failed.cause": {
            "en": "torchrun: a worker exited with an error.",
            "zh": "torchrun：有 worker 以错误退出。",
        },
        "child_failed.fix": {
            "en": "Read 'Root Cause (first observed failure)' and that rank's traceback above it.",
            "zh": "看“Root Cause (first observed failure)”以及它上方该 rank 的 traceback。",
        },
        "death_signal.cause": {
            "en": "The torchrun agent was sent a signal from outside (scheduler limit, Ctrl-C, "
            "closed ssh session); not a PyTorch bug.",
            "zh": "torchrun 的代理（agent）收到了来自外部的信号（调度器时限、Ctrl-C、ssh 断开），并不是 "
            "PyTorch 的 bug。",
        },
        "death_signal.fix": {
            "en": "Find who sent it (job time limit, preemption, terminal closed: use tmux/nohup); "
            "save checkpoints and use --max-restarts.",
            "zh": "找到发信号的一方（作业时限、抢占、终端关闭：用 tmux/nohup）；保存检查点并使用 "
            "--max-restarts。",
        },
        "bad_flag.cause": {
            "en": "A misspelt launcher flag, or a script that does not accept --local-rank.",
            "zh": "启动器参数拼错了，或者脚本不接受 --local-rank 参数。",
        },
        "bad_flag.fix": {
            "en": "Use torchrun --help for the names (--master_addr); read LOCAL_RANK from the "
            "environment.",
            "zh": "用 torchrun --help 核对参数名（--master_addr）；从环境变量读取 LOCAL_RANK。",
        },
        "no_local_rank.cause": {
            "en": "torch.distributed has no local_rank(): the launcher gives it.",
            "zh": "torch.distributed 里没有 local_rank()：本地 rank 由启动器给出。",
        },
        "no_local_rank.fix": {
            "en": "int(os.environ['LOCAL_RANK'])",
            "zh": "int(os.environ['LOCAL_RANK'])",
        },
        "invalid_ordinal.cause": {
            "en": "LOCAL_RANK >= number of visible GPUs (CUDA_VISIBLE_DEVICES lists fewer GPUs than "
            "--nproc_per_node).",
            "zh": "LOCAL_RANK 大于等于可见 GPU 数（CUDA_VISIBLE_DEVICES 列出的 GPU 少于 "
            "--nproc_per_node）。",
        },
        "invalid_ordinal.fix": {
            "en": "--nproc_per_node = number of GPUs in CUDA_VISIBLE_DEVICES.",
            "zh": "--nproc_per_node 等于 CUDA_VISIBLE_DEVICES 中的 GPU 数。",
        },
    },
)


def _lang(lang: str | None) -> str:
    return lang or get_language()


@dataclass(frozen=True)
class KnownError:
    """One row of the table: how to recognise an error, why it happens, how to fix it."""

    key: str
    pattern: str
    message: str  # a short form of the message, for the table
    gpu_only: bool = False

    @property
    def cause(self) -> dict[str, str]:
        """Why it happens, by language (from MESSAGES)."""
        return {lang: MESSAGES(f"{self.key}.cause", lang) for lang in LANGUAGES}

    @property
    def fix(self) -> dict[str, str]:
        """How to fix it, by language (from MESSAGES)."""
        return {lang: MESSAGES(f"{self.key}.fix", lang) for lang in LANGUAGES}

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text) is not None

    def first_line(self, text: str) -> str:
        """The line of ``text`` that matched, trimmed to a readable length."""
        for line in text.splitlines():
            if re.search(self.pattern, line):
                line = line.strip()
                return line if len(line) <= 300 else line[:297] + "..."
        return self.message


_e = KnownError  # the rows below: key, pattern, short message[, gpu_only]


TABLE: tuple[KnownError, ...] = (
    _e(
        "collective_mismatch",
        r"Detected mismatch between collectives.*Op type",
        "Detected mismatch between collectives ... Op type: ALLREDUCE vs BROADCAST",
    ),
    _e(
        "shape_mismatch",
        r"Detected mismatch between collectives.*shapes",
        "Detected mismatch between collectives ... Tensor shapes: 3 vs 4",
    ),
    _e(
        "recv_timeout",
        r"Timed out waiting \d+ms for (recv|send) operation",
        "Timed out waiting 2000ms for recv operation to complete",
    ),
    _e(
        "monitored_barrier",
        r"Rank \d+ failed to pass monitoredBarrier",
        "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms",
    ),
    _e(
        "peer_closed",
        r"Connection closed by peer|Connection reset by peer",
        "Connection closed by peer ... typically caused by a remote worker crashing",
    ),
    _e(
        "address_in_use",
        r"EADDRINUSE|[Aa]ddress already in use",
        "The server socket has failed to listen ... EADDRINUSE",
    ),
    _e(
        "store_timeout",
        r"Timed out after \d+ seconds waiting for clients|clients joined",
        "Timed out after 3 seconds waiting for clients. 1/2 clients joined.",
    ),
    _e(
        "env_not_set",
        r"environment variable \w+ expected, but not set",
        "environment variable RANK expected, but not set",
    ),
    _e(
        "no_interface",
        r"Unable to find address for",
        "Unable to find address for: eth9",
    ),
    _e(
        "unused_parameters",
        r"Expected to have finished reduction in the prior iteration",
        "Expected to have finished reduction in the prior iteration ...",
    ),
    _e(
        "child_failed",
        r"ChildFailedError",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
    ),
    _e(
        "death_signal",
        r"death signal, shutting down workers|SignalException",
        "Received 15 death signal, shutting down workers",
    ),
    _e(
        "bad_flag",
        r"unrecognized arguments: --\w",
        "torchrun: error: unrecognized arguments: --master_adderss=...",
    ),
    _e(
        "no_local_rank",
        r"has no attribute 'local_rank'",
        "module 'torch.distributed' has no attribute 'local_rank'",
    ),
    _e(
        "invalid_ordinal",
        r"invalid device ordinal",
        "CUDA error: invalid device ordinal",
        gpu_only=True,
    ),
)
BY_KEY = {e.key: e for e in TABLE}


def get(key: str) -> KnownError:
    """The entry named ``key``, or a clear ValueError."""
    if key not in BY_KEY:
        raise ValueError(MESSAGES("unknown_key", _lang(None), key=key, choices=", ".join(BY_KEY)))
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
        raise AssertionError(MESSAGES("wrong_error", lang, key=key, text=short))
    print(f"{MESSAGES('message', lang)}: {entry.first_line(text)}")
    print(f"{MESSAGES('cause', lang)}: {entry.cause[lang]}")
    print(f"{MESSAGES('fix', lang)}: {entry.fix[lang]}")
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
            raise AssertionError(MESSAGES("no_error", lang, key=self.entry.key))
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt and friends pass through
        self.error = exc
        print(f"[{MESSAGES('expected', lang)}: {type(exc).__name__}]")
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
    cells = "".join(f"<th>{MESSAGES(h, lang)}</th>" for h in head)
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
