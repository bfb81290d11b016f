"""All-reduce between two hosts whose links have a bandwidth, measured next to the alpha-beta model.

Chapter 04's lab. Two hosts (``ddp_lab.cluster.hosts``, network namespaces) get links shaped
to ``rate_mbit`` each way by ``tc``'s tbf qdisc; one gloo rank runs on each. The ranks first
**calibrate**: a ping-pong of ``dist.send``/``dist.recv`` at several sizes, whose one-way times
give ``alpha`` (the fastest 4-byte message) and ``beta`` (a least-squares slope over the larger
ones), and ``gamma`` (the time to add one byte) comes from a local ``add_``. Then they time the same all-reduce three ways at each message size:

- ``ring``: the hand-written ring of chapter 05 (``ddp_lab.ring.ring_all_reduce``);
- ``gloo``: gloo's own ``dist.all_reduce``;
- ``gather_broadcast``: the naive one, ``dist.gather`` to rank 0, a sum there,
  ``dist.broadcast`` back.

Each measured median sits next to the model's prediction from ``ddp_lab.costs`` with the
fitted alpha, beta and gamma: ``costs.ring`` for the hand ring (with 2 ranks, the ring and
recursive halving-doubling send the same messages: half the buffer each way, then the other
half), ``costs.gloo_cpu`` for gloo's all-reduce (the segmented ring gloo runs: p >= 2
segments per chunk, so 4 alpha at 2 ranks where the plain ring has 2), and
``costs.parameter_server`` for gather-broadcast.

Where hosts cannot be built (not root), :func:`lab` shows the stored real run instead:
``python -m ddp_lab.labs.shaped_links record`` wrote ``shaped_links_run.json`` next to this
file, with the date and the command.

Teaching version: nccl-tests and the OSU benchmarks measure the same way (median of timed
iterations after a warm-up), on real links; here the "link" is a veth pair with a token
bucket, and alpha is mostly the software's own latency (Python, gloo, TCP in the kernel).
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddp_lab import costs
from ddp_lab.cluster import hosts, lab_reason, load_record
from ddp_lab.i18n import _t

RECORD = Path(__file__).with_name("shaped_links_run.json")
ALGORITHMS = ("ring", "gloo", "gather_broadcast")


def _gloo_all_reduce(n: int, size: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """``costs.gloo_cpu`` for ``dist.all_reduce``: gloo's segmented ring."""
    return costs.gloo_cpu("all_reduce", n, size, alpha, beta, gamma)


MODELS = {"ring": costs.ring, "gloo": _gloo_all_reduce, "gather_broadcast": costs.parameter_server}
CALIBRATION_SIZES = (4, 16 << 10, 64 << 10, 256 << 10)
# The stored sweep: every rate, sizes up to about a quarter second of one message.
RECORD_RATES = (10, 100)
RECORD_SIZES = (4, 64, 256, *(4**k for k in range(5, 13)))  # 4 B, 64 B, 256 B, 1 KiB .. 16 MiB


def sizes_for(
    rate_mbit: float, sizes: Sequence[int] = RECORD_SIZES, seconds: float = 0.25
) -> list[int]:
    """The sizes whose one message takes at most ``seconds`` at ``rate_mbit`` (at least two)."""
    cap = rate_mbit * 1e6 / 8 * seconds
    kept = [s for s in sizes if s <= cap]
    return kept if len(kept) >= 2 else list(sizes[:2])


# ---------------------------------------------------------------- one rank, on one host


def _gather_broadcast(buf: Any) -> Any:
    """All-reduce the naive way: everything to rank 0, summed there, sent back."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    if dist.get_rank() == 0:
        parts = [torch.empty_like(buf) for _ in range(n)]
        dist.gather(buf, parts, dst=0)
        torch.sum(torch.stack(parts), 0, out=buf)
    else:
        dist.gather(buf, None, dst=0)
    dist.broadcast(buf, src=0)
    return buf


def fit(points: Sequence[Sequence[float]]) -> tuple[float, float]:
    """alpha and beta of ``t = alpha + m * beta`` from (m, t) calibration points.

    alpha is the time of the smallest message (4 bytes: no bandwidth term to speak of; the
    fastest of its round trips, see ``_rank_main``);
    beta is the least-squares slope of ``t - alpha`` over the other sizes (weighted by
    size, so the largest messages, where the link's rate shows best, count most). A plain
    least-squares line through all points leaves alpha to chance: the largest times are
    thousands of times the smallest, and a few microseconds of noise up there moves the
    intercept more than alpha itself.
    """
    pts = sorted((float(m), float(t)) for m, t in points)
    alpha = pts[0][1]
    rest = [(m, t - alpha) for m, t in pts[1:]]
    mm = sum(m * m for m, _ in rest)
    beta = max(0.0, sum(m * t for m, t in rest) / mm) if mm else 0.0
    return alpha, beta


def calibrate(
    rank: int, sizes: Sequence[int] = CALIBRATION_SIZES, iters: int = 3, warmup: int = 1
) -> dict:
    """Ping-pong between ranks 0 and 1 at each size, and time a local add: what ``fit`` needs.

    Runs on every rank of a 2-rank gloo group (in the lab: one rank per host; under
    ``dl.spawn(calibrate, nprocs=2, backend="gloo")``: loopback). Returns ``calibration``,
    (bytes, one-way seconds) points for ``fit``, and ``gamma``, seconds to add one byte.
    """
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    calibration = []
    for size in sizes:
        buf = torch.zeros(max(1, size // 4))
        times = []
        # more than the timings: the fit rests on these medians (alpha on the 4-byte one)
        reps = max(iters, 31 if size <= 4 else 11)
        for i in range(warmup + reps):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            if i >= warmup:
                times.append((time.perf_counter() - t0) / 2)  # one way = half a round trip
        # 4 bytes: alpha, the fixed cost of a message, is the fastest of the round trips (load
        # on the machine only ever adds to it); the larger sizes: medians, like the timings
        one_way = min(times) if size <= 4 else statistics.median(times)
        calibration.append((buf.numel() * 4, one_way))
    a, b = torch.rand(1 << 20), torch.rand(1 << 20)
    adds = []
    for _ in range(5):
        t0 = time.perf_counter()
        a.add_(b)
        adds.append(time.perf_counter() - t0)
    gamma = statistics.median(adds) / (a.numel() * 4)
    return {"calibration": calibration, "gamma": gamma}


def _rank_main(spec: dict) -> dict | None:
    """One rank: calibrate, then time every algorithm at every size; rank 0 returns it all."""
    import torch
    import torch.distributed as dist

    from ddp_lab.ring import ring_all_reduce

    rank = spec["rank"]
    dist.init_process_group("gloo", init_method=f"tcp://{spec['addr']}:{spec['port']}",
                            rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=spec["timeout"]))  # fmt: skip
    iters, warmup = spec["iters"], spec["warmup"]
    calibrated = calibrate(rank, spec["calibration_sizes"], iters, warmup)
    calibration, gamma = calibrated["calibration"], calibrated["gamma"]
    fns = {"ring": ring_all_reduce, "gloo": dist.all_reduce, "gather_broadcast": _gather_broadcast}
    rows = []
    for size in spec["sizes"]:
        base = torch.full((max(1, size // 4),), float(rank + 1))
        buf = base.clone()
        times = {name: [] for name in spec["algorithms"]}
        reps = iters * 3 if size <= 16 << 10 else iters  # small ones are cheap, and noisier
        for i in range(warmup + reps):
            for name in spec["algorithms"]:  # alternating: every algorithm sees the same load
                buf.copy_(base)
                dist.barrier()
                t0 = time.perf_counter()
                fns[name](buf)
                took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slower rank sets the time
                if not bool((buf == 3.0).all()):
                    raise RuntimeError(f"{name} gave a wrong sum at {size} bytes")
                if i >= warmup:
                    times[name].append(took.item())
        for name in spec["algorithms"]:
            rows.append({"algorithm": name, "size": buf.numel() * 4,
                         "time": statistics.median(times[name])})  # fmt: skip
    dist.destroy_process_group()
    if rank:
        return None
    return {"rate_mbit": spec["rate_mbit"], "delay_ms": spec["delay_ms"], "gamma": gamma,
            "calibration": calibration, "rows": rows, "iters": iters}  # fmt: skip


# ---------------------------------------------------------------- the lab, on this machine


def check_sizes(sizes: Sequence[int]) -> list[int]:
    """Message sizes in bytes, multiples of 4 (float32), at least one element."""
    out = []
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 4 or s % 4 or s > 1 << 30:
            raise ValueError(_t(
"Message sizes are byte counts of float32 tensors: multiples of 4 from 4 to 2**30, got {value!r}."
, value=s))  # fmt: skip
        out.append(s)
    if not out:
        raise ValueError(_t("Give at least one message size."))
    return out


def measure(
    rate_mbit: float,
    sizes: Sequence[int] = (1 << 10, 16 << 10, 256 << 10),
    algorithms: Sequence[str] = ALGORITHMS,
    iters: int = 3,
    warmup: int = 1,
    delay_ms: float | None = None,
    timeout: float = 300.0,
) -> dict:
    """Build two hosts with links of ``rate_mbit``, run the calibration and the timings there.

    Returns one run: the fitted ``alpha`` (s), ``beta`` (s/byte), ``gamma`` (s/byte) and
    the median time of each (algorithm, size). Everything is removed afterwards.
    """
    hosts.check_shaping(rate_mbit, delay_ms)
    sizes = check_sizes(sizes)
    for name in algorithms:
        if name not in ALGORITHMS:
            raise ValueError(_t("Unknown algorithm {value!r}: choose from {choices}.",
                                value=name, choices=", ".join(ALGORITHMS)))  # fmt: skip
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(_t("iters must be a positive int and warmup a non-negative int."))
    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": root, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": hosts.IFNAME}
    with hosts.cluster(2, rate_mbit=rate_mbit, delay_ms=delay_ms) as c:
        port = c.free_port(0)
        procs = []
        for rank in (0, 1):
            spec = {"rank": rank, "addr": c[0].addr, "port": port, "sizes": sizes,
                    "algorithms": list(algorithms), "iters": iters, "warmup": warmup,
                    "calibration_sizes": list(CALIBRATION_SIZES), "rate_mbit": rate_mbit,
                    "delay_ms": delay_ms, "timeout": timeout}  # fmt: skip
            argv = [sys.executable, "-m", "ddp_lab.labs.shaped_links", "worker", json.dumps(spec)]
            procs.append(c.start(rank, argv, env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True))  # fmt: skip
        outs = []
        deadline = time.monotonic() + timeout
        for rank, p in enumerate(procs):
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for h in c.hosts:
                    hosts.kill_in(h.netns)
                raise TimeoutError(_t("The two hosts did not finish within {seconds:g} s.",
                                      seconds=timeout)) from None  # fmt: skip
            if p.returncode:
                raise RuntimeError(_t("host{rank} failed: {error}", rank=rank,
                                      error=outs[-1][1].strip()[-2000:]))  # fmt: skip
    run = json.loads(outs[0][0].strip().splitlines()[-1])
    run["alpha"], run["beta"] = fit(run["calibration"])
    return run


def predict(run: dict, algorithm: str, size: float) -> float:
    """The model's time for ``algorithm`` at ``size`` bytes with the run's fitted constants."""
    return MODELS[algorithm](2, size, run["alpha"], run["beta"], run["gamma"])


def crossover(run: dict, algorithm: str) -> float:
    """The size (bytes) where the model's bandwidth term equals its latency term.

    Below it latency dominates (time hardly grows with size); above it bandwidth does. With
    2 ranks: ring 2 alpha = S beta, gather-broadcast 2 alpha = 2 S beta (gamma left out:
    adding on this CPU is much faster than any of these links).
    """
    latency = MODELS[algorithm](2, 0.0, run["alpha"], 0.0, 0.0)
    per_byte = MODELS[algorithm](2, 1.0, 0.0, run["beta"], 0.0)
    return latency / per_byte if per_byte else float("inf")


def measured_crossover(run: dict, algorithm: str) -> float | None:
    """The first measured size whose time is at least twice the smallest size's, or None.

    With a smallest size of a few bytes (the stored run: 4 B), its time is the latency alone,
    and twice it is where the bandwidth term has caught up: the measured counterpart of
    :func:`crossover`.
    """
    rows = sorted((r for r in run["rows"] if r["algorithm"] == algorithm), key=lambda r: r["size"])
    if not rows:
        return None
    return next((r["size"] for r in rows if r["time"] >= 2 * rows[0]["time"]), None)


def table(run: dict) -> str:
    """Measured vs model, per size and algorithm: milliseconds and the ratio measured/model."""
    algorithms = list(dict.fromkeys(r["algorithm"] for r in run["rows"]))
    by_size: dict[int, dict[str, float]] = {}
    for r in run["rows"]:
        by_size.setdefault(r["size"], {})[r["algorithm"]] = r["time"]
    head = _t("{rate:g} Mbit/s: alpha = {alpha:.0f} us, beta = 1/({bw:.1f} MB/s), gamma = 1/({gbw:.1f} GB/s)",
              rate=run["rate_mbit"], alpha=run["alpha"] * 1e6, bw=1e-6 / max(run["beta"], 1e-30),
              gbw=1e-9 / max(run["gamma"], 1e-30))  # fmt: skip
    lines = [head, f"{'size':>9}" + "".join(f" | {name + ' ms':>22} {'model':>7} {'ratio':>5}"
                                            for name in algorithms)]  # fmt: skip
    for size, per in sorted(by_size.items()):
        line = f"{size_label(size):>9}"
        for name in algorithms:
            t, m = per[name], predict(run, name, size)
            line += f" | {t * 1e3:>22.3f} {m * 1e3:>7.3f} {t / m:>5.2f}"
        lines.append(line)
    return "\n".join(lines)


def size_label(n: float) -> str:
    """Bytes as the tables print them: ``64 B``, ``4 KiB``, ``16 MiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"


def plot(runs: Sequence[dict], algorithm: str = "ring", ax: Any = None) -> Any:
    """Time against size for one algorithm: measured points, the model as a line, per rate."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        pts = sorted((r["size"], r["time"]) for r in run["rows"] if r["algorithm"] == algorithm)
        xs = [s for s, _ in pts]
        line = ax.plot(xs, [t * 1e3 for _, t in pts], "o",
                       label=_t("measured, {rate:g} Mbit/s", rate=run["rate_mbit"]))[0]  # fmt: skip
        ax.plot(xs, [predict(run, algorithm, s) * 1e3 for s in xs], "-", color=line.get_color(),
                alpha=0.6, label=_t("model, {rate:g} Mbit/s", rate=run["rate_mbit"]))  # fmt: skip
        ax.axvline(crossover(run, algorithm), color=line.get_color(), linestyle=":", alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(_t("message size (bytes)"))
    ax.set_ylabel(_t("time of one all-reduce (ms)"))
    ax.set_title(_t("{algorithm} on 2 hosts: measured vs alpha-beta model (dotted: crossover)",
                    algorithm=algorithm))  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def stored() -> dict:
    """The stored real run (``record``): date, command, torch, and one run per rate."""
    return json.loads(RECORD.read_text())


def lab(rate_mbit: float = 100, sizes: Sequence[int] = (1 << 10, 16 << 10, 256 << 10),
        iters: int = 3) -> dict:  # fmt: skip
    """A small live run where hosts can be built; the stored run's run at that rate elsewhere."""
    reason = lab_reason(
        hosts.unavailable_reason() or hosts.shaping_unavailable_reason(rate_mbit, None)
    )
    if not reason:
        return measure(rate_mbit, sizes, iters=iters)
    record = load_record(RECORD, reason)
    runs = {run["rate_mbit"]: run for run in record["runs"]}
    return runs.get(rate_mbit) or runs[min(runs, key=lambda r: abs(r - rate_mbit))]


def record(path: Path = RECORD, rates: Sequence[float] = RECORD_RATES, iters: int = 5) -> dict:
    """Run the full sweep for real (needs root) and store it for the chapter."""
    import platform

    import torch

    data: dict = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                  "machine": f"{platform.machine()}, {platform.release()}, "
                             f"{__import__('os').cpu_count()} cores",
                  "command": "python -m ddp_lab.labs.shaped_links record", "runs": []}  # fmt: skip
    for rate in rates:
        run = measure(rate, sizes_for(rate), iters=iters, warmup=2, timeout=900)
        print(table(run), flush=True)
        data["runs"].append(run)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        print(json.dumps(_rank_main(json.loads(argv[1]))), flush=True)
    elif argv[:1] == ["record"]:
        record()
    else:
        for rate in [float(a) for a in argv] or [100.0]:
            print(table(measure(rate)))


if __name__ == "__main__":
    main()
