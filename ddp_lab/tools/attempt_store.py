"""A process group whose store keys belong to this attempt only (torchrun restarts).

Why: since torch 2.4 torchrun's c10d rendezvous shares one TCPStore between its agent and the
workers (``TORCHELASTIC_USE_AGENT_STORE=True``), and that store outlives a restart:
``DynamicRendezvousHandler.next_rendezvous`` (``dynamic_rendezvous.py``) creates the shared
server once and hands every later round the same address. The workers' side,
``_create_c10d_store`` in ``torch/distributed/rendezvous.py`` (called by
``_env_rendezvous_handler``), connects to it with no per-attempt prefix (its comment says a
new store is made for every retry; with the shared server it is not), and
``init_process_group`` only adds ``PrefixStore("default_pg")`` and the group's name, which are
the same in every attempt. gloo's ``connectFullMesh`` then has each rank ``set`` its
listening address under its rank's key and read the others' keys: a restarted rank that
reads a peer's key before that peer has rewritten it gets the address of the previous
attempt's (dead) process, and fails with "Connection refused", or waits. pytorch#135712
describes it; ``TORCHELASTIC_RESTART_COUNT`` cannot serve as the prefix, since each agent
counts its own restarts (a membership change restarts the others' workers without counting).

What this module does: the ranks of one attempt agree on a fresh random name through the
shared store, in a way no key of an earlier attempt can answer, and the process group uses
``PrefixStore(name, store)``. Each rank r > 0 writes a new random token under
``ddp_lab/ask/r`` and waits for the key ``ddp_lab/answer/<token>``, which only this attempt
can have written; rank 0 answers every token it sees with the attempt's name (a stale token
gets an answer nobody waits for) until every rank has acknowledged it. The store is still the
agent's, which outlives the workers, as torch intends.
"""

from __future__ import annotations

import datetime
import os
import secrets
import time

import torch.distributed as dist

ASK = "ddp_lab/ask/{rank}"
ANSWER = "ddp_lab/answer/{token}"
ACK = "ddp_lab/ack/{name}"
POLL_S = 0.02


def agree_on_attempt(store: dist.Store, rank: int, world: int, timeout: datetime.timedelta) -> str:
    """A name that every rank of this attempt gets and no earlier attempt ever used."""
    deadline = time.monotonic() + timeout.total_seconds()
    if rank > 0:
        token = secrets.token_hex(16)
        store.set(ASK.format(rank=rank), token)
        store.wait([ANSWER.format(token=token)], timeout)
        name = store.get(ANSWER.format(token=token)).decode()
        store.add(ACK.format(name=name), 1)
        return name
    name = "attempt-" + secrets.token_hex(16)
    asks = [ASK.format(rank=r) for r in range(1, world)]
    answered: set[bytes] = set()
    while store.add(ACK.format(name=name), 0) < world - 1:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank 0: not every rank of this attempt answered within {timeout} "
                f"({store.add(ACK.format(name=name), 0)} of {world - 1})"
            )
        ready = [k for k in asks if store.check([k])]
        for token in store.multi_get(ready) if ready else []:
            if token not in answered:  # a stale token's answer is never read: harmless
                store.set(ANSWER.format(token=token.decode()), name)
                answered.add(token)
        time.sleep(POLL_S)
    return name


def uses_agent_store() -> bool:
    """Did torchrun hand the workers its own store, which lives on across restarts?"""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def init_process_group(backend: str, timeout: datetime.timedelta | None = None) -> None:
    """``dist.init_process_group`` from the launcher's environment, isolated per attempt.

    Under torchrun's shared store the group's keys go under a name agreed for this attempt;
    otherwise (``dl.spawn``, srun, torchrun with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``)
    every launch already has a fresh store, and this is ``init_process_group(backend)``.
    """
    kwargs = {"timeout": timeout} if timeout else {}
    if not uses_agent_store():
        dist.init_process_group(backend, **kwargs)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wait = timeout or datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=world,
        is_master=False,
        timeout=wait,
    )
    name = agree_on_attempt(store, rank, world, wait)
    dist.init_process_group(
        backend, store=dist.PrefixStore(name, store), rank=rank, world_size=world, **kwargs
    )
