"""ddp_lab.attempt_store: a restarted attempt never reads the previous attempt's keys.

Oracle: a real TCPStore standing in for torchrun's shared agent store (it lives on across
attempts, as ``next_rendezvous`` keeps it), and real gloo process groups in real processes.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch.distributed as dist
from conftest import private_tmp

from ddp_lab.tools import attempt_store

ROOT = Path(__file__).resolve().parent.parent
WAIT = datetime.timedelta(seconds=60)


def _client(server: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=WAIT)


def _attempt(server: dist.TCPStore, world: int) -> list[str]:
    names: list[str] = [""] * world

    def rank(r: int) -> None:
        names[r] = attempt_store.agree_on_attempt(_client(server), r, world, WAIT)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return names


def test_two_attempts_on_one_store_get_different_names():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first = _attempt(server, 3)
    second = _attempt(server, 3)  # the first attempt's ask/answer keys are all still there
    assert len(set(first)) == 1 and len(set(second)) == 1, (first, second)
    assert first[0] != second[0]
    world_one = _attempt(server, 1)  # an elastic shrink: rank 0 alone agrees at once
    assert world_one[0] not in (first[0], second[0])


def test_rank0_does_not_stop_at_a_stale_token():
    # The previous attempt left rank 1's token; rank 0 of this attempt answers it (nobody
    # reads that answer) and goes on until this attempt's rank 1 has its own answer.
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    server.set(attempt_store.ASK.format(rank=1), "stale-token")
    got: dict[int, str] = {}
    t0 = threading.Thread(
        target=lambda: got.update({0: attempt_store.agree_on_attempt(_client(server), 0, 2, WAIT)})
    )
    t0.start()
    t0.join(1.0)
    assert t0.is_alive()  # the stale token alone does not complete the attempt
    got[1] = attempt_store.agree_on_attempt(_client(server), 1, 2, WAIT)
    t0.join(60)
    assert got[0] == got[1]
    assert server.check([attempt_store.ANSWER.format(token="stale-token")])


WORKER = """
import sys, time
time.sleep(float(sys.argv[1]))
from ddp_lab import train
train.main(sys.argv[2:])
train.exit_without_finalizing(0)
"""


def _train_attempt(server: dist.TCPStore, n: int, delays: list[float], data: str) -> list:
    """One "torchrun attempt" of ``ddp_lab.train``: the environment its agent gives workers."""
    procs = []
    for rank, delay in enumerate(delays):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER"))}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(len(delays)),
                   LOCAL_WORLD_SIZE=str(len(delays)), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(server.port), TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT=str(n), OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT), TMPDIR=private_tmp())  # fmt: skip
        argv = ["--epochs", "1", "--batch-size", "512", "--quiet", "--data-dir", data,
                "--timeout", "60"]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(delay), *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        )
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=240)
        outs.append((p.returncode, out))
    return outs


def test_train_restarted_on_torchruns_shared_store_never_reads_old_addresses(tmp_path):
    # torchrun's agent keeps its store across restarts; here the store is this process's.
    # Attempt 1's rank 1 starts 3 s late, so that rank 0 may look for rank 1's gloo address
    # before rank 1 has written it: attempt 0's address (a dead process) must never answer.
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    data = str(tmp_path / "data")
    first = _train_attempt(server, 0, [0.0, 0.0], data)
    assert [rc for rc, _ in first] == [0, 0], first
    second = _train_attempt(server, 1, [0.0, 3.0], data)
    assert [rc for rc, _ in second] == [0, 0], second
    assert "sha256" in second[0][1]
