"""What a checkpoint costs: one step vs one checkpoint, and a whole run with checkpoints.

Part 1 (``ddp_lab.labs.recovery.checkpoint_cost``, 2 gloo ranks, interleaved rounds): median
time of one training step of chapter 08's model, of one ``torch.save`` checkpoint
(``resume.save_step``) and of one ``dcp.save``, and their bytes. From them, the smallest K
whose checkpoints cost at most 10 % (chapter 11 recommends it). Part 2: chapter 08's
program (``ddp_lab.tools.train``) run without checkpoints and with ``--checkpoint-every K``,
alternately, ``--rounds`` times each; prints the median wall times and their ratio.
Goal: ratio <= 1.10.

    .venv/bin/python benchmarks/bench_checkpoint.py [--rounds 3] [--epochs 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ddp_lab as dl
from ddp_lab.labs import recovery
from ddp_lab.tools import train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    cost = dl.spawn(
        recovery.checkpoint_cost, args=(str(work / "cost"),), nprocs=2, backend="gloo", quiet=True
    )[0]
    print(f"one step        {1000 * cost['step']:8.2f} ms")
    for kind in ("torch.save", "dcp.save"):
        print(f"one {kind:11s} {1000 * cost[kind]:8.2f} ms  {cost[kind + ' bytes'] / 1e3:7.1f} kB")
    k = recovery.smallest_every(cost)
    print(f"smallest K with torch.save overhead <= 10 %: {k}")
    common = ["--epochs", str(args.epochs), "--quiet", "--threads", "1"]
    common += ["--data-dir", str(work / "data")]
    times: dict[str, list[float]] = {"none": [], f"every {k}": []}
    for r in range(args.rounds):
        for name, extra in (("none", []), (f"every {k}", ["--checkpoint-every", str(k)])):
            ckpt = ["--checkpoint-dir", str(work / f"ckpt-{r}-{len(extra)}")] if extra else []
            t0 = time.perf_counter()
            train.launch([*common, *ckpt, *extra], nprocs=2, quiet=True, timeout=600)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["none"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"run, checkpoints {name:9s} median {med:6.2f} s  ratio {med / base:.3f}")


if __name__ == "__main__":
    main()
