"""The concept checks' key: chapters 00 (quickstart), 01 (the GPU stack), 02 (processes and ranks),
03 (DataParallel).

Data only (``course.grading.checks.concepts`` judges with it); hidden from graded processes
(``course.grading.view.HIDDEN``).
"""

from __future__ import annotations

from ddp_lab.course.grading.checks.concept_key import Question
from ddp_lab.i18n import N_

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
}
