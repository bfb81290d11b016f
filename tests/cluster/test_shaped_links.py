"""Links with a bandwidth (``hosts.cluster(n, rate_mbit=..., delay_ms=...)``) and chapter 04's lab.

The shaping tests need root (CI runs as root); elsewhere they skip and say why. The checks of
bad values and of the stored run run everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ddp_lab._moved import MOVED
from ddp_lab.cluster import hosts
from ddp_lab.course import cli
from ddp_lab.i18n import pair
from ddp_lab.labs import shaped_links as sl

REASON = hosts.unavailable_reason() if hasattr(os, "geteuid") else "not Linux"
needs_hosts = pytest.mark.skipif(bool(REASON), reason=f"cannot build hosts here: {REASON}")
NETEM = None if REASON else hosts.shaping_unavailable_reason(None, 1.0)


def left_behind(tag: str) -> list[str]:
    """Everything of cluster ``tag`` still on this machine, and any probe of this process
    (``shaping.probe_name``: the probes of other processes, run beside this one, come and go)."""
    found = hosts.namespaces(tag)
    found += [n for n in hosts.namespaces() if hosts.probe_maker(n) == os.getpid()]
    found += [str(p) for p in hosts.ETC_NETNS.glob(f"{hosts.PREFIX}-{tag}-*")]
    found += [str(p) for p in hosts.STATE_DIR.glob(f"{tag}.json")]
    return found


@pytest.mark.parametrize(
    ("rate", "delay"),
    [
        (0, None),
        (-5, None),
        ("100", None),
        (True, None),
        (float("nan"), None),
        (1e9, None),
        (100, -1),
        (100, "5"),
        (None, float("inf")),
    ],  # fmt: skip
)
def test_bad_rate_or_delay_is_refused_before_anything_is_built(rate: object, delay: object) -> None:
    c = hosts.Cluster(2, rate_mbit=rate, delay_ms=delay)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as err:
        c.up()
    what = "rate_mbit" if delay is None else "delay_ms"
    assert what in str(err.value) and repr(rate if delay is None else delay) in str(err.value)
    assert not c.hosts and not hosts.namespaces(c.tag)


def test_bad_rate_message_exists_in_both_languages() -> None:
    en, zh = pair(
        "rate_mbit is each link's bandwidth in Mbit/s, a number from 0.01 to 100000 "
        "(or None for no limit); got {value!r}.",
        value=-3,
    )
    assert en != zh and "rate_mbit" in zh and "Mbit/s" in zh


def test_cli_refuses_a_bad_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hosts", "up", "2", "--rate-mbit", "-3"]) == 2
    assert "rate_mbit" in capsys.readouterr().err


def test_tc_commands_tbf_for_rate_netem_under_it_for_delay() -> None:
    rate_only = hosts.tc_commands(5000, None)
    assert len(rate_only) == 1 and rate_only[0][4:8] == ["root", "handle", "1:", "tbf"]
    burst = int(rate_only[0][rate_only[0].index("burst") + 1])
    assert burst == 125_000  # 0.2 ms at 5000 Mbit/s
    assert int(hosts.tc_commands(1, None)[0][rate_only[0].index("burst") + 1]) == 2 * 1514
    both = hosts.tc_commands(100, 5)
    assert both[1][4:7] == ["parent", "1:1", "handle"] and "netem" in both[1]
    assert hosts.tc_commands(None, 5)[0][4:6] == ["root", "handle"]


@needs_hosts
def test_a_transfer_takes_the_time_the_rate_allows() -> None:
    """8 MiB from host0 to host1 at 100 Mbit/s: shaping applies (a range, not a speed goal)."""
    rate, size = 100.0, 8 << 20
    with hosts.cluster(2, rate_mbit=rate) as c:
        tag = c.tag
        qdisc = subprocess.run(["tc", "-n", c[0].netns, "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout  # fmt: skip
        assert "tbf" in qdisc and "rate 100Mbit" in qdisc
        port = c.free_port(1)
        server = c.start(1, [sys.executable, "-c", textwrap.dedent(f"""
            import socket, time
            conn = socket.create_server(("10.77.0.2", {port})).accept()[0]
            got, start = 0, None
            while chunk := conn.recv(1 << 20):
                start = start or time.perf_counter()
                got += len(chunk)
            print(got, time.perf_counter() - start)
            """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        client = f"""
import socket, time
for _ in range(100):
    try:
        s = socket.create_connection(("10.77.0.2", {port}))
        break
    except OSError:
        time.sleep(0.05)
s.sendall(bytes({size}))
s.close()
"""
        assert c.run(0, [sys.executable, "-c", client], timeout=60).returncode == 0
        got, seconds = server.communicate(timeout=60)[0].split()
        mbit = int(got) * 8 / float(seconds) / 1e6
        assert int(got) == size
        assert 0.5 * rate <= mbit <= 1.1 * rate, mbit
    assert not left_behind(tag)


@needs_hosts
@pytest.mark.skipif(NETEM is None, reason="this kernel has netem: the delay is applied")
def test_a_delay_without_netem_is_refused_before_anything_is_built() -> None:
    c = hosts.Cluster(2, rate_mbit=100, delay_ms=5)
    with pytest.raises(hosts.ShapingUnavailable) as err:
        c.up()
    assert "netem" in str(err.value)
    en, zh = pair(
        "A delay needs the kernel's netem qdisc (module sch_netem), which this kernel does not "
        "have ({error}). Leave delay_ms out to shape the bandwidth only (tbf is enough for that), "
        "or use a kernel with netem (Debian and Ubuntu kernels usually have it: modprobe sch_netem).",
        error="unknown qdisc",
    )
    assert "netem" in zh and en != zh
    assert not c.hosts and not left_behind(c.tag)
    before = set(hosts.clusters())
    assert cli.main(["hosts", "up", "2", "--delay-ms", "5"]) == 2
    assert set(hosts.clusters()) == before


@needs_hosts
@pytest.mark.skipif(NETEM is not None, reason=f"no netem in this kernel: {NETEM}")
def test_a_delay_shows_in_the_round_trip() -> None:
    """A TCP connect takes one round trip (SYN, SYN-ACK): each host delays what it sends."""
    with hosts.cluster(2, delay_ms=20) as c:
        tag = c.tag
        port = c.free_port(1)
        c.start(
            1,
            [
                sys.executable,
                "-c",
                f"import socket, time; s = socket.create_server(('', {port})); time.sleep(60)",
            ],
        )  # noqa: E501
        code = f"""
import socket, time
for _ in range(100):
    try:
        t = time.perf_counter(); socket.create_connection(("10.77.0.2", {port})); break
    except OSError:
        time.sleep(0.1)
print(time.perf_counter() - t)
"""
        rtt = float(c.run(0, [sys.executable, "-c", code]).stdout)
        assert 2 * 0.020 * 0.9 <= rtt <= 1.0, rtt
    assert not left_behind(tag)


@needs_hosts
def test_cli_up_shapes_and_down_removes(capsys: pytest.CaptureFixture[str]) -> None:
    before = set(hosts.clusters())
    assert cli.main(["hosts", "up", "2", "--rate-mbit", "50"]) == 0
    (tag,) = set(hosts.clusters()) - before
    state = hosts.clusters()[tag]
    for netns, dev in [(h["netns"], "eth0") for h in state["hosts"]] + [
        (f"{hosts.PREFIX}-{tag}-sw", "p0"), (f"{hosts.PREFIX}-{tag}-sw", "p1")]:  # fmt: skip
        shown = subprocess.run(["tc", "-n", netns, "qdisc", "show", "dev", dev],
                               capture_output=True, text=True).stdout  # fmt: skip
        assert "tbf" in shown and "rate 50Mbit" in shown, (netns, dev, shown)
    cli.main(["hosts", "status"])
    assert "50.0 Mbit/s" in capsys.readouterr().out
    assert cli.main(["hosts", "down"]) == 0
    assert not left_behind(tag)


def test_stored_run_has_every_algorithm_at_two_bandwidths_and_a_table() -> None:
    """What the chapter shows where hosts cannot be built: a real run, with its model."""
    record = sl.stored()
    # Recorded before the lab moved to ddp_lab/labs/: the old name still runs the same module.
    python, dash_m, module, verb = record["command"].split()
    assert (python, dash_m, verb) == ("python", "-m", "record")
    assert MOVED.get(module, module) == "ddp_lab.labs.shaped_links"
    rates = [run["rate_mbit"] for run in record["runs"]]
    assert len(rates) >= 2
    for run in record["runs"]:
        assert {r["algorithm"] for r in run["rows"]} == set(sl.ALGORITHMS)
        assert run["alpha"] > 0 and run["beta"] > 0
        # the fitted beta is the shaped rate, within what TCP's headers and Python leave
        assert 0.5 <= 8 / run["beta"] / 1e6 / run["rate_mbit"] <= 1.1, run["rate_mbit"]
        text = sl.table(run)
        assert all(sl.size_label(r["size"]) in text for r in run["rows"])
        big = max(r["size"] for r in run["rows"])
        # at the largest size the link dominates: gather-broadcast moves twice the ring's bytes
        t = {r["algorithm"]: r["time"] for r in run["rows"] if r["size"] == big}
        assert t["gather_broadcast"] > 1.3 * t["gloo"]


def test_crossover_is_where_the_model_terms_meet() -> None:
    run = {"alpha": 1e-4, "beta": 1e-8, "gamma": 0.0, "rows": []}
    s = sl.crossover(run, "ring")
    assert s == pytest.approx(2e4)  # 2 alpha = S beta
    assert sl.predict(run, "ring", s) == pytest.approx(2 * sl.predict(run, "ring", 0))
    assert sl.crossover(run, "gather_broadcast") == pytest.approx(1e4)


def test_bad_sizes_are_refused() -> None:
    for bad in ([3], [0], [True], ["1K"], []):
        with pytest.raises(ValueError):
            sl.check_sizes(bad)  # type: ignore[arg-type]


@needs_hosts
def test_live_lab_measures_the_model_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[hosts.Cluster] = []
    up = hosts.Cluster.up
    monkeypatch.setattr(hosts.Cluster, "up", lambda self: built.append(self) or up(self))
    run = sl.measure(100, sizes=[1 << 10, 256 << 10], iters=2)
    assert {r["algorithm"] for r in run["rows"]} == set(sl.ALGORITHMS)
    assert 0.5 <= 8 / run["beta"] / 1e6 / 100 <= 1.1  # the calibration sees the shaped rate
    assert len(built) == 1 and not left_behind(built[0].tag)


def test_calibrate_runs_on_loopback_and_feeds_fit():
    """Chapter 04's traced section calibrates on the learner's machine: no hosts, no root."""
    import ddp_lab as dl

    out = dl.spawn(sl.calibrate, args=((4, 64 << 10), 1, 0), nprocs=2, backend="gloo", quiet=True)
    points = out[0]["calibration"]
    assert [m for m, _ in points] == [4, 64 << 10]
    assert all(t > 0 for _, t in points) and out[0]["gamma"] > 0
    alpha, beta = sl.fit(points)
    assert alpha == points[0][1] and beta > 0
