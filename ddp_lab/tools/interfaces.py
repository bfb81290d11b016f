"""Which network interface gloo and NCCL use, and why: the doctor's network lines.

Two libraries, two rules. Gloo (without ``GLOO_SOCKET_IFNAME``) binds to what the hostname
resolves to, which on a Debian machine is the loopback ``127.0.1.1`` (chapter 09's failure).
NCCL never resolves the hostname: it picks interfaces by name. Both read their variable
differently (exact names vs prefixes). Each function here names the source file it follows;
:mod:`ddp_lab.tools.doctor` gathers the facts and shows the findings.
"""

from __future__ import annotations

from typing import Protocol

from ddp_lab.i18n import pair
from ddp_lab.tools import cuda_compat as cc

OK, WARNING, PROBLEM = cc.OK, cc.WARNING, cc.PROBLEM


class NetworkFacts(Protocol):
    """What these rules read (``doctor.Facts`` has it)."""

    env: dict[str, str]
    hostname: str
    hostname_addrs: list[str]
    iface_addrs: dict[str, list[str]]
    interfaces: list[str]


def findings(f: NetworkFacts) -> list[tuple[str, str, str, str, str]]:
    """The doctor's lines (key, level, value, en, zh): gloo's and NCCL's choice, bad names."""
    out = []
    level, value, en, zh = gloo_interface(f)
    if value:
        out.append(("gloo_interface", level, value, en, zh))
    level, value, en, zh = nccl_interface(f)
    if value:
        out.append(("nccl_interface", level, value, en, zh))
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = f.env.get(var)
        if value and f.interfaces:
            missing = missing_interfaces(var, value, f.interfaces)
            if missing:
                out.append(
                    (
                        var,
                        PROBLEM,
                        f"{var}={value}: no interface {missing[0]!r} "
                        f"(have {', '.join(f.interfaces)})",
                        *pair(
                            "Set {var} to one of: {interfaces}.",
                            var=var,
                            interfaces=", ".join(f.interfaces),
                        ),
                    )
                )
    return out


def gloo_interface(f: NetworkFacts) -> tuple[str, str, str, str]:
    """Which interface gloo binds to without being told, and why: (level, value, en, zh).

    The rule is ``ProcessGroupGloo::createDefaultDevice`` in
    torch/csrc/distributed/c10d/ProcessGroupGloo.cpp: GLOO_SOCKET_IFNAME wins; else the
    first address the hostname resolves to that can be bound; else the loopback, with the
    warning "Unable to resolve hostname to a (local) address".
    """
    named = f.env.get("GLOO_SOCKET_IFNAME")
    if named:
        return OK, f"gloo binds to {named} (GLOO_SOCKET_IFNAME)", "", ""
    if not f.hostname:
        return OK, "", "", ""  # not gathered (fake facts)
    owner = {a: name for name, addrs in f.iface_addrs.items() for a in addrs}
    usable = [a for a in f.hostname_addrs if a in owner or a.startswith("127.") or a == "::1"]
    if usable:
        addr = usable[0]
        iface = owner.get(addr, "lo")
        why = f"hostname {f.hostname!r} resolves to {addr}"
    else:
        addr, iface = "127.0.0.1", "lo"
        why = f"hostname {f.hostname!r} does not resolve to a local address: loopback fallback"
    value = f"gloo binds to {iface} ({addr}): {why}; GLOO_SOCKET_IFNAME is not set"
    if iface != "lo" and not addr.startswith("127.") and addr != "::1":
        return OK, value, "", ""
    others = ", ".join(n for n in f.iface_addrs if n != "lo") or "-"
    en, zh = pair(
        "Fine on one machine. On several, the other hosts cannot reach {addr}: "
        "set GLOO_SOCKET_IFNAME to the interface between the nodes (have: "
        "{interfaces}), or map {hostname} to that interface's address in "
        "/etc/hosts (chapter 09).",
        addr=addr,
        interfaces=others,
        hostname=f.hostname,
    )
    return WARNING, value, en, zh


def _nccl_match(names: list[str], pattern: str) -> list[str]:
    """``ncclOsFindInterfaces``: prefixes, ``=`` exact names, ``^`` everything but these."""
    exclude = pattern.startswith("^")
    pattern = pattern[1:] if exclude else pattern
    exact = pattern.startswith("=")
    wanted = [w.split(":")[0] for w in pattern.lstrip("=").split(",") if w]
    hit = (lambda n, w: n == w) if exact else (lambda n, w: n.startswith(w))
    return [n for n in names if any(hit(n, w) for w in wanted) != exclude]


def nccl_interface(f: NetworkFacts) -> tuple[str, str, str, str]:
    """Which interfaces NCCL's sockets use, and why: (level, value, en, zh).

    The rule is ``ncclFindInterfaces`` in NCCL's src/misc/socket.cc: NCCL_SOCKET_IFNAME
    (longer than one character) wins; else ``ib*``; else the subnet of NCCL_COMM_ID; else
    anything but ``docker*``, ``lo*`` and ``virbr*``; else docker, then lo, then virbr. NCCL
    also skips interfaces that are not running and IPv6 loopback addresses: these facts
    (``ip -o addr``) list addresses, so an interface that is down is counted here.
    """
    names = [n for n, addrs in f.iface_addrs.items() if any(a != "::1" for a in addrs)]
    if not names:
        return OK, "", "", ""  # not gathered (fake facts)
    named = f.env.get("NCCL_SOCKET_IFNAME", "")
    if len(named) > 1:
        found = _nccl_match(names, named)
        # none found: the NCCL_SOCKET_IFNAME finding below says so
        return (
            OK,
            (f"NCCL uses {', '.join(found)} (NCCL_SOCKET_IFNAME={named})" if found else ""),
            "",
            "",
        )
    if len(f.env.get("NCCL_COMM_ID", "")) > 1:
        return OK, "NCCL uses the interface in NCCL_COMM_ID's subnet (unless an ib* exists)", "", ""
    steps = [("ib", "an InfiniBand (IPoIB) interface comes first"),
             ("^docker,lo,virbr", "no ib*: the first interfaces not docker*, lo* or virbr*"),
             ("docker", "nothing else: docker*"), ("lo", "nothing else: the loopback"),
             ("virbr", "nothing else: virbr*")]  # fmt: skip
    pattern, why, found = next(
        ((p, w, hit) for p, w in steps if (hit := _nccl_match(names, p))), ("", "", names[:1])
    )
    value = f"NCCL uses {', '.join(found)}: {why}; NCCL_SOCKET_IFNAME is not set"
    if pattern in ("ib", "^docker,lo,virbr"):
        return OK, value, "", ""
    others = ", ".join(n for n in names if n != found[0]) or "-"
    en, zh = pair(
        "Fine on one machine. Across machines NCCL's bootstrap would advertise "
        "{iface}, which the other hosts cannot reach: set NCCL_SOCKET_IFNAME to "
        "the interface between the nodes (have: {interfaces}).",
        iface=found[0],
        interfaces=others,
    )
    return WARNING, value, en, zh


def missing_interfaces(var: str, value: str, interfaces: list[str]) -> list[str]:
    """The names in ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` that match no interface.

    The two variables follow different rules. Gloo splits its value at commas and looks up
    each name exactly (``lookupAddrForIface`` in gloo/transport/tcp/device.cc compares with
    ``strcmp``; torch/csrc/distributed/c10d/init.cpp splits the list), so ``eth`` does not
    find ``eth0``. NCCL matches prefixes (``eth`` finds eth0 and eth1), a leading ``=``
    asks for exact names and a leading ``^`` excludes (NCCL's src/os/linux.cc,
    ``ncclOsFindInterfaces``, and src/misc/utils.cc, ``matchIfList``); an exclude list names
    nothing to look for.
    """
    if var == "GLOO_SOCKET_IFNAME":
        return [w for w in value.split(",") if w and w not in interfaces]
    if value.startswith("^"):
        return []
    exact = value.startswith("=")
    wanted = [w for w in value.lstrip("=").split(",") if w]
    if exact:
        return [w for w in wanted if w not in interfaces]
    return [w for w in wanted if not any(i.startswith(w) for i in interfaces)]
