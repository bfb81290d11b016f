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

from ddp_lab.i18n import LANGUAGES, N_, _t, get_language, lookup

MESSAGES = {
    "cause": N_("cause"),
    "fix": N_("fix"),
    "message": N_("message"),
    "unknown_key": N_("Unknown error key {key!r}: choose one of {choices}."),
    "no_error": N_("Expected the error {key!r}, but the code ran without one."),
    "wrong_error": N_("Expected the error {key!r}, got a different one:\n{text}"),
    "expected": N_("Expected failure, as planned"),
    "collective_mismatch.cause": N_(
        "Ranks called different collectives at the same point (seen with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL; without it the job hangs)."
    ),
    "collective_mismatch.fix": N_(
        "Every rank must call the same collectives in the same order; keep "
        "rank-dependent branches free of collectives."
    ),
    "shape_mismatch.cause": N_(
        "Ranks passed tensors of different shapes to one collective (e.g. a "
        "smaller last batch). Without DETAIL, gloo may return wrong numbers or "
        "crash a peer."
    ),
    "shape_mismatch.fix": N_(
        "Give every rank the same shape: pad, or exchange sizes first "
        "(all_gather of the shapes) and fail on every rank together."
    ),
    "recv_timeout.cause": N_(
        "A peer never entered the matching collective: it skipped it, is stuck "
        "elsewhere, or is much slower (e.g. rank 0 saving a checkpoint)."
    ),
    "recv_timeout.fix": N_(
        "Make every rank call the collective; find the missing rank with "
        "dist.monitored_barrier; raise timeout= only for work that is really "
        "slow."
    ),
    "monitored_barrier.cause": N_("The named rank did not reach the barrier in time."),
    "monitored_barrier.fix": N_(
        "Look at what that rank does before the barrier (its stack, its branch)."
    ),
    "peer_closed.cause": N_("Another rank exited or crashed; this rank only noticed it."),
    "peer_closed.fix": N_("This is not the root cause: read the first failure of the other ranks."),
    "address_in_use.cause": N_(
        "MASTER_PORT is taken: another job, or a previous run that is still alive."
    ),
    "address_in_use.fix": N_(
        "Pick a free port (torchrun --standalone, or --master_port of a free "
        "port); stop leftover processes."
    ),
    "store_timeout.cause": N_(
        "Not every rank reached init_process_group: WORLD_SIZE too large, a node "
        "not started, wrong MASTER_ADDR, or a firewall."
    ),
    "store_timeout.fix": N_(
        "Check WORLD_SIZE = nnodes x nproc_per_node; start every node; check "
        "that MASTER_ADDR:MASTER_PORT is reachable from every node."
    ),
    "env_not_set.cause": N_(
        "init_process_group() with env:// outside a launcher that sets RANK, "
        "WORLD_SIZE, MASTER_ADDR, MASTER_PORT (plain python, mp.spawn)."
    ),
    "env_not_set.fix": N_("Launch with torchrun, or pass rank=, world_size= and an init_method."),
    "no_interface.cause": N_(
        "GLOO_SOCKET_IFNAME names a network interface this machine does not have."
    ),
    "no_interface.fix": N_(
        "Set it to an interface that `ip addr` lists on every node (the same for "
        "NCCL_SOCKET_IFNAME)."
    ),
    "unused_parameters.cause": N_(
        "Some parameters got no gradient (not used in the loss), so DDP's "
        "reduction of the previous step never finished."
    ),
    "unused_parameters.fix": N_(
        "Use every parameter, or pass find_unused_parameters=True (slower); "
        "TORCH_DISTRIBUTED_DEBUG=INFO names the parameters."
    ),
    "child_failed.cause": N_("torchrun: a worker exited with an error."),
    "child_failed.fix": N_(
        "Read 'Root Cause (first observed failure)' and that rank's traceback above it."
    ),
    "death_signal.cause": N_(
        "The torchrun agent was sent a signal from outside (scheduler limit, "
        "Ctrl-C, closed ssh session); not a PyTorch bug."
    ),
    "death_signal.fix": N_(
        "Find who sent it (job time limit, preemption, terminal closed: use "
        "tmux/nohup); save checkpoints and use --max-restarts."
    ),
    "bad_flag.cause": N_(
        "A misspelt launcher flag, or a script that does not accept --local-rank."
    ),
    "bad_flag.fix": N_(
        "Use torchrun --help for the names (--master_addr); read LOCAL_RANK from the environment."
    ),
    "no_local_rank.cause": N_("torch.distributed has no local_rank(): the launcher gives it."),
    "no_local_rank.fix": N_("int(os.environ['LOCAL_RANK'])"),
    "invalid_ordinal.cause": N_(
        "LOCAL_RANK >= number of visible GPUs (CUDA_VISIBLE_DEVICES lists fewer "
        "GPUs than --nproc_per_node)."
    ),
    "invalid_ordinal.fix": N_("--nproc_per_node = number of GPUs in CUDA_VISIBLE_DEVICES."),
}


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
        return {lang: lookup(MESSAGES, f"{self.key}.cause", lang) for lang in LANGUAGES}

    @property
    def fix(self) -> dict[str, str]:
        """How to fix it, by language (from MESSAGES)."""
        return {lang: lookup(MESSAGES, f"{self.key}.fix", lang) for lang in LANGUAGES}

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
        raise ValueError(
            _t(
                "Unknown error key {key!r}: choose one of {choices}.",
                _lang(None),
                key=key,
                choices=", ".join(BY_KEY),
            )
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


def explain(error: Any, key: str, lang: str | None = None) -> None:
    """Check that ``error`` is the ``key`` entry and print its message, cause and fix.

    It returns nothing, so that a lesson cell ending with it shows these three lines and not
    the entry's repr as its result (``get(key)`` is the entry)."""
    entry = get(key)
    text = error if isinstance(error, str) else text_of(error)
    lang = _lang(lang)
    if not entry.matches(text):
        short = text if len(text) < 2000 else text[:2000] + " ..."
        raise AssertionError(
            _t(
                "Expected the error {key!r}, got a different one:\n{text}",
                lang,
                key=key,
                text=short,
            )
        )
    print(_t("message", lang) + f": {entry.first_line(text)}")
    print(_t("cause", lang) + f": {entry.cause[lang]}")
    print(_t("fix", lang) + f": {entry.fix[lang]}")


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
            raise AssertionError(
                _t(
                    "Expected the error {key!r}, but the code ran without one.",
                    lang,
                    key=self.entry.key,
                )
            )
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt and friends pass through
        self.error = exc
        print("[" + _t("Expected failure, as planned", lang) + f": {type(exc).__name__}]")
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
    cells = "".join(("<th>" + lookup(MESSAGES, h, lang) + "</th>") for h in head)
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
