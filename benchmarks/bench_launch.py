"""Launch latency: dl.spawn vs a fork-based launch vs torch.multiprocessing.spawn.

Each launch starts N ranks that initialise a gloo process group and do one all_reduce.
"cold" is the first launch in a fresh Python process (dl.spawn: includes starting its
zygote); "warm" is the median of the launches after it. Every method is measured in the
same run, in fresh subprocesses, so the ratios compare like with like.

    .venv/bin/python benchmarks/bench_launch.py [--repeats 3] [--warm 5] [--nprocs 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

METHODS = ("dl.spawn", "fork", "mp.spawn")


def _free_port() -> int:
    # Not ddp_lab.runtime.launcher.free_port: mp.spawn's children re-import this script, and a
    # module-level import of ddp_lab would add to the mp.spawn times being measured.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work(rank: int, world_size: int, port: int) -> None:
    """What every rank does: init gloo (env:// from these variables) and one all_reduce."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


def one_launch(method: str, nprocs: int) -> float:
    import torch.multiprocessing as mp

    import ddp_lab as dl

    args = (nprocs, _free_port())
    start = time.perf_counter()
    if method == "dl.spawn":
        dl.spawn(work, args=args, nprocs=nprocs)
    elif method == "fork":
        mp.start_processes(work, args=args, nprocs=nprocs, start_method="fork")
    else:
        mp.spawn(work, args=args, nprocs=nprocs)
    return time.perf_counter() - start


def child(method: str, nprocs: int, warm: int) -> None:
    import torch  # noqa: F401  # the parent (a notebook kernel) has torch imported already

    cold = one_launch(method, nprocs)
    warms = [one_launch(method, nprocs) for _ in range(warm)]
    print(json.dumps({"cold": cold, "warm": statistics.median(warms)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per method")
    parser.add_argument("--warm", type=int, default=5, help="warm launches per process")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.warm)
        return
    rows = {}
    for n in args.nprocs:
        for method in METHODS:
            colds, warms = [], []
            for _ in range(args.repeats):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", method, str(n), "--warm", str(args.warm)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                result = json.loads(out.strip().splitlines()[-1])
                colds.append(result["cold"])
                warms.append(result["warm"])
            rows[method, n] = (statistics.median(colds), statistics.median(warms))
    print(
        f"launch latency, median seconds ({args.repeats} fresh processes, {args.warm} warm "
        f"launches each; {os.cpu_count()} CPU cores)"
    )
    print(
        f"{'method':<10} {'ranks':>5} {'cold s':>8} {'warm s':>8} {'cold/fork':>10} {'warm/fork':>10}"
    )
    for n in args.nprocs:
        fork_cold, fork_warm = rows["fork", n]
        for method in METHODS:
            c, w = rows[method, n]
            print(
                f"{method:<10} {n:>5} {c:>8.3f} {w:>8.3f} {c / fork_cold:>10.2f} {w / fork_warm:>10.2f}"
            )


if __name__ == "__main__":
    main()
