"""A learner's code cannot answer for its rank: the rank's replies carry a token the grader
gave it before any learner code ran.

The reply channel of a graded rank (``rankserve``: a pipe to the grader, a dup of the rank's
stdout) is an open descriptor of the process the learner's code runs in, and a number small
enough to find by trying (``os.fstat``). Before the token, learner code wrote a reply of its
own there, after moving the rank's own replies to /dev/null (``os.dup2``): the grader took the
forged replies for the probe's, case after case. Here
00.average all-reduces the caller's tensor in place (wrong: the checker wants it left as it
was) and forges the "as it was" in a reply of its own: full points on the old protocol.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys

import cloudpickle
import torch
import torch.distributed as dist
from test_grading_attacks_probes import remote_verdict

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _pipes() -> list[int]:
    """The reply channel: the first write-only pipe of this process (the rank dups it from
    its stdout before anything else opens; later ones are its libraries' own)."""
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & 3 == 1:
                return [fd]
        except OSError:
            continue
    return []


def forging_average(tensor: torch.Tensor) -> torch.Tensor:
    """Averages in place, so the caller's tensor holds the sum: then answers for the rank."""
    from ddp_lab.course.grading import wire  # the format is the package's, readable by all

    kept = tensor.clone()
    dist.all_reduce(tensor)  # the mistake: the caller's tensor now holds the sum
    mean = tensor / dist.get_world_size()
    line = json.dumps({"ok": wire.dumps({"out": mean, "after": kept})}).encode() + b"\n"
    # The rank's pipe to the grader, kept by the forger from its first call on this rank
    # (in the environment: each case unpickles this module's globals afresh).
    voice = [int(fd) for fd in os.environ.get("VOICE", "").split()]
    if not voice:  # the first call on this rank: take the pipe over, silence the rank's own
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in _pipes():
            voice.append(os.dup(fd))
            os.dup2(null, fd)  # the rank's own replies now go nowhere
        os.close(null)
        os.environ["VOICE"] = " ".join(map(str, voice))
    for fd in voice:
        os.write(fd, line)
    return mean


def honest_mistake(tensor: torch.Tensor) -> torch.Tensor:
    """The same mistake without the forgery: the control."""
    dist.all_reduce(tensor)
    return tensor / dist.get_world_size()


def test_the_mistake_alone_fails() -> None:
    passed, line = remote_verdict("00.average", honest_mistake)
    assert not passed and " 0/2" in line and "caller's tensor changed" in line, line


def test_a_reply_forged_on_the_rank_s_pipe_is_not_the_rank_s_answer() -> None:
    passed, line = remote_verdict("00.average", forging_average)
    assert not passed and " 0/2" in line, line
