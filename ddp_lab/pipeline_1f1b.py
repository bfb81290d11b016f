"""The 1F1B schedule's order (the reference of exercise 12.one_f_one_b; hidden when graded).

Stage ``s`` of ``p`` first runs ``p - s - 1`` forwards (the warm-up: enough to fill the
stages after it), then alternates one forward and one backward, then runs the remaining
backwards (the cool-down). At most ``p - s`` micro-batches' activations are held at once,
against GPipe's ``m``; the bubble stays ``(p-1)/(m+p-1)``.

How this differs from PyTorch's: torch's ``Schedule1F1B``
(``torch/distributed/pipelining/schedules.py``, ``_step_microbatches``) counts the warm-up as
``min(m, p - s)`` forwards and then starts its steady state with a backward: the same order
of passes as here. torch's ``_step_microbatches`` also posts the sends and receives itself,
a forward's send together with the next backward's receive in one ``_batch_p2p`` call (and a
backward's send with the next forward's receive); here an order lists the computing passes
only (``ddp_lab.pipeline.run_stage`` adds the communication).
"""

from __future__ import annotations


def one_f_one_b_order(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s 1F1B order of ("F", i) and ("B", i) passes over ``micro`` batches."""
    warmup = min(stages - stage - 1, micro)
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < micro:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, micro)]
    return order
