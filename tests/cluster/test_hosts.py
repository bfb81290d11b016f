"""ddp_lab.cluster.hosts: namespaces on a bridge, built and removed by one call, nothing left behind.

These tests need root (CI runs as root); elsewhere they skip and say why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_lab.cluster import hosts
from ddp_lab.course import cli
from ddp_lab.i18n import pair

ROOT = Path(__file__).resolve().parents[2]
REASON = hosts.unavailable_reason() if hasattr(os, "geteuid") else "not Linux"
needs_hosts = pytest.mark.skipif(bool(REASON), reason=f"cannot build hosts here: {REASON}")


def left_behind(tag: str) -> list[str]:
    """Everything of cluster ``tag`` still on this machine."""
    found = hosts.namespaces(tag)
    found += [str(p) for p in hosts.ETC_NETNS.glob(f"{hosts.PREFIX}-{tag}-*")]
    found += [str(p) for p in hosts.STATE_DIR.glob(f"{tag}.json")]
    found += [str(p) for p in [hosts.tmpdir(tag)] if p.exists()]
    return found


def test_not_root_says_so_in_both_languages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    en, zh = pair(
        "Building hosts needs root: network namespaces are created under "
        "/run/netns by `ip netns add`. Run as root (e.g. in the CI container), "
        "or read the stored outputs of a real run that chapter 09 shows instead."
    )
    assert hosts.unavailable_reason() in (en, zh)
    assert "root" in en and "root" in zh
    c = hosts.Cluster(2)
    with pytest.raises(hosts.HostsUnavailable):
        c.up()
    assert not c.hosts and not left_behind(c.tag)  # stopped before anything started


def test_without_iproute2_the_reason_is_the_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No `ip` on PATH (a GPU machine without iproute2): HostsUnavailable with the reason,
    not a FileNotFoundError from removing the cluster that never came up (issue 40)."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no ip, no unshare
    with pytest.raises(hosts.HostsUnavailable, match="`ip`"), hosts.cluster(2, rate_mbit=100):
        pass
    assert hosts.namespaces() == []


@needs_hosts
def test_two_hosts_have_their_own_name_address_and_interface() -> None:
    with hosts.cluster(2) as c:
        tag = c.tag
        outs = [c.run(i, ["sh", "-c", "hostname; ip -br -4 addr show eth0"]).stdout for i in (0, 1)]
        # what runs on a host makes its temporary files in the cluster's TMPDIR, removed with it
        made = c.run(1, [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"])
        assert made.stdout.startswith(str(hosts.tmpdir(tag)) + "/")
        assert outs[0].split()[0] == "host0" and "10.77.0.1/24" in outs[0]
        assert outs[1].split()[0] == "host1" and "10.77.0.2/24" in outs[1]
        port = c.free_port(0)
        server = c.start(0, [sys.executable, "-c", textwrap.dedent(f"""
            import socket
            s = socket.create_server(("10.77.0.1", {port}))
            print(s.accept()[0].recv(5).decode(), flush=True)
            """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        client = f"""
import socket, time
for _ in range(100):
    try:
        socket.create_connection(("10.77.0.1", {port}), timeout=2).sendall(b"hello")
        break
    except OSError:
        time.sleep(0.1)
"""
        assert c.run(1, [sys.executable, "-c", client], timeout=30).returncode == 0
        assert server.communicate(timeout=30)[0].strip() == "hello"
        # this machine's own stack cannot reach the hosts: they are on their own bridge
        assert "10.77.0.1" not in subprocess.run(["ip", "-4", "addr"], capture_output=True,
                                                 text=True).stdout  # fmt: skip
    assert not left_behind(tag)


@needs_hosts
@pytest.mark.parametrize("mode", ["debian", "cluster"])
def test_every_host_resolves_the_names_its_etc_hosts_mode_promises(mode: str) -> None:
    with hosts.cluster(3, etc_hosts=mode) as c:
        for i in range(3):
            out = c.run(i, ["getent", "ahostsv4", *(f"host{j}" for j in range(3))]).stdout
            if mode == "cluster":  # every host, from every host, at its real address
                for j in range(3):
                    assert f"10.77.0.{j + 1}" in out, (i, out)
            else:  # only its own name, on the loopback Debian's installer uses
                assert "127.0.1.1" in out and "10.77.0." not in out, (i, out)


@needs_hosts
def test_teardown_after_an_error_kills_what_still_runs() -> None:
    with pytest.raises(ZeroDivisionError), hosts.cluster(2) as c:
        tag = c.tag
        sleeper = c.start(1, ["sleep", "300"])
        raise ZeroDivisionError("a failing cell")
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not left_behind(tag)


def _owner_script(hold: str) -> str:
    return textwrap.dedent(f"""
        import signal, sys, time
        from ddp_lab.cluster import hosts
        # A shell's background job ignores SIGINT and Python keeps an inherited SIG_IGN:
        # be the owner a terminal's Ctrl-C reaches, whatever started the test run.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with hosts.cluster(2) as c:
            c.start(0, ["sleep", "300"])
            print(c.tag, flush=True)
            {hold}
        """)


@needs_hosts
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_killed_owner_leaves_nothing_after_down(sig: int) -> None:
    owner = subprocess.Popen([sys.executable, "-c", _owner_script("time.sleep(300)")],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert owner.stdout is not None
    tag = owner.stdout.readline().strip()
    assert hosts.namespaces(tag)
    owner.send_signal(sig)
    owner.wait(timeout=30)
    if sig == signal.SIGKILL:  # nothing can run on SIGKILL: `down` finds the orphan
        assert hosts.clusters()[tag]["alive"] is False
        hosts.down()
    assert not left_behind(tag)


@needs_hosts
def test_down_spares_a_cluster_in_use() -> None:
    with hosts.cluster(1) as c:
        hosts.down()  # what a parallel test's cleanup would do
        assert c.run(0, ["true"]).returncode == 0 and hosts.namespaces(c.tag)
    assert not left_behind(c.tag)


@needs_hosts
def test_cli_up_status_down(capsys: pytest.CaptureFixture[str]) -> None:
    before = set(hosts.clusters())
    assert cli.main(["hosts", "up", "2"]) == 0
    tags = set(hosts.clusters()) - before
    assert len(tags) == 1
    tag = tags.pop()
    assert "host1 10.77.0.2 eth0" in capsys.readouterr().out
    cli.main(["hosts", "status"])
    assert f"{tag}: orphan" in capsys.readouterr().out
    assert cli.main(["hosts", "down"]) == 0
    assert not left_behind(tag)


def test_stored_run_shows_every_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where hosts cannot be built, the chapter shows the recorded real run instead."""
    from ddp_lab.labs import two_hosts as th

    monkeypatch.setattr(hosts, "unavailable_reason", lambda: "not root")
    g = th.Gallery()
    assert set(g.runs) == set(th.EXPECT)
    for name in th.EXPECT:
        assert g[name].key_lines(), name
    assert g["static"].nodes[0].accuracy() == g["one_host"].nodes[0].accuracy()
    # what the chapter says of each node: host0 times out, host1 loses the store
    host0, host1 = (n.lines(th.EXPECT["nnodes"]) for n in g["nnodes"].nodes)
    assert any("RendezvousTimeoutError" in line for line in host0)
    assert any("RendezvousConnectionError" in line for line in host1)


@needs_hosts
def test_two_hosts_train_like_one_and_every_failure_shows_its_error() -> None:
    """The chapter's runs for real: same accuracy on two hosts, each failure's own error."""
    from ddp_lab.labs import two_hosts as th

    g = th.Gallery()
    one = g["one_host"].nodes[0].accuracy()
    assert one is not None and one > 80
    assert g["static"].nodes[0].accuracy() == one == g["c10d"].nodes[0].accuracy()
    for name in th.EXPECT:
        assert g[name].key_lines(), (name, [n.stdout[-2000:] for n in g[name].nodes])
    for name in ("loopback", "c10d_no_host", "localhost", "firewall", "late_node", "nnodes"):
        assert any(n.returncode or n.stopped for n in g[name].nodes), name
    # the node that joins second decides: --nnodes=2 joining second completes the round at 2
    assert any(line.startswith("world size 2,") for line in g["nnodes_silent"].key_lines())
    assert not [n for n in hosts.namespaces() if n in g.netns]


@needs_hosts
def test_a_live_processs_probe_is_not_a_cluster_and_a_dead_ones_is_removed() -> None:
    """A throw-away namespace (``unavailable_reason``, ``shaping_unavailable_reason``) made by
    a process beside this one, for a moment, is not a cluster: ``clusters()`` leaves it out
    and ``down()`` leaves it alone (a test counting clusters before and after, or a
    ``hosts down`` run, met one in CI). One that a killed process left is removed."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f"{hosts.PROBE_PREFIX}{p.pid}-abcdef-x" for p in (live, dead)]
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True)
        assert hosts.probe_maker(hosts.probe_name()) == os.getpid()
        assert [hosts.probe_maker(n) for n in names] == [live.pid, dead.pid]
        tags = set(hosts.clusters())
        assert f"probe{live.pid}-abcdef" not in tags, tags
        assert f"probe{dead.pid}-abcdef" in tags, tags
        gone = hosts.down()
        assert names[1] in gone and names[0] not in gone, gone
        assert names[0] in hosts.namespaces() and names[1] not in hosts.namespaces()
    finally:
        live.kill()
        live.wait()
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
