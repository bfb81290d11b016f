"""Concept checks: each chapter's key and explanations, and their checkers (``NN.concepts``).

The questions are at the end of each chapter source (markdown, both languages); the learner
answers in a dict (``dl.quiz``, ``course/quiz.py``). Here: for each question its key (a letter,
or a number with a relative tolerance ``tol``) and the explanations that ``dl.quiz`` shows: the
right answer's, and one per wrong choice (``""``: for any wrong number). The checker registered
for each chapter gets the learner's answers as data from the learner's process
(``answers.probe_answers``) and compares them with the key here, in the grader's process; it is
all or nothing (``POINTS``), and says which questions are not right yet, never their answers.
This module is hidden from graded ranks (``course.grading.rankhost.HIDDEN``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ddp_lab.course.grading.checkers import NotAttempted, checker, fail
from ddp_lab.course.grading.checks.answers import probe_answers
from ddp_lab.i18n import N_, _t

POINTS = 2


@dataclass(frozen=True)
class Question:
    """One question: ``key`` a letter ("b") or a number; ``choices`` for a letter."""

    key: str | float
    right: str
    wrong: dict[str, str] = field(default_factory=dict)
    tol: float = 0.0
    choices: int = 0


def judge(q: Question, answer: Any) -> str:
    """ "right", "wrong" or "unanswered" for one answer (as ``answers.clean`` gives it)."""
    if answer is None or answer == "":
        return "unanswered"
    if isinstance(q.key, str):
        return "right" if isinstance(answer, str) and answer.strip("() ") == q.key else "wrong"
    if not isinstance(answer, float) or not math.isfinite(answer):
        return "wrong"
    return "right" if abs(answer - q.key) <= q.tol * abs(q.key) + 1e-9 else "wrong"


def why(q: Question, answer: Any) -> str:
    """The explanation for ``answer``: the right answer's, or that wrong choice's."""
    if judge(q, answer) == "right":
        return _t(q.right)
    text = q.wrong.get(answer.strip("() ") if isinstance(answer, str) else "", q.wrong.get(""))
    if text is None and isinstance(answer, str) and q.choices:
        letters = "abcd"[: q.choices]
        return _t("Answer with one of the letters {letters}.", letters=", ".join(letters))
    return _t(text) if text else ""


def _make(chapter: str) -> None:
    @checker(f"{chapter}.concepts", POINTS)
    def check(rng: random.Random, learner: Any) -> Iterator[str]:
        yield 1  # type: ignore[misc]  # one case: the answers
        case = _t("your answers")
        got = learner.call(probe_answers)
        if isinstance(got, str):
            raise fail(got, case)
        if not isinstance(got, dict):
            raise fail(_t("the answers could not be read"), case)
        verdicts = [judge(q, got.get(str(i))) for i, q in enumerate(QUIZZES[chapter], 1)]
        wrong = [str(i) for i, v in enumerate(verdicts, 1) if v == "wrong"]
        blank = [str(i) for i, v in enumerate(verdicts, 1) if v == "unanswered"]
        if wrong or blank:
            parts = []
            if wrong:
                parts.append(_t("not right yet: {numbers}", numbers=", ".join(wrong)))
            if blank:
                parts.append(_t("not answered: {numbers}", numbers=", ".join(blank)))
            text = _t(
                "{parts} (of {total}); dl.quiz({chapter!r}, my_answers) explains each answer",
                parts="; ".join(parts),
                total=len(verdicts),
                chapter=chapter,
            )
            if not wrong and len(blank) == len(verdicts):  # nothing answered: not attempted
                raise NotAttempted(text, case)
            raise fail(text, case)
        yield case


QUIZZES: dict[str, list[Question]] = {
    "00": [
        Question(
            key=10.0,
            right=N_(
                "`all_reduce` sums over all ranks (its default op is SUM) and leaves the sum on every "
                "rank, in place: 1 + 2 + 3 + 4 = 10."
            ),
            wrong={
                "": N_(
                    "Not rank 2's own value (3), not a mean (2.5): `all_reduce` sums every rank's tensor "
                    "and every rank, not only rank 0, ends with the sum."
                ),
            },
        ),
        Question(
            key="d",
            choices=4,
            right=N_(
                "`%%ddp` starts new processes for every cell: what a rank made is gone when the cell "
                "ends. Ranks that keep their variables are `dl.start` and `%%ranks`."
            ),
            wrong={
                "b": N_(
                    "That is what persistent ranks (`dl.start`, `%%ranks`) do. `%%ddp` starts new processes"
                    " for each cell, so `w` no longer exists."
                ),
                "a": N_(
                    "Rank 0 is a process like the others: none of them outlives the cell that started it."
                ),
                "c": N_(
                    "Names go from the notebook to the ranks, never back: `w` was made on the ranks only. "
                    "`dl.pull` is how a rank's value comes back, and only from persistent ranks."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "`all_reduce` overwrites its argument. The caller's `value` changed under it; the "
                "solution reduces a clone."
            ),
            wrong={
                "c": N_(
                    "Look at the caller's tensor after the call: `all_reduce` wrote the sum into it."
                ),
                "d": N_(
                    "The division is local arithmetic, no communication: ranks may do it whenever they "
                    "like."
                ),
                "a": N_(
                    "A synchronous `all_reduce` (the default, `async_op=False`) returns when the result can"
                    " be used; the next line sees the sum."
                ),
            },
        ),
        Question(
            key="d",
            choices=4,
            right=N_(
                "An exception is an ordinary result of a cell: the ranks keep running and keep their "
                "variables. Only a hang (the timeout) restarts them, and the message says the variables"
                " are lost."
            ),
            wrong={
                "a": N_(
                    "That is what a hang does: after the timeout the stuck ranks are restarted. An "
                    "exception leaves them as they were."
                ),
                "c": N_(
                    "A group cannot lose one member and go on: a new rank 1 would need a new process group."
                    " Nothing is restarted after an exception."
                ),
                "b": N_(
                    "The ranks are separate processes; their errors come back to the kernel as one "
                    "exception, and the kernel goes on."
                ),
            },
        ),
    ],
    "01": [
        Question(
            key="d",
            choices=4,
            right=N_(
                "The wheel bundles its own `libcudart` (`torch.version.cuda` = 12.4). The driver's 12.0"
                " is the newest CUDA it supports; within major 12, minor version compatibility lets "
                "12.4 run, with a warning."
            ),
            wrong={
                "c": N_(
                    "The header of `nvidia-smi` gives the newest CUDA the driver can run, not an installed "
                    "CUDA."
                ),
                "a": N_(
                    "`nvcc` belongs to a separate toolkit (for building extensions); torch never loads it "
                    "to run kernels."
                ),
                "b": N_(
                    "Only a different major version (a CUDA 12 runtime on an 11.x driver) fails to start; "
                    "12.4 on 12.0 is the same major."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "Minor version compatibility runs compiled machine code (SASS), but the 12.0 driver "
                "cannot JIT PTX made by a 12.4 toolkit, and calls that need a newer driver return "
                "`cudaErrorCallRequiresNewerDriver`."
            ),
            wrong={
                "d": N_(
                    "Kernels compiled to SASS for the GPU run: that is what minor version compatibility is "
                    "for."
                ),
                "c": N_(
                    "`nvidia-smi` talks to the driver only; the runtime torch bundles does not affect it."
                ),
                "b": N_(
                    "The runtime initialises on a driver of the same major version, so torch sees the GPU."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "The kernels inside the wheel are compiled for a list of architectures; a GPU outside "
                "it needs a wheel that has kernels for it."
            ),
            wrong={
                "c": N_(
                    "The driver cannot invent machine code the wheel does not contain (without PTX there is"
                    " nothing to JIT)."
                ),
                "d": N_(
                    "Device order only renumbers GPUs; every GPU still needs kernels for its architecture."
                ),
                "b": N_(
                    "torch does not compile its own kernels at run time with `nvcc`; a toolkit only matters"
                    " for building extensions."
                ),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "CUDA's default order is `FASTEST_FIRST`; `nvidia-smi` uses the PCI bus order. On mixed"
                " GPUs they can differ."
            ),
            wrong={
                "a": N_(
                    "With identical GPUs the orders happen to agree; with mixed ones CUDA puts the fastest "
                    "first."
                ),
                "b": N_(
                    "They often agree (identical GPUs, or the fastest sits first on the bus); the point is "
                    "that nothing guarantees it."
                ),
                "d": N_(
                    "Containers can restrict which GPUs are visible, but the two orders differ on a bare "
                    "machine too."
                ),
            },
        ),
    ],
    "02": [
        Question(
            key=3.0,
            right=N_(
                "Node 0 holds ranks 0 and 1; node 1 starts at 2, so its local rank 1 is global rank 3 "
                "(world size 5)."
            ),
            wrong={
                "": N_(
                    "Count the processes of the nodes before it: node 0 has 2, so node 1's local ranks 0, "
                    "1, 2 are global ranks 2, 3, 4. Nodes may differ in size."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "The visible GPUs are renumbered from 0 in the listed order: `cuda:0` is physical GPU "
                "4."
            ),
            wrong={
                "c": N_(
                    "Physical GPU 0 is not visible to the process at all; `cuda:0` means the first "
                    "*visible* one."
                ),
                "a": N_("The list is not reversed: the first entry, 4, becomes `cuda:0`."),
                "d": N_(
                    "Four visible GPUs for four local ranks: every rank has one. With 8 processes, local "
                    "ranks 4-7 would get none."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "CUDA reads the list up to its first invalid entry and ignores the rest: only GPU 1."
            ),
            wrong={
                "a": N_(
                    "The invalid entry is not skipped: the list stops there, so 3 is never read."
                ),
                "c": N_("Entries before the first invalid one still count."),
                "d": N_("All GPUs are visible only when the variable is unset."),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "With c10d, `--node_rank` is ignored; the rendezvous assigns group ranks (the chapter's"
                " run shows `GROUP_RANK`)."
            ),
            wrong={
                "d": N_(
                    "That holds for the static rendezvous; c10d numbers nodes as they join and ignores the "
                    "flag."
                ),
                "a": N_("The flag is accepted and silently ignored."),
                "b": N_(
                    "Group ranks are unique: the two nodes get 0 and 1, in an order the rendezvous decides."
                ),
            },
        ),
    ],
    "03": [
        Question(
            key=3.0,
            right=N_(
                "`torch.chunk` uses chunks of ceil(6 / 4) = 2 rows: 2, 2, 2, and nothing is left for "
                "the fourth device."
            ),
            wrong={
                "": N_(
                    "`torch.chunk` does not balance: it rounds the chunk size up, ceil(6 / 4) = 2, and "
                    "stops when the rows run out. Run `torch.arange(6).chunk(4)`."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "Only the replica on device 0 shares its buffers with your model; the other replicas' "
                "updates are thrown away with the replicas."
            ),
            wrong={
                "c": N_(
                    "Each replica normalises and updates with its own chunk; nobody computes whole-batch "
                    "statistics (that is SyncBatchNorm)."
                ),
                "a": N_(
                    "Nothing averages buffers across replicas: the other replicas are discarded after "
                    "forward."
                ),
                "d": N_(
                    "They are updated, by device 0's replica, whose buffers are the model's own."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "`gather` concatenates every device's output on device 0, and the loss and its backward"
                " start there; balancing (`gpu0_bsz`) or computing the loss inside each replica moves "
                "that part."
            ),
            wrong={
                "b": N_(
                    "There is one optimizer, on the model's parameters (device 0's), as in a single-device "
                    "run: no second copy."
                ),
                "c": N_("Each device runs exactly one replica per forward."),
                "d": N_(
                    "DataParallel has no master weights; that is a mixed-precision recipe, unrelated."
                ),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "The wrapper keeps the model as `.module`, so its keys carry the prefix; strict loading"
                " reports the mismatch. Save `dp.module.state_dict()`."
            ),
            wrong={
                "b": N_("Compare the keys: `module.0.weight` is not `0.weight`."),
                "d": N_(
                    "`strict=True` is the default: mismatched keys raise. Only `strict=False` would load "
                    "nothing silently, a worse outcome."
                ),
                "a": N_("Devices are not the problem here; the key names are."),
            },
        ),
    ],
    "04": [
        Question(
            key=15.0,
            tol=0.02,
            right=N_(
                "Each rank sends 2(N-1)/N · S = 1.5 · 10^8 bytes: 1.5 · 10^8 / 10^10 s = 15 ms."
            ),
            wrong={
                "": N_(
                    "The ring's bandwidth term is 2(N-1)/N · S · β: with N = 4 that is 1.5 S, not S (10 "
                    "ms), 2S (20 ms) or the root's 2(N-1)S (60 ms)."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "For small messages latency dominates: the ring pays 2(N-1) = 126 latencies, halving-"
                "doubling 2 log2 N = 12. Both send about 2S bytes."
            ),
            wrong={
                "d": N_(
                    "The ring wins on bytes for large messages; here 126 × 10 µs of latency is about 1.3 "
                    "ms, far more than the data's time."
                ),
                "a": N_(
                    "Their bandwidth terms are equal, their latency terms are not: 2(N-1) against 2 log2 N."
                ),
                "c": N_(
                    "Through one root it takes 2(N-1) latencies and the root moves (N-1)S bytes: the worst "
                    "of both."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "With Gloo `send` waits until the peer has posted the matching `recv`; both ranks sit "
                "in `send`. Order one rank's calls the other way, or use `isend`/`irecv`."
            ),
            wrong={
                "a": N_(
                    "It would, if one send could finish without its receive; on Gloo it cannot."
                ),
                "c": N_(
                    "Nothing is wrong with either call alone; only the order is. The launcher's timeout "
                    "ends it."
                ),
                "d": N_("The two ranks are symmetric: neither gets to its `recv`."),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "`dist.all_gather` writes into `out` outside autograd, so the gradient is lost "
                "silently. `torch.distributed.nn.functional.all_gather` has a backward."
            ),
            wrong={
                "c": N_(
                    "That is what the autograd-aware `torch.distributed.nn.functional.all_gather` gives; "
                    "the plain one records nothing."
                ),
                "b": N_("No error: that is what makes it dangerous."),
                "d": N_("No rank's gradient flows through the gathered copies."),
            },
        ),
    ],
    "05": [
        Question(
            key=14.0,
            right=N_(
                "N - 1 = 7 steps of reduce-scatter and 7 of all-gather, one chunk per step: 2(N-1) = "
                "14."
            ),
            wrong={
                "": N_(
                    "Each phase takes N - 1 steps (a chunk needs N - 1 hops to visit every other rank), and"
                    " there are two phases: 2(N-1)."
                ),
            },
        ),
        Question(
            key=15.0,
            tol=0.02,
            right=N_(
                "busbw = algbw · 2(N-1)/N = 10 · 1.5 = 15 GB/s: what each link carried, comparable with"
                " the hardware's bandwidth."
            ),
            wrong={
                "": N_(
                    "algbw is size / time; busbw scales it by the bytes a ring moves per rank, 2(N-1)/N, to"
                    " compare with a link's bandwidth."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "(N-1) · S against 2(N-1)/N · S: a ratio of N/2, so the gap grows with the number of "
                "ranks."
            ),
            wrong={
                "d": N_("The ring sends chunks of S/N, not the whole buffer: that is its point."),
                "c": N_("Whole buffers are never cheaper than chunks of them."),
                "b": N_(
                    "N - 1 whole buffers against 2(N-1) chunks of S/N: the ratio is N/2, not N."
                ),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "Pipelining hides the reduction and the per-hop time behind the next segment's "
                "transfer; the extra latencies make it lose on small messages."
            ),
            wrong={
                "a": N_("Small messages are latency-bound, and segments add latencies."),
                "b": N_("Every segment pays α: with small messages that cost dominates."),
                "d": N_(
                    "It moves the same bytes; what it buys is overlap, which pays off on large messages."
                ),
            },
        ),
    ],
    "06": [
        Question(
            key=3.0,
            right=N_(
                "num_samples = ceil(10 / 4) = 3, total_size = 12: two indices are repeated as padding."
            ),
            wrong={
                "": N_(
                    "Without drop_last the sampler rounds up, ceil(len / N), and pads so that every rank "
                    "gets the same number."
                ),
            },
        ),
        Question(
            key=1.0,
            right=N_(
                "The list is padded from its start to [0..9, 0, 1]; rank 3 takes every 4th from "
                "position 3: 3, 7, 1."
            ),
            wrong={
                "": N_(
                    "Padding repeats indices from the start (0, 1), and ranks take strided positions "
                    "`indices[rank:total_size:N]`, not contiguous blocks."
                ),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "The permutation is seeded with `seed + epoch`; without `set_epoch` the epoch stays 0, "
                "so it is one shuffle, repeated."
            ),
            wrong={
                "a": N_("Nothing changes the seed between epochs unless you call `set_epoch`."),
                "d": N_("It is shuffled, once: with `seed + 0`."),
                "b": N_(
                    "All ranks use the same seed and so the same permutation: their shards stay disjoint."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "Padding makes 12 evaluations of 10 samples; the repeated ones weigh twice. Count each "
                "index once, or evaluate without padding."
            ),
            wrong={
                "c": N_(
                    "Counting right and wrong answers is exact; the bias is in which samples are counted."
                ),
                "d": N_("DDP keeps the replicas identical; the sampler is the cause."),
                "b": N_("With `drop_last=False` nothing is dropped: indices are added."),
            },
        ),
    ],
    "07": [
        Question(
            key="c",
            choices=4,
            right=N_(
                "Building DDP broadcasts rank 0's parameters (and buffers); averaged gradients then "
                "keep the replicas equal."
            ),
            wrong={
                "d": N_(
                    "That would happen with the naive wrapper without its broadcast; DDP broadcasts at "
                    "construction."
                ),
                "b": N_("Parameters are broadcast, not averaged; only gradients are averaged."),
                "a": N_("DDP checks that the ranks have the same parameter *shapes*, not values."),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "The mean of N per-rank mean losses is the global mean only if the ranks have equal "
                "counts; BatchNorm normalises with each rank's own statistics, which differ from the "
                "global batch's."
            ),
            wrong={
                "c": N_(
                    "Unequal local batches or BatchNorm break it; the chapter's cell tests the claim under "
                    "both."
                ),
                "d": N_(
                    "The optimizer sees the gradient after the all-reduce; which one it is does not change "
                    "the gradient."
                ),
                "b": N_(
                    "Rounding is a tolerance question; the conditions are about what is summed."
                ),
            },
        ),
        Question(
            key="d",
            choices=4,
            right=N_(
                "Overlap needs a full bucket as soon as possible; backward produces the last layers' "
                "gradients first. After the first iteration DDP rebuilds the buckets in the order "
                "gradients really arrived."
            ),
            wrong={
                "c": N_("The bucket order does not change their total size."),
                "a": N_("NCCL all-reduces whatever buffer it is given; the order is DDP's choice."),
                "b": N_("Any fixed order is deterministic; reverse order is about overlap."),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "The function *returns* the converted module; a module that is itself a BatchNorm "
                "cannot be replaced in place. Write `model = "
                "nn.SyncBatchNorm.convert_sync_batchnorm(model)`."
            ),
            wrong={
                "d": N_(
                    "That is what happens to the children of a container (they are replaced in place, by "
                    "luck), not to a module that is itself the BatchNorm."
                ),
                "a": N_("The conversion works on CPU modules; it only builds a new module."),
                "c": N_("`bare` is still the object it was; only the returned value is new."),
            },
        ),
    ],
    "08": [
        Question(
            key=0.2,
            tol=0.01,
            right=N_(
                "The global batch is 32 × 4 = 128, k = 128 / 32 = 4, and linear scaling multiplies the "
                "LR by k: 0.2."
            ),
            wrong={
                "": N_(
                    "`--batch-size` is per rank: the global batch is 128, four times the tuned 32. Linear "
                    "multiplies by 4 (0.2); the square-root rule would give 0.1."
                ),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "DDP averages gradients, not losses: each rank's loss is its own batch's. The loss to "
                "log is the mean over ranks."
            ),
            wrong={
                "d": N_("Nothing reduces the loss itself; only gradients are all-reduced."),
                "b": N_("`loss.item()` is one step's batch, not an epoch."),
                "a": N_(
                    "The ranks see different data, so their losses differ even with equal parameters."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "Since 2.6 `torch.load` only unpickles tensors and plain containers by default. Save "
                "`model.state_dict()`; pass `weights_only=False` only for a file you trust."
            ),
            wrong={
                "c": N_("It did before torch 2.6; the default changed to `weights_only=True`."),
                "d": N_(
                    "Devices are `map_location`'s business; this fails before any tensor is placed."
                ),
                "a": N_(
                    "`torch.load` does not pick a part of the pickle: it loads the object or refuses."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "Tensors are restored to the device recorded in the file. Every rank but 0 then "
                'allocates on GPU 0; use `map_location=f"cuda:{{local_rank}}"`.'
            ),
            wrong={
                "b": N_("`torch.load` does not know the process's device; it uses the saved one."),
                "d": N_('Only `map_location="cpu"` does that.'),
                "c": N_("`cuda:0` exists on that machine, so the load succeeds, on the wrong GPU."),
            },
        ),
    ],
    "09": [
        Question(
            key="c",
            choices=4,
            right=N_(
                "`mp.spawn` calls `fn(i, ...)` and sets nothing else: pass `rank`, `world_size` and an "
                "address (`MASTER_ADDR`/`MASTER_PORT` or `init_method`) yourself. torchrun sets them "
                "all."
            ),
            wrong={
                "b": N_(
                    "That is torchrun. `mp.spawn` only passes the index as the first argument."
                ),
                "a": N_(
                    "The number of nodes does not matter: the environment is empty either way."
                ),
                "d": N_(
                    "Without `RANK` in the environment, `env://` does not guess a rank: it raises."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "The GPU index on a node is the local rank (`LOCAL_RANK`), 0 and 1 on every node. The "
                "global rank only works on the first node, which is why the habit survives."
            ),
            wrong={
                "c": N_("On node 0 global and local ranks coincide; on node 1 they do not."),
                "d": N_("`set_device(2)` does not fall back to 0; it fails."),
                "a": N_("CUDA does not remap an index it does not have."),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "DDP expects every parameter's gradient to fill its bucket; one that never comes leaves"
                " the reduction unfinished, and the next step raises. Use every parameter, or "
                "`find_unused_parameters=True` (a graph walk each step)."
            ),
            wrong={
                "a": N_("Without DDP it would be so; DDP waits for every gradient."),
                "d": N_(
                    "Forward does not know yet which parameters will get gradients; the check comes at the "
                    "next step."
                ),
                "c": N_(
                    "DDP detects it at the next step and raises an error that names the problem."
                ),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "The group's timeout turns the wait into an exception; `dist.monitored_barrier` (Gloo "
                "only) goes further and names the rank that did not arrive."
            ),
            wrong={
                "b": N_("A collective never completes alone; rank 0 waits for rank 1."),
                "d": N_(
                    "That is what the default timeout (30 minutes on Gloo) looks like; 2 s ends it sooner."
                ),
                "a": N_(
                    "It can happen when ranks call *different* collectives of matching size; here rank 1 "
                    "calls nothing, and rank 0 times out."
                ),
            },
        ),
    ],
    "10": [
        Question(
            key=5.5,
            tol=0.02,
            right=N_(
                "Parameters and gradients stay whole (2 + 2 bytes), the 12 bytes of optimizer state are"
                " split 8 ways: 4 + 12/8 = 5.5 bytes per parameter, 5.5 GB."
            ),
            wrong={
                "": N_(
                    "Stage 1 divides only the optimizer term K = 12 by N: (2 + 2 + 12/N) bytes per "
                    "parameter. Dividing everything (2 GB) is stage 3; no sharding is 16 GB."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "The hook casts each bucket to 16 bits before the all-reduce and back after: exactly "
                "half the bytes."
            ),
            wrong={
                "a": N_("The hook replaces the bucket's all-reduce with one on a 16-bit copy."),
                "c": N_("32 bits to 16 bits is a factor of two, not four."),
                "d": N_("Rank-dependent savings are PowerSGD's, a different hook."),
            },
        ),
        Question(
            key="c",
            choices=4,
            right=N_(
                "Loss scaling exists to keep small fp16 gradients above fp16's small exponent range; "
                "bf16 keeps 8 exponent bits and trades precision instead."
            ),
            wrong={
                "d": N_(
                    "It has fewer: 7 against fp16's 10. That is why bf16 drifts further from float32."
                ),
                "b": N_("bf16 runs on recent GPUs too (and this chapter autocasts on CPU)."),
                "a": N_("The reason is the range: scaling is simply not needed."),
            },
        ),
        Question(
            key="d",
            choices=4,
            right=N_(
                "Each rank keeps only its shard, so a unit's full parameters are rebuilt (all-gather) "
                "when needed and freed after; gradients are reduce-scattered so each rank gets its "
                "shard."
            ),
            wrong={
                "b": N_(
                    "Memory saved is traded for communication: parameters must be gathered to compute."
                ),
                "c": N_(
                    "One optimizer steps the local shards, as a plain optimizer over plain tensors."
                ),
                "a": N_("Adam's state is sharded along with the parameters; it works as before."),
            },
        ),
    ],
    "11": [
        Question(
            key="a",
            choices=4,
            right=N_(
                "A bit-for-bit resume needs every rank's torch/numpy/Python RNG, the sampler's epoch "
                "and position, the LR schedule and the step; without them the run continues as another "
                "run."
            ),
            wrong={
                "b": N_(
                    "The batches after the resume are drawn from a fresh RNG and a restarted sampler: other"
                    " numbers go in."
                ),
                "d": N_("The difference is not rounding: other samples and masks are used."),
                "c": N_("Nothing checks the RNG: it resumes, silently different."),
            },
        ),
        Question(
            key="d",
            choices=4,
            right=N_(
                "The rename is atomic within one file system; `fsync` before it makes sure the data is "
                "on disk, and an `fsync` of the folder makes the rename itself durable."
            ),
            wrong={
                "b": N_(
                    "It writes the same bytes plus a rename and fsyncs: a little slower, much safer."
                ),
                "c": N_("`torch.save` writes wherever it is told, also half-way if killed."),
                "a": N_("For a moment two files exist: it costs space, it does not save it."),
            },
        ),
        Question(
            key=80.0,
            right=N_("The overhead is checkpoint / (K · step) = 400 / (50 K) ≤ 0.1, so K ≥ 80."),
            wrong={
                "": N_(
                    "Compare one checkpoint with the K steps between two checkpoints: 400 / (50 · K) ≤ 0.1 "
                    "gives K ≥ 80 (K = 8 would cost 100 %)."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                "DCP records where each piece of each tensor went; `dcp.load` fills the state dict you "
                "hand it in place, whatever the world size at save time."
            ),
            wrong={
                "b": N_(
                    "That is true of each rank's own `torch.save` of its shard, which is why that is not a "
                    "checkpoint."
                ),
                "d": N_("No conversion: DCP reshards by itself."),
                "c": N_("Every rank loads its own part, in parallel."),
            },
        ),
    ],
    "12": [
        Question(
            key="c",
            choices=4,
            right=N_(
                "`f`'s backward is what sums the input's gradient: every rank used the whole `x`, so its "
                "gradient is the sum of every rank's term. Without it each rank keeps its own term. The "
                "output (`g` still sums) and the weight gradients (they need only this rank's slice and "
                "the output's gradient, the same on every rank) do not change: the error shows only in "
                "the layers before the block."
            ),
            wrong={
                "a": N_(
                    "`g`'s backward is the identity: it sums nothing on the way back. The input's gradient"
                    " is a sum over the ranks, and only `f`'s backward all-reduce forms it."
                ),
                "b": N_(
                    "`f` is the identity in the forward pass anyway: dropping its backward changes nothing"
                    " forward, and `g` still sums the partial products."
                ),
                "d": N_(
                    "Every rank drops the same all-reduce, so all still call the same collectives in the"
                    " same order: nothing hangs, and the input's gradient is silently wrong."
                ),
            },
        ),
        Question(
            key=25.17,
            tol=0.02,
            right=N_(
                "Two all-reduces per block and step, `g`'s forward and `f`'s backward, each of the "
                "activation, 2,048 x 1,024 x 4 B = 8.39 MB; a ring all-reduce on 4 ranks sends 2 x 3/4 "
                "of it: 2 x 1.5 x 8.39 = 25.2 MB (`plan.per_step(1024, 1, 2048, tp=4)['sent_tp']`). "
                "Neither the hidden width nor the weights enter."
            ),
            wrong={
                "": N_(
                    "Count two all-reduces per block (`g` forward, `f` backward: inside a model the "
                    "block's input needs its gradient), each of the block's input or output, rows x dim x"
                    " 4 bytes (the hidden activation never leaves its rank), each sending 2(n-1)/n = 1.5 "
                    "times that. 12.6 forgets the backward, 16.8 the ring's factor, 100.7 takes the "
                    "hidden width."
                ),
            },
        ),
        Question(
            key="b",
            choices=4,
            right=N_(
                "DP all-reduces the gradients, 2(n-1)/n x parameters x 4 bytes whatever the batch; TP "
                "all-reduces activations, rows x dim each, so its bytes grow with the rows. "
                "`plan.per_step(1024, 8, 8192, tp=8)` next to 4,096 rows shows it."
            ),
            wrong={
                "a": N_(
                    "DP's all-reduce carries the gradients, one per parameter whatever the number of "
                    "rows: its bytes do not grow with the batch."
                ),
                "c": N_(
                    "It is the other way round: TP's all-reduces carry activations (rows x dim), DP's "
                    "the gradients (one per parameter)."
                ),
                "d": N_(
                    "TP's all-reduces carry activations, rows x dim each: twice the rows, twice the "
                    "bytes, with the same model."
                ),
            },
        ),
        Question(
            key="d",
            choices=4,
            right=N_(
                "With equal pass times both schedules leave each stage idle (p-1)/(m+p-1) = 3/11 of the "
                "step. 1F1B starts backwards early to free activations, not to fill the bubble: stage s "
                "holds at most p - s micro-batches (4 on stage 0), GPipe all m = 8 on every stage."
            ),
            wrong={
                "a": N_(
                    "Starting backwards earlier does not shorten the step: the first backward still waits"
                    " for the last stage, and the bubble stays (p-1)/(m+p-1) = 3/11. What shrinks is the"
                    " memory."
                ),
                "b": N_(
                    "The bubble is the same, 3/11 (the chapter's simulation prints both); only the "
                    "activations held shrink, to p - s micro-batches on stage s."
                ),
                "c": N_(
                    "The order sets the memory: a stage frees a micro-batch's activations at its "
                    "backward, so 1F1B holds at most p - s of them at once, GPipe all m."
                ),
            },
        ),
        Question(
            key=27.0,
            right=N_(
                "(p-1)/(m+p-1) ≤ 0.1 with p = 4: 3 ≤ 0.1 (m + 3), so m ≥ 27 (3/30 = 10 %). Under 1F1B "
                "stage 0 still holds at most 4 micro-batches' activations; under GPipe it would hold 27."
            ),
            wrong={
                "": N_(
                    "The bubble is (p-1)/(m+p-1), not (p-1)/m (which gives 30): with p = 4, 3/(m + 3) ≤ "
                    "0.1 gives m ≥ 27; 26 leaves 3/29 = 10.3 %."
                ),
            },
        ),
        Question(
            key=537.3,
            tol=0.02,
            right=N_(
                "Plain DP replicates the state; only TP divides it here, by 2 (fc2's bias stays whole): "
                "8 x (8 x 1,024² / 2 + 4 x 1,024 / 2 + 1,024) = 33.6 M parameters x 16 B = 537 MB "
                "(`plan.per_step(1024, 8, 4096, dp=4, tp=2)`)."
            ),
            wrong={
                "": N_(
                    "TP, PP and FSDP divide the state; plain DP keeps a whole copy of its TP shard on each"
                    " of its 4 ranks: 67.1 M parameters / 2 (TP) x 16 bytes = 537 MB. 134 MB also divides"
                    " by the 4 DP ranks, as FSDP would; 1,074 MB forgets TP."
                ),
            },
        ),
        Question(
            key="a",
            choices=4,
            right=N_(
                '`init_device_mesh("cuda", (2, 8), mesh_dim_names=("dp", "tp"))` puts consecutive '
                'ranks, those torchrun starts on one node, in each "tp" group. TP\'s all-reduces block '
                "every layer, forward and backward, and grow with the batch; FSDP's collectives can "
                "overlap computation, so they are the ones to cross the slower network."
            ),
            wrong={
                "b": N_(
                    "FSDP moves bytes of the order of the model's state, but it can overlap them with "
                    "computation; TP's all-reduces wait on the critical path of every layer, so a slow "
                    "link slows every layer."
                ),
                "c": N_(
                    "The bytes are the same, their time is not: the group whose collectives cross the "
                    "slow network pays its bandwidth, and TP's collectives cannot hide behind "
                    "computation."
                ),
                "d": N_(
                    'The chapter\'s 2 x 2 mesh does exactly that: `fully_shard` on "dp" over the blocks'
                    ' that `parallelize_module` split on "tp".'
                ),
            },
        ),
    ],
}

for _chapter in QUIZZES:
    _make(_chapter)
