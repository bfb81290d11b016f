"""``_rank.finish_together``: no rank leaves while another still needs the store rank 0 serves."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

from ddp_lab.runtime import _rank


class SlowToHear:
    """A rank's store client whose ``wait`` returns late: a rank slow to be scheduled."""

    def __init__(self, store: TCPStore, delay: float, log: list[tuple[str, float]]) -> None:
        self.store, self.delay, self.log = store, delay, log
        self.added = threading.Event()  # rank 1 has counted itself: it will wait, not rank 0

    def add(self, key: str, value: int) -> int:
        self.log.append((f"rank 1 add {key}", time.monotonic()))
        count = self.store.add(key, value)
        self.added.set()
        return count

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
    slow = SlowToHear(client, 1.0, log)
    one = threading.Thread(target=_rank.finish_together, args=(1, slow, 2))
    one.start()
    # Rank 1 finishes first and waits in the store. Not a fixed sleep: a thread scheduled late
    # on a busy machine would count itself last, never wait, and "rank 1 heard" never come.
    assert slow.added.wait(30)
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


class LateReplies:
    """A TCP proxy between one client and the store's server that holds the server's bytes back.

    It stands for a server that has not yet written a reply when rank 0 (its process) exits:
    ``drop`` closes the client's connection and throws away what it still holds, as the
    kernel does with the sockets of a process that ends.
    """

    def __init__(self, server_port: int, delay: float) -> None:
        self.delay, self.dropped = delay, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream = socket.create_connection(("127.0.0.1", server_port))
        self.down: socket.socket | None = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.down, _ = self.listener.accept()
        threading.Thread(
            target=self._pump, args=(self.down, self.upstream, 0.0), daemon=True
        ).start()
        self._pump(self.upstream, self.down, self.delay)

    def _pump(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(65536):
                time.sleep(delay)
                if self.dropped.is_set():
                    return
                dst.sendall(data)
        except OSError:  # dropped
            return

    def drop(self) -> None:
        self.dropped.set()
        for s in (self.down, self.upstream):
            if s is not None:
                with contextlib.suppress(OSError):  # the other side may have closed it
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        self.listener.close()


class Recording:
    """A store that notes every error it raises (``finish_together`` swallows them)."""

    def __init__(self, store: TCPStore, errors: list[str]) -> None:
        self.store, self.errors = store, errors

    def __getattr__(self, name: str):
        def call(*args):
            try:
                return getattr(self.store, name)(*args)
            except Exception as exc:
                self.errors.append(f"{name}{args[:1]}: {exc}")
                raise

        return call


def test_no_rank_still_awaits_a_reply_when_rank_0_may_leave() -> None:
    """The server wakes rank 0 before it answers the rank whose call woke it (TCPStoreLibUvBackend
    .cpp, ``add``). If that call had a reply, a rank 0 that then exits takes the reply with it:
    "recvValue failed ... Failed to recv, got 0 bytes" in the other rank's output. Here the
    other rank's replies come late, and rank 0's exit (``drop``) follows its return at once."""
    server = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    proxy = LateReplies(server.port, delay=0.3)
    client = TCPStore("127.0.0.1", proxy.port, 2, is_master=False, timeout=timedelta(seconds=20))
    errors: list[str] = []
    one = threading.Thread(target=_rank.finish_together, args=(1, Recording(client, errors), 2))
    one.start()
    t0 = time.monotonic()
    _rank.finish_together(0, server, 2)
    proxy.drop()  # rank 0's process ends: its server, and what it had not yet sent, with it
    waited = time.monotonic() - t0
    one.join(timeout=30)
    assert not one.is_alive()
    assert errors == []
    assert waited < _rank.FINISH_WAIT_S  # rank 0 left because rank 1 said so, not on a timeout
