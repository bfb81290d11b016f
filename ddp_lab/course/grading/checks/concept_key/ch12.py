"""The concept checks' key: chapter 12 (tensor and pipeline parallelism).

Data only (``course.grading.checks.concepts`` judges with it); hidden from graded processes
(``course.grading.view.HIDDEN``).
"""

from __future__ import annotations

from ddp_lab.course.grading.checks.concept_key import Question
from ddp_lab.i18n import N_

QUIZZES: dict[str, list[Question]] = {
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
                    "The bubble as a fraction of the whole step is (p-1)/(m+p-1): with p = 4, 3/(m + 3) ≤ "
                    "0.1 gives m ≥ 27; 26 leaves 3/29 = 10.3 %. 30 is what (p-1)/m ≤ 0.1 gives: the same "
                    "idle time over the ideal step (Narayanan et al. 2021), another denominator."
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
