"""The concept checks' key: chapters 08 (a full DDP run), 09 (launching and debugging), 10 (beyond
DDP: ZeRO and FSDP), 11 (runs that fail).

Data only (``course.grading.checks.concepts`` judges with it); hidden from graded processes
(``course.grading.view.HIDDEN``).
"""

from __future__ import annotations

from ddp_lab.course.grading.checks.concept_key import Question
from ddp_lab.i18n import N_

QUIZZES: dict[str, list[Question]] = {
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
}
