"""The concept checks' key: chapters 04 (collectives), 05 (the ring all-reduce), 06
(DistributedSampler), 07 (DDP from scratch).

Data only (``course.grading.checks.concepts`` judges with it); hidden from graded processes
(``course.grading.view.HIDDEN``).
"""

from __future__ import annotations

from ddp_lab.course.grading.checks.concept_key import Question
from ddp_lab.i18n import N_

QUIZZES: dict[str, list[Question]] = {
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
}
