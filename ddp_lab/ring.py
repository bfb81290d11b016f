"""The ring all-reduce written by hand: chunked, traced, segmented, and its visualiser.

``ring_all_reduce(tensor)`` sums ``tensor`` over the default process group in place, like
``dist.all_reduce(tensor)``, with point-to-point messages only: a reduce-scatter phase of
N-1 steps followed by an all-gather phase of N-1 steps. Each rank sends 2(N-1)/N of the
tensor in total, whatever N is.

How this teaching version differs from the rings inside NCCL and Gloo: it runs in Python,
supports only SUM, and keeps an optional trace of every message for the visualiser.

Two schedules, chosen by ``dist.get_backend(group)``:

- ``"gloo"``: each send and each receive is its own one-op ``batch_isend_irecv`` and the
  receive of the next step is posted a step ahead (Gloo's send waits for its receiver, so
  an early receive saves a round trip per message).
- any other backend (NCCL): the send and the receive of a step (and segment) go out in ONE
  ``batch_isend_irecv``. ProcessGroupNCCL runs every batched p2p op of a device on one
  stream (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``pointToPoint``: a batch uses
  the device's communicator, not a per-pair one), so a receive issued alone blocks the
  stream, and with it this rank's own later send: around a ring every rank waits in its
  receive and the ring deadlocks. Inside one batch NCCL runs both ops together
  (ncclGroupStart/ncclGroupEnd).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.i18n import _t


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """The (start, stop) of each of the N chunks, as ``torch.tensor_split`` cuts them.

    The first ``numel % N`` chunks are one element longer; when ``numel < N`` the last
    chunks are empty, and the ring simply sends nothing for them.
    """
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def schedule(rank: int, world_size: int, step: int) -> tuple[int, int]:
    """(chunk sent, chunk received) by ``rank`` at ``step`` (0 .. 2(N-1)-1).

    Reduce-scatter (step < N-1): send chunk rank-step, receive chunk rank-step-1 and add it.
    All-gather: send chunk rank+1-s, receive chunk rank-s (s = step-(N-1)) and copy it.
    After the reduce-scatter, rank r owns the finished chunk r+1.
    """
    n = world_size
    s = step if step < n - 1 else step - (n - 1)
    offset = 0 if step < n - 1 else 1
    return (rank - s + offset) % n, (rank - s - 1 + offset) % n


_SCRATCH: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reusable receive buffer: a fresh 32 MB allocation per call costs page faults that
    showed up as ~10% of the ring's time on CPU (the same reason NCCL keeps its buffers)."""
    key = (dtype, device)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        buf = _SCRATCH[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def ring_all_reduce(
    tensor: torch.Tensor,
    group: Any = None,
    *,
    segment_bytes: int | None = None,
    trace: list | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with a chunked ring; return ``tensor``.

    Args:
        segment_bytes: split each chunk into segments of at most this many bytes and
            pipeline them (segmented ring); None sends each chunk as one message.
        trace: a list that receives one dict per step: the chunks sent and received, the
            elements moved, and a snapshot of the first element of every chunk.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            _t("ring_all_reduce needs a torch.Tensor, got {kind}.", kind=type(tensor).__name__)
        )
    if tensor.layout != torch.strided:
        raise ValueError(_t("ring_all_reduce works on dense tensors only."))
    if segment_bytes is not None and (
        isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes < 1
    ):
        raise ValueError(
            _t("segment_bytes must be a positive int or None, got {value!r}.", value=segment_bytes)
        )
    if not dist.is_initialized():
        raise RuntimeError(_t("Initialise the process group first (dist.init_process_group)."))
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    # Work on a flat contiguous view; a non-contiguous input gets a copy written back.
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    bounds = chunk_bounds(flat.numel(), n)
    seg = flat.numel() if segment_bytes is None else max(1, segment_bytes // flat.element_size())
    left, right = (rank - 1) % n, (rank + 1) % n
    if group is not None:
        left, right = dist.get_global_rank(group, left), dist.get_global_rank(group, right)
    size = bounds[0][1] - bounds[0][0]  # the first chunk is the largest
    # Two receive buffers, by step parity, so that the next step's receive can be posted
    # while this step's is still arriving.
    scratch = _scratch(2 * size, flat.dtype, flat.device)
    bufs = (scratch[:size], scratch[size:])
    steps, nseg = 2 * (n - 1), math.ceil(size / seg)
    # NCCL (any backend but gloo): a step's send and receive must share one batch.
    paired = dist.get_backend(group) != "gloo"
    # Posting a receive before the sender asks saves a round trip per message (Gloo's send
    # waits for the receiver). Not for N = 2, where the next step receives into the chunk
    # this step is still sending, nor when tracing (the snapshot would race with it).
    early = n > 2 and trace is None and not paired

    def part(chunk: int, k: int) -> torch.Tensor:
        a, b = bounds[chunk]
        return flat[min(a + k * seg, b) : min(a + (k + 1) * seg, b)]

    def p2p(op: Any, tensor: torch.Tensor, peer: int, step: int) -> Any:
        # Gloo schedule only: one op per batch, so a receive can be posted a step ahead.
        # Non-blocking: no rank ever blocks in a send waiting for its receiver (a
        # send-then-recv ring deadlocks on Gloo). On NCCL one-op batches deadlock: see above.
        return dist.batch_isend_irecv([dist.P2POp(op, tensor, peer, group, tag=step)])[0]

    def post_recv(step: int, k: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        target = part(schedule(rank, n, step)[1], k)
        recv = bufs[step % 2][k * seg : k * seg + target.numel()] if step < n - 1 else target
        return (p2p(dist.irecv, recv, left, step) if recv.numel() else None), recv, target

    def post_send(step: int, k: int) -> Any:
        send = part(schedule(rank, n, step)[0], k)
        return p2p(dist.isend, send, right, step) if send.numel() else None

    def post_pair(step: int, k: int) -> tuple[Any, Any]:
        # One batch with this step's send and receive of segment k (the NCCL schedule).
        send = part(schedule(rank, n, step)[0], k)
        target = part(schedule(rank, n, step)[1], k)
        recv = bufs[step % 2][k * seg : k * seg + target.numel()] if step < n - 1 else target
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, right, group, tag=step))
        if recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, left, group, tag=step))
        works = dist.batch_isend_irecv(ops) if ops else []
        recv_work = works[-1] if recv.numel() else None
        send_work = works[0] if send.numel() else None
        return (recv_work, recv, target), send_work

    if paired:
        pairs = [post_pair(0, k) for k in range(nseg)]
        recvs, sends = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        recvs = [post_recv(0, k) for k in range(nseg)]
        sends = [post_send(0, k) for k in range(nseg)]
    for step in range(steps):
        snapshot = None
        last = step + 1 == steps
        for k in range(nseg):
            ahead = post_recv(step + 1, k) if early and not last else None
            work, recv, target = recvs[k]
            if work is not None:
                work.wait()
                if step < n - 1:
                    target.add_(recv)
            # Segment k of the next step may overwrite what this send reads (N = 2).
            if sends[k] is not None:
                sends[k].wait()
            if k == 0 and trace is not None:
                # Segment 0 holds every chunk's first element, and nothing of the next step
                # has been posted for it yet: a consistent picture of the state after `step`.
                snapshot = [flat[a].item() if b > a else None for a, b in bounds]
            if not last:
                # Pipelining: segment k moves on as soon as it is reduced, while the later
                # segments of this step are still on the wire.
                if paired:
                    recvs[k], sends[k] = post_pair(step + 1, k)
                else:
                    recvs[k] = ahead if ahead is not None else post_recv(step + 1, k)
                    sends[k] = post_send(step + 1, k)
        if trace is not None:
            send_i, recv_i = schedule(rank, n, step)
            trace.append(
                {
                    "step": step,
                    "phase": "reduce-scatter" if step < n - 1 else "all-gather",
                    "send_chunk": send_i,
                    "recv_chunk": recv_i,
                    "to": right,
                    "from": left,
                    "sent_numel": bounds[send_i][1] - bounds[send_i][0],
                    "recv_numel": bounds[recv_i][1] - bounds[recv_i][0],
                    "snapshot": snapshot,
                }
            )
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def simulate(world_size: int) -> list[list[list[frozenset[int]]]]:
    """What each rank's chunks contain after each step, without running anything.

    ``states[step][rank][chunk]`` is the set of ranks whose data is summed in that chunk;
    ``states[0]`` is the start (every rank holds only its own data) and ``states[k]`` the
    state after k steps, for k = 1 .. 2(N-1).
    """
    n = world_size
    state = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    states = [[row[:] for row in state]]
    for step in range(2 * (n - 1)):
        sent = {r: state[r][schedule(r, n, step)[0]] for r in range(n)}
        new = [row[:] for row in state]
        for r in range(n):
            recv_i = schedule(r, n, step)[1]
            incoming = sent[(r - 1) % n]
            new[r][recv_i] = state[r][recv_i] | incoming if step < n - 1 else incoming
        state = new
        states.append([row[:] for row in state])
    return states


def states_from_trace(traces: list[list[dict]]) -> list[list[list[frozenset[int]]]]:
    """Decode the states of a traced run whose rank r started with the value 2**r.

    A sum of distinct powers of two tells which ranks contributed: bit r set means rank r's
    data is in. ``traces[r]`` is the trace list of rank r.
    """
    n = len(traces)

    def bits(v: float | None) -> frozenset[int]:
        return frozenset() if v is None else frozenset(i for i in range(n) if int(v) >> i & 1)

    start = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    steps = [
        [[bits(v) for v in traces[r][k]["snapshot"]] for r in range(n)]
        for k in range(len(traces[0]))
    ]
    return [start, *steps]


def traced_run(rank: int, world_size: int, numel: int | None = None) -> list[dict]:
    """One rank of a traced ring on the values 2**rank (call it under ``dl.spawn``)."""
    tensor = torch.full((numel or world_size,), float(2**rank), dtype=torch.float64)
    trace: list[dict] = []
    ring_all_reduce(tensor, trace=trace)
    return trace


def draw_state(states: list, step: int, ax: Any = None) -> Any:
    """Draw which ranks' data each chunk holds after ``step`` steps (0 = the start).

    Rows are ranks, columns chunks; a cell lists the ranks summed into it and is darker the
    more it holds (gold: complete). Outlined cells are the ones sent at the next step.
    """
    import matplotlib.pyplot as plt

    state = states[step]
    n = len(state)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * n + 2, 0.6 * n + 1.2))
    cmap = plt.get_cmap("Blues")
    for r in range(n):
        for c in range(n):
            held = state[r][c]
            color = "#f2c14e" if len(held) == n else cmap(0.15 + 0.6 * len(held) / n)
            sending = step < 2 * (n - 1) and schedule(r, n, step)[0] == c
            ax.add_patch(
                plt.Rectangle(
                    (c, n - 1 - r),
                    0.94,
                    0.84,
                    facecolor=color,
                    edgecolor="crimson" if sending else "white",
                    linewidth=2.5 if sending else 1,
                )
            )
            label = "+".join(map(str, sorted(held))) if held else "-"
            ax.text(c + 0.47, n - 1 - r + 0.42, label, ha="center", va="center", fontsize=8)
        ax.text(-0.15, n - 1 - r + 0.42, f"rank {r}", ha="right", va="center", fontsize=9)
    for c in range(n):
        ax.text(c + 0.47, n + 0.05, _t("chunk {c}", c=c), ha="center", fontsize=9)
    phase = (
        _t("start") if step == 0 else _t("reduce-scatter") if step <= n - 1 else _t("all-gather")
    )
    ax.set_title(
        _t(
            "after step {step} of {steps} ({phase}); red: sent next",
            step=step,
            steps=2 * (n - 1),
            phase=phase,
        )
    )
    ax.set_xlim(-1.4, n)
    ax.set_ylim(-0.1, n + 0.4)
    ax.axis("off")
    return ax


def ring_widget(world_size: int = 4, traces: list | None = None) -> Any:
    """A slider over the 2(N-1) steps of the ring, for N chosen by the learner.

    With ``traces`` (the per-rank traces of a real run, see ``traced_run``) it draws what
    the ranks really exchanged instead of the simulation, and N is fixed.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    n_slider = widgets.IntSlider(
        value=len(traces) if traces else world_size,
        min=2,
        max=8,
        description="N",
        disabled=traces is not None,
    )
    step = widgets.IntSlider(value=0, min=0, max=2 * (n_slider.value - 1), description=_t("step"))
    out = widgets.Output()

    def redraw(_: Any = None) -> None:
        step.max = 2 * (n_slider.value - 1)
        states = states_from_trace(traces) if traces else simulate(n_slider.value)
        with out:
            out.clear_output(wait=True)
            draw_state(states, step.value)
            plt.show()

    n_slider.observe(redraw, names="value")
    step.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([widgets.HBox([n_slider, step]), out])
    display(box)
    return box
