"""Chapter 11's restart demo, many times on a loaded machine: how often does it fail?

The command is the chapter's: ``torchrun --standalone --nproc_per_node=2 --max-restarts=1
-m ddp_lab.train --epochs 2 --checkpoint-every 3 --fail-at-step 7``. The last rank kills
itself after step 7, torchrun restarts both workers, and they resume from step 6's
checkpoint. A run passes when torchrun exits 0, the restart really happened (the marker of
the failure exists and the agent logged the restart) and the final parameters' SHA-256 equals
that of an uninterrupted run of the same program (the resume is bit for bit). A run that
takes longer than ``--limit`` seconds is killed and counted as a hang.

Before ``ddp_lab/attempt_store.py``, restarted workers read the previous attempt's gloo
addresses from torchrun's shared store (pytorch#135712): "Connection refused" or a hang.

``--busy N`` runs N busy loops alongside; ``--python`` picks the interpreter (and with it
the installed ``ddp_lab``), so the same script measures another checkout's code.

    .venv/bin/python benchmarks/bench_restart.py [--runs 20] [--busy 4] [--python PY]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = ["--epochs", "2", "--checkpoint-every", "3"]
SHA = re.compile(r"final parameters sha256 ([0-9a-f]{64})")


def torchrun(python: str, folder: Path, fail: bool) -> list[str]:
    """The chapter's command (with ``--fail-at-step 7`` when ``fail``)."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "--max-restarts=1", "-m", "ddp_lab.train", *TRAIN, "--checkpoint-dir",
            str(folder), *(["--fail-at-step", "7"] if fail else [])]  # fmt: skip


def run_once(python: str, folder: Path, fail: bool, limit: float) -> tuple[str, float, str]:
    """One torchrun: (outcome, seconds, output). Outcome "ok:<sha>", "exit N" or "hang"."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        torchrun(python, folder, fail),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=folder.parent,  # not the checkout: ddp_lab comes from the interpreter's install
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "hang", time.perf_counter() - t0, out
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return f"exit {proc.returncode}", seconds, out
    sha = SHA.findall(out)
    return (f"ok:{sha[-1]}" if sha else "no sha"), seconds, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--busy", type=int, default=4, help="busy loops alongside (default 4)")
    p.add_argument("--limit", type=float, default=240.0, help="seconds before a run is a hang")
    p.add_argument("--python", default=sys.executable, help="interpreter (and its ddp_lab)")
    args = p.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    failures: list[tuple[int, str, str]] = []
    seconds: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
            outcome, t, out = run_once(args.python, Path(tmp) / "ref", False, args.limit)
            if not outcome.startswith("ok:"):
                sys.exit(f"the uninterrupted reference run failed ({outcome}):\n{out[-3000:]}")
            reference = outcome[3:]
            print(f"reference run (no failure): {t:.1f}s sha256 {reference[:16]}", flush=True)
            for i in range(args.runs):
                folder = Path(tmp) / f"run{i}"
                outcome, t, out = run_once(args.python, folder, True, args.limit)
                restarted = (folder / "failed-at-step-7").exists() and "resumed from" in out
                if outcome == f"ok:{reference}" and restarted:
                    seconds.append(t)
                    print(f"run {i + 1:2d}: ok {t:.1f}s", flush=True)
                    continue
                why = outcome if outcome.startswith(("exit", "hang", "no")) else "other sha"
                if outcome.startswith("ok:") and not restarted:
                    why = "no restart"
                lines = out.splitlines()
                errors = [ln for ln in lines if re.search(r"connectFullMesh|refused|timed out", ln)]
                errors = errors or [ln for ln in lines if "Error" in ln or "failed" in ln]
                failures.append((i + 1, why, errors[0][:300] if errors else out[-300:]))
                print(f"run {i + 1:2d}: FAILED ({why}) {t:.1f}s: {failures[-1][2]}", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(
        f"\n{args.runs} restarts with {args.busy} busy loops: {len(failures)} failed; "
        f"passing runs median {statistics.median(seconds) if seconds else float('nan'):.1f}s, "
        f"max {max(seconds) if seconds else float('nan'):.1f}s"
    )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
