"""Bytes between the ranks of one exercise, observed from outside them (the grader's side).

The ranks of a per-rank exercise (``course.grading.rankhost``) share one private network namespace,
held by the pool's *network holder*, and nothing else: gloo's pairs and the TCPStore are TCP
connections on that namespace's loopback. The verdict process reads, before and after a case,

- every TCP socket of that namespace with its kernel counters (``ss -tinpe`` run through
  ``nsenter --net``: ``bytes_sent``/``bytes_received`` of each end, and the host pids of the
  processes that hold it, which ``ss`` finds in the host's ``/proc``); a socket belongs to
  rank r when every process that holds it descends from the sandbox the pool started for
  rank r;
- the loopback's own byte count (``/proc/<holder>/net/dev``), which counts every packet of the
  namespace, TCP or not, whichever socket sent it, closed or open.

The bytes are tied to the connections of the process group the grader set up for the case
(``group_of``): the TCP connections between two ranks that appeared while the ranks joined
the case's group, before any of the learner's code ran in them, read here from outside, one
per pair of ranks. Per direction, only what crossed those connections counts as sent; bytes
between the ranks on any other connection (a new group's, an earlier case's group's, a socket
of the learner's own) are ``outside``. ``course.grading.rankhost`` reads the counters between
the learner's calls (the ranks wait for the grader there), so each call's bytes are its own.

Nothing here runs in a rank, and nothing a rank reports is used: the counters are the
kernel's. What is left unseen: data that does not travel as IP packets (an abstract unix
socket in the shared namespace); the bytes sent per pair are then too *low*, which is why the
checker also asks for a lower bound on the ring's bytes, not only an upper one. Filler sent
through torch meets that bound, so a locked rank may open IP sockets only
(``guard.INET``). Bytes on a
TCP connection closed during the case, and on UDP, have no socket to name them: they show as
``hidden`` (loopback bytes that no open socket explains).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

# Per packet on the loopback, besides its TCP payload: 14 (the Ethernet header loopback
# keeps) + 20 (IPv4) + 32 (TCP with the timestamp option Linux uses by default) bytes.
HEADER_BYTES = 66


@dataclass
class End:
    """One end of a TCP connection in the ranks' namespace, with its kernel counters."""

    local: str
    peer: str
    inode: int
    pids: tuple[int, ...]
    sent: int
    received: int
    segs_out: int


@dataclass
class Snapshot:
    ends: dict[tuple[str, str, int], End]
    lo_bytes: int  # bytes sent on the namespace's loopback so far (every packet)
    segs_out: int  # TCP segments sent in the namespace so far (/proc/<holder>/net/snmp)


@dataclass
class Traffic:
    """What moved during one case: payload bytes from rank a to rank b, and the rest."""

    pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    messages: dict[tuple[int, int], int] = field(default_factory=dict)  # data segments
    store: int = 0  # bytes to and from the TCPStore (the rendezvous), not between ranks
    unattributed: int = 0  # on an open socket that is not one rank's
    hidden: int = 0  # loopback bytes that no open socket's counters explain
    outside: int = 0  # between ranks, on a connection that is not the case's group's

    def sent(self, a: int, b: int) -> int:
        return self.pairs.get((a, b), 0)


def combined(a: Traffic, b: Traffic) -> Traffic:
    """What moved in ``a``'s stretch and then in ``b``'s, as one."""
    out = Traffic()
    for t in (a, b):
        for key, value in t.pairs.items():
            out.pairs[key] = out.pairs.get(key, 0) + value
        for key, value in t.messages.items():
            out.messages[key] = out.messages.get(key, 0) + value
        out.store += t.store
        out.unattributed += t.unattributed
        out.hidden += t.hidden
        out.outside += t.outside
    return out


_FIELD = re.compile(r"\b(bytes_sent|bytes_received|segs_out|ino):(\d+)")
_PID = re.compile(r"pid=(\d+)")


def tools() -> tuple[str, str] | None:
    """(ss, nsenter), or None where either is missing."""
    ss, nsenter = shutil.which("ss"), shutil.which("nsenter")
    return (ss, nsenter) if ss and nsenter else None


def _enter(holder_pid: int) -> list[str]:
    found = tools()
    assert found is not None
    enter = [found[1], f"--net=/proc/{holder_pid}/ns/net"]
    if os.geteuid() != 0:  # the holder's network belongs to its user namespace
        enter += [f"--user=/proc/{holder_pid}/ns/user", "--preserve-credentials"]
    return [*enter, "--", found[0]]


def parse_ss(text: str) -> dict[tuple[str, str, int], End]:
    """``ss -tinpeOH`` lines (one socket a line) as ends keyed by (local, peer, inode)."""
    ends = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and not parts[0].isdigit():  # the State column (shown with "state all")
            parts = parts[1:]
        if len(parts) < 4:
            continue
        local, peer = parts[2], parts[3]  # after Recv-Q and Send-Q
        values = {k: int(v) for k, v in _FIELD.findall(line)}
        end = End(
            local,
            peer,
            values.get("ino", 0),
            tuple(sorted({int(p) for p in _PID.findall(line)})),
            values.get("bytes_sent", 0),
            values.get("bytes_received", 0),
            values.get("segs_out", 0),
        )
        ends[(local, peer, end.inode)] = end
    return ends


def _lo_bytes(holder_pid: int) -> int:
    with open(f"/proc/{holder_pid}/net/dev", encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])  # transmit bytes
    return 0


def _segs_out(holder_pid: int) -> int:
    with open(f"/proc/{holder_pid}/net/snmp", encoding="ascii") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")]) if len(rows) == 2 else 0


# Most bytes of ``ss`` output read (a line is ~600 bytes; a case has a few dozen sockets).
# Ranks that open sockets by the thousand make the snapshot fail, and the case with it.
MAX_SS_BYTES = 8 << 20


class Unreadable(RuntimeError):
    """The namespace's counters could not be read (too many sockets, ``ss`` failed)."""


def snapshot(holder_pid: int) -> Snapshot:
    """Every TCP socket of the holder's namespace with its counters, and the loopback's."""
    proc = subprocess.Popen(
        [*_enter(holder_pid), "-tinpeOH", "state", "all"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    try:
        out = proc.stdout.read(MAX_SS_BYTES + 1)  # to the end of its output, or the cap
        if len(out) > MAX_SS_BYTES:
            raise Unreadable(f"ss wrote more than {MAX_SS_BYTES} bytes")
        if proc.wait(timeout=30) != 0:
            raise Unreadable(f"ss exited with {proc.returncode}")
    except subprocess.TimeoutExpired:
        raise Unreadable("ss did not end") from None
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    text = out.decode("utf-8", "replace")
    return Snapshot(parse_ss(text), _lo_bytes(holder_pid), _segs_out(holder_pid))


def rank_of(pid: int, roots: dict[int, int]) -> int | None:
    """The rank whose sandbox (host pid in ``roots``: pid -> rank) ``pid`` descends from."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid in roots:
            return roots[pid]
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            return None
        pid = int(stat.rpartition(")")[2].split()[1])  # the field after the state: ppid
        seen += 1
    return None


def _port(address: str) -> int:
    try:
        return int(address.rpartition(":")[2])
    except ValueError:
        return -1


class GroupUnclear(RuntimeError):
    """The case's group is not one new connection per pair of ranks."""


Group = dict[tuple[str, str], tuple[int, int]]  # (local, peer) of an end -> (its rank, peer's)


def group_of(
    before: Snapshot, joined: Snapshot, roots: dict[int, int], store: int, n: int
) -> Group:
    """The connections of the group the ranks joined between ``before`` and ``joined``.

    Every TCP connection that is new in ``joined``, is not the TCPStore's (port ``store``),
    and whose two ends are held by two different ranks (``roots``: the host pid of each rank's
    sandbox -> its rank): gloo's full mesh, one connection per pair of the ``n`` ranks. Both
    ends of each, keyed by (local, peer) address. Anything else (no connection for a pair, or
    two) raises ``GroupUnclear``: the grader cannot tell the group's bytes from others'.
    """
    ends = {k: e for k, e in joined.ends.items() if k not in before.ends}
    by_pair = {(e.local, e.peer): e for e in ends.values()}
    group: Group = {}
    for end in ends.values():
        if store in (_port(end.local), _port(end.peer)):
            continue
        other = by_pair.get((end.peer, end.local))
        if other is None:
            continue
        a = {rank_of(p, roots) for p in end.pids}
        b = {rank_of(p, roots) for p in other.pids}
        if len(a) != 1 or len(b) != 1 or None in a | b or a == b:
            continue
        group[(end.local, end.peer)] = (a.pop(), b.pop())
    pairs = sorted(group.values())
    want = sorted((a, b) for a in range(n) for b in range(n) if a != b)
    if pairs != want:
        raise GroupUnclear(f"connections between ranks {pairs}, expected one per pair")
    return group


def difference(
    before: Snapshot,
    after: Snapshot,
    roots: dict[int, int],
    store: int,
    group: Group | None = None,
) -> Traffic:
    """What moved between the two snapshots, per ordered rank pair.

    ``roots``: the host pid of each rank's sandbox -> its rank; ``store``: the TCPStore's port
    (its connections are the rendezvous, counted apart). A connection's bytes from a to b are
    what b's end received (``bytes_sent`` also counts retransmissions, which a busy machine
    makes even on loopback). With ``group`` (``group_of``), only the group's connections count
    in ``pairs``; bytes between ranks on any other connection are ``outside``.
    """
    owner: dict[tuple[str, str, int], int | None] = {}
    for key, end in after.ends.items():
        ranks = {rank_of(p, roots) for p in end.pids}
        owner[key] = ranks.pop() if len(ranks) == 1 else None
    by_pair = {(e.local, e.peer): k for k, e in after.ends.items()}
    traffic = Traffic()
    explained = 0
    for key, end in after.ends.items():
        old = before.ends.get(key)
        sent = end.sent - (old.sent if old else 0)
        received = end.received - (old.received if old else 0)
        explained += max(sent, 0)
        if sent <= 0 and received <= 0:
            continue
        if store in (_port(end.local), _port(end.peer)):
            traffic.store += max(sent, 0)
            continue
        other = by_pair.get((end.peer, end.local))
        a, b = owner[key], owner.get(other) if other else None
        if a is None or b is None:
            traffic.unattributed += max(sent, 0)
            continue
        other_end = after.ends[other]  # type: ignore[index]
        old_other = before.ends.get(other)  # type: ignore[arg-type]
        got = other_end.received - (old_other.received if old_other else 0)
        if got <= 0:
            continue
        if group is not None and group.get((end.local, end.peer)) != (a, b):
            traffic.outside += got
            continue
        traffic.pairs[(a, b)] = traffic.pairs.get((a, b), 0) + got
        segs = end.segs_out - (old.segs_out if old else 0)
        traffic.messages[(a, b)] = traffic.messages.get((a, b), 0) + max(segs, 0)
    wire = after.lo_bytes - before.lo_bytes
    headers = HEADER_BYTES * (after.segs_out - before.segs_out)
    traffic.hidden = max(wire - headers - explained, 0)
    return traffic
