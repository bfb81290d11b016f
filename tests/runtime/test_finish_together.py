"""``_rank.finish_together``: no rank leaves while another still needs the store rank 0 serves."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

from ddp_lab.runtime import _rank


class SlowToHear:
    """A rank's store client whose ``wait`` returns late: a rank slow to be scheduled."""

    def __init__(self, store: TCPStore, delay: float, log: list[tuple[str, float]]) -> None:
        self.store, self.delay, self.log = store, delay, log

    def add(self, key: str, value: int) -> int:
        self.log.append((f"rank 1 add {key}", time.monotonic()))
        return self.store.add(key, value)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.store.wait(keys, timeout)
        time.sleep(self.delay)
        self.log.append(("rank 1 heard", time.monotonic()))


def test_rank_0_serving_the_store_leaves_only_after_every_rank_has_its_answer() -> None:
    """Rank 0 finishes last and sets the key the others wait on. ``set`` has no reply, so a rank 0
    that went at once could take its store server down before rank 1 heard (in a ``%%ddp``
    cell: "recvValueWithTimeout failed ... Connection reset by peer" in rank 1's output)."""
    server = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    client = TCPStore("127.0.0.1", server.port, 2, is_master=False)
    log: list[tuple[str, float]] = []
    one = threading.Thread(target=_rank.finish_together, args=(1, SlowToHear(client, 1.0, log), 2))
    one.start()
    time.sleep(0.5)  # rank 1 waits in the store
    _rank.finish_together(0, server, 2)
    log.append(("rank 0 leaves", time.monotonic()))
    one.join(timeout=30)
    order = [what for what, _ in sorted(log, key=lambda e: e[1])]
    assert order.index("rank 1 heard") < order.index("rank 0 leaves"), order
    assert not one.is_alive()


def test_a_rank_that_never_comes_costs_at_most_the_wait(monkeypatch) -> None:
    monkeypatch.setattr(_rank, "FINISH_WAIT_S", 1.0)
    server = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    t0 = time.monotonic()
    _rank.finish_together(0, server, 2)  # rank 1 died: neither key ever comes
    assert time.monotonic() - t0 < 5
