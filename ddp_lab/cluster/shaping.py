"""Links with a bandwidth and a delay: the ``tc`` qdiscs that shape a host's link.

``cluster(2, rate_mbit=100, delay_ms=5)`` shapes each host's ``eth0`` (what it sends) and
its port of the switch (what it receives): ``tc_commands`` says which qdiscs and why (tbf,
netem under it), ``check_shaping`` refuses nonsense before anything is built, and
``shaping_unavailable_reason`` tries the qdiscs on a throw-away namespace first, so a
kernel without tbf or netem gives a clear error. ``cluster/hosts.py`` re-exports these
names.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import subprocess

from ddp_lab.i18n import _t

# The throw-away namespace's name starts as a cluster's do (``hosts.PREFIX`` + "-"), so that
# ``hosts.down()`` removes one a crash left behind.
PROBE_PREFIX = "ddplab-probe"


def probe_name() -> str:
    """A throw-away namespace's name, with the pid of the process that makes it: while that
    process lives the namespace is its own (``hosts.clusters`` leaves it out, ``hosts.down``
    does not remove it under the probe), and another process can tell its own probes from
    those a process beside it is making at the same moment."""
    return f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(3)}-x"


def probe_maker(name: str) -> int | None:
    """The pid in a throw-away namespace's name (``probe_name``), or None for another name."""
    if not name.startswith(PROBE_PREFIX):
        return None
    pid = name[len(PROBE_PREFIX) :].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def check_shaping(rate_mbit: object, delay_ms: object) -> None:
    """A clear error for a rate or delay that makes no sense, before anything is built."""

    def number(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if rate_mbit is not None and not (number(rate_mbit) and 0.01 <= rate_mbit <= 100_000):  # type: ignore[operator]
        raise ValueError(_t(
"rate_mbit is each link's bandwidth in Mbit/s, a number from 0.01 to 100000 "
"(or None for no limit); got {value!r}.", value=rate_mbit))  # fmt: skip
    if delay_ms is not None and not (number(delay_ms) and 0 <= delay_ms <= 10_000):  # type: ignore[operator]
        raise ValueError(_t(
"delay_ms is the delay each host adds to what it sends, in milliseconds, a number "
"from 0 to 10000 (or None for none); got {value!r}.", value=delay_ms))  # fmt: skip


def tc_commands(rate_mbit: float | None, delay_ms: float | None) -> list[list[str]]:
    """The ``tc`` commands (after ``tc -n NETNS``, with DEV for the device) that shape one link.

    tbf (tc-tbf(8) of iproute2): a token bucket filled at ``rate``, at most ``burst`` bytes.
    The parameters and why:

    - ``burst``: what may pass at full speed after an idle moment: 0.2 ms worth of the rate,
      but at least two full frames (2 x 1514 B; tbf needs one frame at least). A big burst
      lets small messages through unshaped and bends chapter 04's latency-bandwidth
      measurements: with 1 ms worth, 64 KiB messages crossed a 1000 Mbit/s link at twice
      the rate. Much smaller, and the timer that refills the bucket has to wake too often
      to keep up with high rates. It also sets the largest packet tbf passes whole: veth hands the qdisc
      TCP segments of up to 64 KiB (GSO), and tbf cuts a larger one into frames
      (``tbf_segment`` in the kernel's net/sched/sch_tbf.c) instead of letting it through at
      once. htb, tried first, lets such a 64 KiB packet pass and charges the bucket after:
      a ping-pong of 32 KiB messages then ran at 2.6 times the rate.
    - ``limit``: the bytes that may wait in the queue: 100 ms worth of the rate, at least
      1 MiB, so that the frames of several cut-up 64 KiB packets fit (TCP's own small-queue
      limit keeps the queue short anyway; a drop here would show up as retransmission
      timeouts in the measurements). tc-tbf(8) takes ``limit`` or ``latency``: one of them.
    - a delay: tbf is classful with one class (``1:1``), and netem goes under it: packets
      wait out the delay in netem, then pass the bucket. netem's own ``limit`` (packets,
      default 1000) grows with rate x delay, the bytes in flight.
    - a delay without a rate: netem alone as the root.
    """
    cmds: list[list[str]] = []
    if rate_mbit:
        bps = rate_mbit * 1e6 / 8
        burst = max(2 * 1514, int(bps * 2e-4))
        limit = max(1 << 20, int(bps * 0.1))
        cmds.append(["qdisc", "add", "dev", "DEV", "root", "handle", "1:", "tbf",
                     "rate", f"{rate_mbit}mbit", "burst", str(burst), "limit", str(limit)])  # fmt: skip
    if delay_ms:
        frames = int((rate_mbit or 10_000) * 1e6 / 8 * delay_ms * 1e-3 / 1514)
        where = ["parent", "1:1", "handle", "10:"] if rate_mbit else ["root", "handle", "10:"]
        cmds.append(["qdisc", "add", "dev", "DEV", *where, "netem", "delay", f"{delay_ms}ms",
                     "limit", str(max(1000, 2 * frames))])  # fmt: skip
    return cmds


def _tc(netns: str, dev: str, args: list[str]) -> subprocess.CompletedProcess:
    argv = ["tc", "-n", netns, *(dev if a == "DEV" else a for a in args)]
    return subprocess.run(argv, capture_output=True, text=True)


def shape(netns: str, dev: str, rate_mbit: float | None, delay_ms: float | None) -> None:
    """Shape what ``dev`` (in ``netns``) sends: tbf at ``rate_mbit``, netem ``delay_ms``."""
    for args in tc_commands(rate_mbit, delay_ms):
        done = _tc(netns, dev, args)
        if done.returncode != 0:
            raise RuntimeError(_t("`{command}` failed: {error}",
                                  command="tc -n " + netns + " " + " ".join(args).replace("DEV", dev),
                                  error=done.stderr.strip()))  # fmt: skip


def shaping_unavailable_reason(rate_mbit: float | None, delay_ms: float | None) -> str | None:
    """Why links cannot be shaped as asked here, in the current language; None if they can.

    Tried for real on the loopback of a throw-away namespace (removed at once), so that a
    kernel without tbf or netem is found before any host is built.
    """
    if not (rate_mbit or delay_ms):
        return None
    if shutil.which("tc") is None:
        return _t("Shaping links needs the `tc` command (Debian: apt-get install iproute2).")
    probe = probe_name()
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return made.stderr.strip()
    try:
        cmds = tc_commands(rate_mbit, delay_ms)
        for args in cmds:
            done = _tc(probe, "lo", args)
            if done.returncode == 0:
                continue
            if "netem" in args:
                return _t(
"A delay needs the kernel's netem qdisc (module sch_netem), which this kernel does not "
"have ({error}). Leave delay_ms out to shape the bandwidth only (tbf is enough for that), "
"or use a kernel with netem (Debian and Ubuntu kernels usually have it: modprobe sch_netem)."
, error=done.stderr.strip() or "tc failed")  # fmt: skip
            return _t(
"This kernel cannot shape a link with the tbf qdisc ({error}): it needs module sch_tbf."
, error=done.stderr.strip() or "tc failed")  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None
