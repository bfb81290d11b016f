"""Learner-facing messages in English and Chinese, and the language switch.

One convention for every module (see docs/AUTHORING.md, "Messages"): a module that shows
text to learners declares one table at its top,

    MESSAGES = Messages(__name__, {"key": {"en": "... {field} ...", "zh": "... {field} ..."}})

and calls ``MESSAGES("key", field=...)`` (current language) or ``MESSAGES("key", lang, ...)``.
Each table registers itself in ``TABLES``, so tests/course/test_i18n.py finds every message
and checks that it has both languages with the same placeholders, and that no Chinese text
sits outside a table. Identifiers, docstrings and comments stay in English.

The language comes from ``set_language`` or, at import, from the ``DDP_LAB_LANG``
environment variable ("en" or "zh"). This module's own table holds the messages shared by
the runtime and the grading (``t(key, ...)``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

LANGUAGES = ("en", "zh")

_language = os.environ.get("DDP_LAB_LANG", "en").lower()[:2]
if _language not in LANGUAGES:
    _language = "en"

TABLES: dict[str, Messages] = {}
"""Every message table, by the name of the module that owns it."""


class Messages(Mapping[str, dict[str, str]]):
    """One module's learner-facing messages: ``key -> {"en": text, "zh": text}``.

    Texts are ``str.format`` templates; both languages use the same placeholders.
    """

    def __init__(self, owner: str, table: dict[str, dict[str, str]]) -> None:
        self.owner = owner
        self._table = table
        TABLES[owner] = self

    def __getitem__(self, key: str) -> dict[str, str]:
        return self._table[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, key: str, lang: str | None = None, /, **fields: object) -> str:
        """Message ``key`` in ``lang`` (default: the current language), formatted."""
        entry = self._table[key]
        return entry.get(lang or _language, entry["en"]).format(**fields)

    def pair(self, key: str, /, **fields: object) -> tuple[str, str]:
        """Message ``key`` formatted in both languages, ``(en, zh)``: for objects that keep
        both (a doctor finding, a compatibility verdict) and pick one when shown."""
        return self(key, "en", **fields), self(key, "zh", **fields)

    def __repr__(self) -> str:
        return f"Messages({self.owner!r}, {len(self)} keys)"


MESSAGES = Messages(
    __name__,
    {
        "bad_nprocs_type": {
            "en": "nprocs must be a whole number of processes, got {value!r}.",
            "zh": "nprocs 必须是整数（进程个数），但收到的是 {value!r}。",
        },
        "bad_nprocs_small": {
            "en": "nprocs must be at least 1, got {value}.",
            "zh": "nprocs 至少为 1，但收到的是 {value}。",
        },
        "bad_nprocs_large": {
            "en": (
                "nprocs={value} is too many for this machine ({cpus} CPU cores): the limit is "
                "{limit}. Each rank is a full Python process; try 2 or 4."
            ),
            "zh": (
                "nprocs={value} 对这台机器（{cpus} 个 CPU 核）来说太多了：上限是 {limit}。"
                "每个 rank 都是一个完整的 Python 进程，建议用 2 或 4。"
            ),
        },
        "bad_backend": {
            "en": "Unknown backend {value!r}: choose one of {choices}.",
            "zh": "未知的后端 {value!r}：请从 {choices} 中选择。",
        },
        "nccl_no_gpus": {
            "en": (
                "The nccl backend needs one CUDA GPU per rank: you asked for {nprocs} ranks, "
                "this machine has {gpus} GPU(s). Use backend='gloo' (runs on CPU) or 'auto'."
            ),
            "zh": (
                "nccl 后端要求每个 rank 一块 CUDA GPU：你要 {nprocs} 个 rank，"
                "这台机器只有 {gpus} 块 GPU。请改用 backend='gloo'（在 CPU 上运行）或 'auto'。"
            ),
        },
        "backend_unavailable": {
            "en": "The {backend} backend is not available in this PyTorch build.",
            "zh": "当前安装的 PyTorch 不支持 {backend} 后端。",
        },
        "bad_timeout": {
            "en": "timeout must be a positive number of seconds or None, got {value!r}.",
            "zh": "timeout 必须是正的秒数或 None，但收到的是 {value!r}。",
        },
        "not_callable": {
            "en": "The first argument must be a function to run on every rank, got {value!r}.",
            "zh": "第一个参数必须是要在每个 rank 上运行的函数，但收到的是 {value!r}。",
        },
        "join_false": {
            "en": "ddp_lab.spawn always waits for the ranks (join=True); join=False is not supported.",
            "zh": "ddp_lab.spawn 总是等待所有 rank 结束（join=True），不支持 join=False。",
        },
        "unpicklable": {
            "en": (
                "Cannot send {what} to the child processes: {error}. Every rank is a separate "
                "process, so what the function uses must be picklable. Create it inside the "
                "function instead."
            ),
            "zh": (
                "无法把 {what} 发送给子进程：{error}。每个 rank 都是独立的进程，"
                "函数用到的对象必须可以被 pickle。请改为在函数内部创建它。"
            ),
        },
        "name_what": {"en": "the name {name!r}", "zh": "名字 {name!r}"},
        "arg_what": {"en": "argument {index} of args", "zh": "args 的第 {index} 个参数"},
        "fn_what": {"en": "the function {name!r}", "zh": "函数 {name!r}"},
        "rank_raised": {
            "en": "rank {rank} raised {error}",
            "zh": "rank {rank} 抛出了异常 {error}",
        },
        "rank_exit_code": {
            "en": "rank {rank} exited with code {code} without raising an exception (os._exit or sys.exit?)",
            "zh": "rank {rank} 以退出码 {code} 结束，但没有抛出异常（调用了 os._exit 或 sys.exit？）",
        },
        "rank_signal": {
            "en": "rank {rank} was killed by signal {signal}",
            "zh": "rank {rank} 被信号 {signal} 杀死",
        },
        "ranks_failed": {
            "en": "{count} of {nprocs} ranks failed; the first to fail was rank {first}.",
            "zh": "{nprocs} 个 rank 中有 {count} 个失败；最先失败的是 rank {first}。",
        },
        "ranks_stopped": {
            "en": "ranks stopped by the launcher after the failure: {ranks}",
            "zh": "出错后被启动器停止的 rank：{ranks}",
        },
        "traceback_of": {"en": "traceback of rank {rank}", "zh": "rank {rank} 的 traceback"},
        "output_of": {"en": "output of rank {rank}", "zh": "rank {rank} 的输出"},
        "stack_of": {
            "en": "where rank {rank} was stuck (Python stack)",
            "zh": "rank {rank} 卡住的位置（Python 调用栈）",
        },
        "timeout": {
            "en": (
                "Timed out after {timeout:g} s: ranks {ranks} were still running and were stopped. "
                "A hang usually means the ranks called different collectives, or one rank "
                "skipped one. Pass timeout=... (or %%ddp --timeout S) if the work is just slow."
            ),
            "zh": (
                "超时（{timeout:g} 秒）：rank {ranks} 仍在运行，已被停止。卡住通常意味着各 rank "
                "调用了不同的集合通信，或者某个 rank 跳过了一次集合通信。如果只是计算较慢，"
                "请传入 timeout=...（或 %%ddp --timeout S）。"
            ),
        },
        "interrupted": {
            "en": "Interrupted: all ranks were stopped.",
            "zh": "已中断：所有 rank 都已停止。",
        },
        "zygote_died": {
            "en": "The launcher's helper process died unexpectedly; it will be restarted on the next call.",
            "zh": "启动器的辅助进程意外退出；下次调用时会自动重启。",
        },
        "group_started": {
            "en": (
                "Started {nprocs} persistent ranks ({backend} backend). Run cells on them with "
                "%%ranks; dl.pull / dl.push move values; dl.status() shows them; dl.stop() ends them."
            ),
            "zh": (
                "已启动 {nprocs} 个常驻 rank（{backend} 后端）。用 %%ranks 在它们上面运行单元；"
                "dl.pull / dl.push 传递数值；dl.status() 查看状态；dl.stop() 结束它们。"
            ),
        },
        "group_replaced": {
            "en": "The previous group of {nprocs} ranks was stopped (its variables are gone).",
            "zh": "之前的 {nprocs} 个 rank 已停止（它们的变量都已丢失）。",
        },
        "group_stopped": {
            "en": "Stopped the {nprocs} ranks; nothing of them is left running.",
            "zh": "已停止这 {nprocs} 个 rank，没有留下任何在运行的进程。",
        },
        "no_group": {
            "en": "No persistent ranks are running: start them with dl.start(2) (or %ranks start -n 2).",
            "zh": "没有正在运行的常驻 rank：请先用 dl.start(2)（或 %ranks start -n 2）启动。",
        },
        "bad_ranks": {
            "en": "ranks must be rank numbers from 0 to {last} (e.g. [0, 1]), got {value!r}.",
            "zh": "ranks 必须是 0 到 {last} 之间的 rank 编号（例如 [0, 1]），但收到的是 {value!r}。",
        },
        "bad_name": {
            "en": "{name!r} cannot be a variable name on the ranks.",
            "zh": "{name!r} 不能作为 rank 上的变量名。",
        },
        "cell_failed": {
            "en": (
                "{count} of {nranks} ranks raised an exception in this cell (first: rank {first}). "
                "The group is still running and keeps its variables."
            ),
            "zh": (
                "{nranks} 个 rank 中有 {count} 个在这个单元里抛出了异常（第一个是 rank {first}）。"
                "进程组仍在运行，变量都还在。"
            ),
        },
        "pull_failed": {
            "en": "{count} of {nranks} ranks could not evaluate {expr!r}.",
            "zh": "{nranks} 个 rank 中有 {count} 个无法求值 {expr!r}。",
        },
        "push_failed": {
            "en": "{count} of {nranks} ranks could not receive the values.",
            "zh": "{nranks} 个 rank 中有 {count} 个无法接收这些值。",
        },
        "ranks_timeout": {
            "en": (
                "Timed out after {timeout:g} s: ranks {ranks} were still running this cell. "
                "A hang usually means the ranks called different collectives, or one rank "
                "skipped one. Use %%ranks --timeout S if the work is just slow."
            ),
            "zh": (
                "超时（{timeout:g} 秒）：rank {ranks} 仍在运行这个单元。卡住通常意味着各 rank "
                "调用了不同的集合通信，或者某个 rank 跳过了一次集合通信。如果只是计算较慢，"
                "请使用 %%ranks --timeout S。"
            ),
        },
        "after_failure": {
            "en": (
                "Ranks {ranks} were still running {grace:g} s after rank {first} failed: they are "
                "probably waiting in a collective that rank {first} never reached."
            ),
            "zh": (
                "rank {first} 出错 {grace:g} 秒后，rank {ranks} 仍在运行：它们很可能在等待一次 "
                "rank {first} 永远不会到达的集合通信。"
            ),
        },
        "group_restarted": {
            "en": (
                "The group was restarted and ITS STATE IS LOST: {nprocs} new rank processes hold "
                "none of the variables made so far. Run the cells that create them again."
            ),
            "zh": (
                "进程组已重启：现在是 {nprocs} 个全新的 rank 进程，rank 上原有的变量全部丢失。"
                "请重新运行创建它们的单元。"
            ),
        },
        "ranks_lost": {
            "en": "A rank process ended while the group was running:",
            "zh": "进程组运行期间有 rank 进程退出了：",
        },
        "rank_gone": {
            "en": "rank {rank} closed its connection",
            "zh": "rank {rank} 断开了连接",
        },
        "start_failed": {
            "en": "The persistent ranks could not start:",
            "zh": "常驻 rank 无法启动：",
        },
        "start_timeout": {
            "en": "The persistent ranks did not all start within {timeout:g} s.",
            "zh": "常驻 rank 没能在 {timeout:g} 秒内全部启动。",
        },
        "ranks_interrupted": {
            "en": (
                "Interrupted: the cell was stopped on ranks {ranks}. The group is still running "
                "and keeps its variables."
            ),
            "zh": "已中断：rank {ranks} 上的单元已停止。进程组仍在运行，变量都还在。",
        },
        "interrupt_stuck": {
            "en": (
                "Interrupted, but ranks {ranks} did not stop within {grace:g} s (a rank waiting "
                "inside a collective cannot be interrupted)."
            ),
            "zh": "已中断，但 rank {ranks} 在 {grace:g} 秒内没有停下（在集合通信内部等待的 rank 无法被中断）。",
        },
        "status_header": {
            "en": "{nprocs} persistent ranks, {backend} backend, {cells} cells run",
            "zh": "{nprocs} 个常驻 rank，{backend} 后端，已运行 {cells} 个单元",
        },
        "status_columns": {
            "en": "rank|pid|alive|device|running",
            "zh": "rank|pid|存活|设备|正在运行",
        },
        "status_yes": {"en": "yes", "zh": "是"},
        "status_no": {"en": "no", "zh": "否"},
        "status_idle": {"en": "idle (last: {last})", "zh": "空闲（上一个：{last}）"},
        "status_new": {"en": "idle", "zh": "空闲"},
        "your_code_here": {"en": "your code here", "zh": "在这里写你的代码"},
        "grade_pass": {
            "en": "PASS {grade_id}: all hidden cases passed, {points}/{points} points",
            "zh": "通过 {grade_id}：全部隐藏测试用例通过，得分 {points}/{points}",
        },
        "grade_fail": {
            "en": "FAIL {grade_id}: 0/{points} points. {detail}",
            "zh": "未通过 {grade_id}：得分 0/{points}。{detail}",
        },
        "grade_not_implemented": {
            "en": "the exercise is not solved yet (NotImplementedError: replace the stub with your code).",
            "zh": "练习还没有完成（NotImplementedError：请用你的代码替换占位代码）。",
        },
        "grade_case_failed": {
            "en": "hidden case {index} of {total} ({case}) failed: {why}",
            "zh": "第 {index} 个隐藏测试用例（共 {total} 个；{case}）未通过：{why}",
        },
        "grade_raised": {
            "en": "your code raised {error}",
            "zh": "你的代码抛出了异常 {error}",
        },
        "grade_mismatch": {
            "en": "expected {expected}, got {actual}",
            "zh": "期望得到 {expected}，实际得到 {actual}",
        },
        "grade_unknown": {
            "en": "unknown exercise {grade_id!r}",
            "zh": "未知的练习 {grade_id!r}",
        },
        "grade_refused": {
            "en": "this exercise asks you to write it yourself: calling {name} is not allowed "
            "here (use {allowed}).",
            "zh": "这道练习要求你自己实现：这里不允许调用 {name}（请使用 {allowed}）。",
        },
        "grade_not_data": {
            "en": "your code returned something that is not data ({error}): return tensors, "
            "numbers, lists or dicts.",
            "zh": "你的代码返回的不是数据（{error}）：请返回张量、数字、列表或字典。",
        },
        "bad_language": {
            "en": "language must be one of {choices}, got {value!r}.",
            "zh": "语言必须是 {choices} 之一，但收到的是 {value!r}。",
        },
    },
)


def set_language(lang: str) -> None:
    """Select the language of learner-facing messages: "en" or "zh"."""
    global _language
    lang = str(lang).lower()[:2]
    if lang not in LANGUAGES:
        # Both languages: the learner may not read the one that is set.
        raise ValueError(
            "\n".join(MESSAGES("bad_language", x, choices=LANGUAGES, value=lang) for x in LANGUAGES)
        )
    _language = lang


def get_language() -> str:
    """Return the current language code."""
    return _language


def t(key: str, **kwargs: object) -> str:
    """Return message ``key`` in the current language, formatted with ``kwargs``."""
    return MESSAGES(key, **kwargs)
