"""The demo workers of chapter 09: small functions a launcher starts, each printing what it got.

Started as ``python -m ddp_lab.labs.launch_demo WORKER`` (``launch_demo`` re-exports them and
hands its command line to ``main``); each prints one ``@rank {json}`` line with the
environment and arguments its launcher gave it, which ``launch_demo.LaunchResult.records``
reads back.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ddp_lab.i18n import _t

ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
)


def _record(**extra: object) -> None:
    """Print what this process received from its launcher, as one machine-readable line."""
    rec: dict[str, object] = {k: os.environ.get(k) for k in ENV_KEYS}
    # "nice" is the scheduling priority: the same on every rank (a rank is an id, not a priority).
    rec.update(pid=os.getpid(), nice=os.getpriority(os.PRIO_PROCESS, 0), argv=sys.argv[1:], **extra)
    # One write per line: workers share the launcher's stdout, and print() writes the
    # text and the newline separately, so lines of two ranks could interleave.
    os.write(1, ("@rank " + json.dumps(rec) + "\n").encode())


def worker_env() -> None:
    """Report the environment and arguments the launcher gave this process."""
    _record()


def worker_allreduce() -> None:
    """Report, then join the process group and all-reduce the rank: proves the group formed."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://: reads the variables torchrun set
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    _record(all_reduce_sum=total.item())
    dist.destroy_process_group()


def worker_init() -> None:
    """Report, then try ``init_process_group`` with the default env:// method."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=20))
        outcome = f"ok: rank {dist.get_rank()} of {dist.get_world_size()}"
        dist.barrier()  # nobody exits while a peer still connects (ddp_lab/cluster/slurm.py where)
        dist.destroy_process_group()
    except ValueError as exc:
        outcome = f"ValueError: {exc}"
    _record(init=outcome)


def worker_crash() -> None:
    """Report, then crash on the rank named by DEMO_CRASH_RANK (default 1)."""
    _record()
    if os.environ.get("RANK") == os.environ.get("DEMO_CRASH_RANK", "1"):
        raise RuntimeError("simulated crash: out of memory on this rank")


def worker_flaky() -> None:
    """Crash on rank 1 in the first attempt only: a restart (--max-restarts) recovers."""
    _record()
    if os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        raise RuntimeError("simulated crash in attempt 0")


def worker_sleep() -> None:
    """Report, then sleep: stands in for a long training run that gets signalled."""
    _record(state="training")
    time.sleep(120)


def worker_legacy_args() -> None:
    """Parse the command line the way the source notes do, then the way that works."""
    import argparse

    notes = argparse.ArgumentParser()
    notes.add_argument("--local_rank", type=str, default=-1)  # the notes' parser
    try:
        args = notes.parse_args()
        notes_result = repr(args.local_rank)
    except SystemExit:  # argparse has printed its error to stderr
        notes_result = "argparse error (see stderr)"
    fixed = argparse.ArgumentParser()
    # Both spellings, as an int; torchrun passes neither, so fall back to LOCAL_RANK.
    fixed.add_argument(
        "--local-rank",
        "--local_rank",
        dest="local_rank",
        type=int,
        default=int(os.environ.get("LOCAL_RANK", 0)),
    )
    _record(notes_parser=notes_result, fixed_parser=fixed.parse_args().local_rank)


def worker_node_habits() -> None:
    """Two habits of the source notes that break on several nodes, acted out on CPU.

    ``torch.cuda.set_device(RANK)`` asks for GPU ``RANK`` on a node that has only
    ``LOCAL_WORLD_SIZE`` of them (this demo's stand-in for the node's GPU count), and
    ``if local_rank == 0: save()`` saves once per *node*: every saver appends a line to the
    same file in ``DEMO_SAVE_DIR`` (one folder that both "nodes" see, like a shared disk).
    """
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    gpus_on_node = int(os.environ["LOCAL_WORLD_SIZE"])
    saved = False
    if local == 0:  # the notes' guard: true on the first process of *every* node
        with open(os.path.join(os.environ["DEMO_SAVE_DIR"], "checkpoint.txt"), "a") as f:
            f.write(f"written by RANK {rank}\n")
        saved = True
    _record(
        set_device_RANK="ok" if rank < gpus_on_node else "invalid device ordinal",
        set_device_LOCAL_RANK="ok" if local < gpus_on_node else "invalid device ordinal",
        saved=saved,
        TORCHELASTIC_USE_AGENT_STORE=os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
    )


WORKERS = {
    "env": worker_env,
    "node_habits": worker_node_habits,
    "allreduce": worker_allreduce,
    "init": worker_init,
    "crash": worker_crash,
    "flaky": worker_flaky,
    "sleep": worker_sleep,
    "legacy_args": worker_legacy_args,
}


def _spawn_entry(index: int, name: str) -> None:
    """What mp.spawn calls: it passes only the index, and sets no environment variables."""
    os.environ["DEMO_SPAWN_INDEX"] = str(index)
    WORKERS[name]()


def main(argv: list[str] | None = None) -> None:
    """Command line: ``WORKER`` runs a worker; ``--mp-spawn N WORKER`` runs it under mp.spawn."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--mp-spawn"]:
        import torch.multiprocessing as mp

        mp.spawn(_spawn_entry, args=(argv[2],), nprocs=int(argv[1]))
        return
    # torch.distributed.launch puts its --local-rank=N before our arguments.
    name = check_worker(next((a for a in argv if not a.startswith("-")), ""))
    sys.argv[1:] = [a for a in argv if a != name]  # the worker sees only the launcher's
    WORKERS[name]()


def check_worker(name: str) -> str:
    """Raise a clear ValueError for an unknown worker name."""
    if name not in WORKERS:
        raise ValueError(
            _t(
                "Unknown demo worker {name!r}: choose one of {choices}.",
                name=name,
                choices=", ".join(WORKERS),
            )
        )
    return name
