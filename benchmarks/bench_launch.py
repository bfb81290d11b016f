"""Launch latency: dl.spawn vs a fork-based launch vs torch.multiprocessing.spawn, for a plain
program and a DDP program.

"plain": every rank initialises a gloo process group and does one all_reduce. "ddp": every
rank initialises the group, wraps a small model (Linear 16 -> 4) in DistributedDataParallel
and runs one training step (forward, backward with its gradient all-reduce, SGD step).
"cold" is the first launch in a fresh Python process (dl.spawn: includes starting its
zygote); "warm" is the median of the launches after it. For dl.spawn, the warm launches start
once the zygote has preloaded DDP's modules (``launcher.wait_warm``; "preload s" is how long
that still took after the cold launch: a notebook spends it between ``import ddp_lab`` and its
first launches). Every method and program is measured in the same run, in fresh subprocesses,
so the ratios compare like with like.

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
_KEEP: list = []
PROGRAMS = ("plain", "ddp")


def _free_port() -> int:
    # Not ddp_lab.runtime.launcher.free_port: mp.spawn's children re-import this script, and a
    # module-level import of ddp_lab would add to the mp.spawn times being measured.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work(rank: int, world_size: int, port: int, program: str) -> None:
    """What every rank does: init gloo (env:// from these variables), then the program."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if program == "plain":
        t = torch.ones(1)
        dist.all_reduce(t)
    else:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        # For the torch launchers: the model must not be freed before the process ends, nor
        # rank 0 (the store's host) exit early (dl.spawn's ranks see to both themselves; see
        # ARCHITECTURE.md, "The preload"), or a launch may hang or fail now and then.
        _KEEP.append(model)
        dist.barrier()
    dist.destroy_process_group()


def one_launch(method: str, nprocs: int, program: str) -> float:
    import torch.multiprocessing as mp

    import ddp_lab as dl

    args = (nprocs, _free_port(), program)
    start = time.perf_counter()
    if method == "dl.spawn":
        dl.spawn(work, args=args, nprocs=nprocs)
    elif method == "fork":
        mp.start_processes(work, args=args, nprocs=nprocs, start_method="fork")
    else:
        mp.spawn(work, args=args, nprocs=nprocs)
    return time.perf_counter() - start


def child(method: str, nprocs: int, program: str, warm: int) -> None:
    import torch  # noqa: F401  # the parent (a notebook kernel) has torch imported already

    cold = one_launch(method, nprocs, program)
    preload = 0.0
    if method == "dl.spawn":
        from ddp_lab.runtime import launcher

        start = time.perf_counter()
        if not launcher.wait_warm():
            raise SystemExit("the zygote did not finish its preload")
        preload = time.perf_counter() - start
    warms = [one_launch(method, nprocs, program) for _ in range(warm)]
    print(json.dumps({"cold": cold, "warm": statistics.median(warms), "preload": preload}))


def _run_child(method: str, n: int, program: str, warm: int, failures: list[str]) -> str:
    """One fresh process's measurements; a failed process is reported and run again (3 tries)."""
    cmd = [sys.executable, __file__, "--child", method, str(n), program, "--warm", str(warm)]
    for _ in range(3):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:  # a hung launch
            failures.append(f"{method} {n} {program}: no answer in 900 s")
            continue
        if proc.returncode == 0:
            return proc.stdout
        failures.append(f"{method} {n} {program}: {proc.stderr.strip().splitlines()[-1:]}")
        print(f"failed, run again: {failures[-1]}", file=sys.stderr)
    raise SystemExit(f"{method} {n} {program} failed 3 times: {failures[-3:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--warm", type=int, default=5, help="warm launches per process")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2], args.warm)
        return
    rows: dict[tuple[str, str, int], list[dict]] = {}
    failures: list[str] = []
    for _ in range(args.repeats):  # interleaved rounds: load changes hit every variant alike
        for n in args.nprocs:
            for program in PROGRAMS:
                for method in args.methods:
                    out = _run_child(method, n, program, args.warm, failures)
                    result = json.loads(out.strip().splitlines()[-1])
                    rows.setdefault((method, program, n), []).append(result)
    med = {
        key: tuple(statistics.median(r[k] for r in runs) for k in ("cold", "warm", "preload"))
        for key, runs in rows.items()
    }
    print(
        f"launch latency, median seconds ({args.repeats} fresh processes per variant, "
        f"{args.warm} warm launches each; {os.cpu_count()} CPU cores)"
    )
    header = (
        f"{'method':<9} {'ranks':>5} {'program':<7} {'cold s':>7} {'warm s':>7} "
        f"{'preload s':>9} {'warm/plain':>10} {'cold/fork':>9} {'warm/fork':>9}"
    )
    print(header)
    for n in args.nprocs:
        for program in PROGRAMS:
            for method in args.methods:
                c, w, p = med[method, program, n]
                plain_w = med[method, "plain", n][1]
                fc, fw, _ = med.get(("fork", program, n), (float("nan"),) * 3)
                pre = f"{p:>9.3f}" if method == "dl.spawn" else f"{'-':>9}"
                print(
                    f"{method:<9} {n:>5} {program:<7} {c:>7.3f} {w:>7.3f} {pre} "
                    f"{w / plain_w:>10.2f} {c / fc:>9.2f} {w / fw:>9.2f}"
                )
    if failures:
        print(f"failed processes, run again: {len(failures)}")
        for line in failures:
            print(f"  {line}")


if __name__ == "__main__":
    main()
