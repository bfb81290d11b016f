"""The oracle of chapter 08's exercise: torch's DDP and DistributedSampler used correctly.

``reference_fit`` has the learner's ``fit``'s signature (less the checkpoint) and does what
the exercise asks, so it lives apart from ``ch08.py``: ``08.fit``'s probe runs in the runner,
which imports ``ch08`` for it, and a ``fit`` that returned ``reference_fit(...)`` (reached as
``ddp_lab.course.grading.checks.ch08.reference_fit``, an attribute path the scan does not
read) got full points. This module is hidden wherever learner code runs
(``course.grading.view.HIDDEN``); only ``ch08.oracle`` imports it, in the grader's ranks. It
imports nothing from ``ch08`` (no import circle: tests/test_import_cycles.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def reference_fit(
    model: nn.Module, dataset: Dataset, epochs: int, batch_size: int, lr: float
) -> tuple[list[float], list[float]]:
    """The oracle: torch's DDP and DistributedSampler used correctly (no checkpoint).

    Returns two logs of the epoch loss, both averaged over ranks: the mean of the batch
    losses (what the exercise asks) and the mean over samples (also accepted).
    """
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    by_batch, by_sample = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        sums = torch.zeros(3, dtype=torch.float64)  # sum of batch losses, of sample losses, n
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            sums += torch.tensor([loss.item(), loss.item() * len(y), len(y)])
        sums[0] /= len(loader)
        dist.all_reduce(sums)
        by_batch.append(sums[0].item() / dist.get_world_size())
        by_sample.append((sums[1] / sums[2]).item())
    return by_batch, by_sample
