"""Chapter 04's collectives on this machine, read from a trace, next to the alpha-beta model.

One run: calibrate alpha, beta and gamma on loopback (``shaped_links.calibrate``, a
ping-pong between two gloo ranks, fitted by ``shaped_links.fit``), then trace
``collectives.timed_collectives`` (all_reduce, broadcast, all_gather_single,
reduce_scatter_single) on 2 and 4 ranks, and print, per (collective, size, N), the median
time in the trace (``trace_analysis.collective_times``: from the last rank's start to the
last rank's end on gloo's thread) and the part of it gloo's thread spent in operators
(copies), the median time Python saw (slowest rank), the model of
the algorithm gloo runs (``costs.gloo_cpu``) and trace/model.

    .venv/bin/python benchmarks/bench_collectives_model.py [--reps 5] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

import torch

import ddp_lab as dl
from ddp_lab import collectives
from ddp_lab.labs import shaped_links
from ddp_lab.tools import trace_analysis as ta

CALIBRATION = (4, 64 << 10, 1 << 20, 4 << 20)
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    cal = dl.spawn(shaped_links.calibrate, args=(CALIBRATION, args.reps), nprocs=2,
                   backend="gloo", quiet=True)[0]  # fmt: skip
    alpha, beta = shaped_links.fit(cal["calibration"])
    gamma = cal["gamma"]
    print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"alpha = {alpha * 1e6:.0f} us, 1/beta = {1e-9 / beta:.2f} GB/s, "
          f"1/gamma = {1e-9 / gamma:.1f} GB/s")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (2, 4):
            path = os.path.join(tmp, f"{n}.json")
            seen = dl.spawn(collectives.timed_collectives, args=(SIZES, args.reps), nprocs=n,
                            backend="gloo", trace=path, quiet=True)  # fmt: skip
            rows += ta.versus_model(ta.collective_times(ta.load(path)), n, alpha, beta, gamma,
                                    seen)  # fmt: skip
    if not args.markdown:
        print(ta.format_versus_model(rows))
        return
    print("| collective | size | N | trace ms | of it operators ms | Python ms | model ms "
          "| trace/model |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['op']} | {ta._size(r['bytes'])} | {r['ranks']} | {r['trace_us'] / 1e3:.3f} "
              f"| {r['ops_us'] / 1e3:.3f} | {r['python_us'] / 1e3:.3f} | {r['model_us'] / 1e3:.3f} | {r['ratio']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
