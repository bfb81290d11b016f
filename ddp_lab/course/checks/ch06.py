"""Checkers of chapter 06: the sampler's indices, and an evaluation without padding bias."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ddp_lab.course.grading import checker, fail, mismatch
from ddp_lab.course.i18n import Messages


def uses_forbidden(fn: Callable, names: set[str]) -> str:
    """The first of ``names`` that ``fn``'s code refers to (the exercise must not call them)."""
    code = getattr(fn, "__code__", None)
    todo, seen = [code] if code is not None else [], set()
    while todo:
        c = todo.pop()
        seen |= set(c.co_names)
        todo += [k for k in c.co_consts if hasattr(k, "co_names")]
    hits = sorted(seen & names)
    return hits[0] if hits else ""


FORBIDDEN = {
    "06.indices": {
        "DistributedSampler",
        "pad_or_trim",
        "padded_indices",
        "assignment_grid",
        "num_samples_for",
    },
    "06.accuracy": {"gather_in_index_order", "gather_by_index", "all_reduce_accuracy"},
}
MESSAGES = Messages(
    __name__,
    {
        "forbidden": {
            "en": "write it yourself: your function calls {name}",
            "zh": "请自己实现：你的函数调用了 {name}",
        },
    },
)


def _check_forbidden(grade_id: str, fn: Callable) -> None:
    name = uses_forbidden(fn, FORBIDDEN[grade_id])
    if name:
        raise fail(MESSAGES("forbidden", name=name), "-")


def torch_indices(
    n: int, replicas: int, rank: int, epoch: int, seed: int, shuffle: bool, drop_last: bool
) -> list[int]:
    """The oracle: what torch's own DistributedSampler yields."""
    sampler = DistributedSampler(
        range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def index_cases(rng: random.Random) -> list[tuple[str, dict]]:
    """Hidden cases of 06.indices: (label, keyword arguments without rank)."""

    def case(label: str, n: int, replicas: int, **kw: object) -> tuple[str, dict]:
        args = dict(
            dataset_len=n, num_replicas=replicas, epoch=0, seed=0, shuffle=True, drop_last=False
        )
        args.update(kw)
        return f"{label}: dataset_len={n}, num_replicas={replicas}", args

    r = rng.randint(2, 4)
    return [
        case("divisible, shuffle=False", r * rng.randint(2, 5), r, shuffle=False),
        case(
            "padding, shuffle=False",
            r * rng.randint(2, 5) + rng.randint(1, r - 1),
            r,
            shuffle=False,
        ),
        case(
            "padding, shuffled",
            rng.randint(11, 30) * 4 + rng.randint(2, 3),
            4,
            seed=rng.randint(1, 99),
        ),
        case(
            "dataset_len < num_replicas",
            rng.randint(2, 3),
            rng.randint(5, 8),
            shuffle=rng.random() < 0.5,
        ),
        case("padding larger than the dataset", 1, rng.randint(3, 6), seed=rng.randint(0, 9)),
        case("dataset_len = 0", 0, rng.randint(2, 4), drop_last=rng.random() < 0.5),
        case(
            "drop_last, divisible",
            3 * rng.randint(3, 9),
            3,
            drop_last=True,
            seed=rng.randint(0, 99),
        ),
        case(
            "drop_last, not divisible",
            4 * rng.randint(3, 9) + rng.randint(1, 3),
            4,
            drop_last=True,
            seed=rng.randint(0, 99),
        ),
        case("drop_last, dataset_len < num_replicas", rng.randint(1, 3), 4, drop_last=True),
        case("epoch 1 (set_epoch)", rng.randint(12, 40), r, epoch=1, seed=rng.randint(0, 99)),
        case(
            "later epoch",
            rng.randint(12, 40),
            3,
            epoch=rng.randint(2, 9),
            seed=rng.randint(100, 10**6),
        ),
        case(
            "other seed, drop_last, later epoch",
            rng.randint(20, 60),
            5,
            epoch=rng.randint(2, 9),
            seed=rng.randint(10, 10**4),
            drop_last=True,
        ),
        case("one replica", rng.randint(5, 20), 1, seed=rng.randint(0, 99)),
    ]


@checker("06.indices", points=4)
def check_indices(rng: random.Random, distributed_indices: Callable) -> Iterator[object]:
    cases = index_cases(rng)
    yield len(cases)
    _check_forbidden("06.indices", distributed_indices)
    for label, args in cases:
        for rank in range(args["num_replicas"]):
            expected = torch_indices(
                args["dataset_len"],
                args["num_replicas"],
                rank,
                args["epoch"],
                args["seed"],
                args["shuffle"],
                args["drop_last"],
            )
            got = distributed_indices(
                args["dataset_len"],
                args["num_replicas"],
                rank,
                epoch=args["epoch"],
                seed=args["seed"],
                shuffle=args["shuffle"],
                drop_last=args["drop_last"],
            )
            if isinstance(got, torch.Tensor):
                got = got.tolist()
            if not isinstance(got, (list, tuple)) or list(got) != expected:
                raise fail(mismatch(expected, got).args[0], f"{label}, rank={rank}")
        yield label


def biased_variants(correct: list[float], replicas: int) -> list[float]:
    """Accuracies that the typical wrong evaluations report (the checker must tell them apart)."""
    n = len(correct)
    shards = [
        [correct[i] for i in DistributedSampler(range(n), replicas, r, shuffle=False)]
        for r in range(replicas)
    ]
    cat = [v for s in shards for v in s]
    return [
        sum(cat) / len(cat),  # concatenate and average: padded samples count twice
        sum(cat[:n]) / n,  # trimmed without restoring the order: keeps a padded copy
        sum(cat) / n,  # duplicates in the numerator only
        sum(sum(s) / len(s) for s in shards) / replicas,  # mean of the ranks' means
    ]


def accuracy_cases(rng: random.Random) -> list[tuple[int, list[tuple[int, list[float]]]]]:
    """Per world size, the hidden datasets: (dataset_len, per-sample correctness)."""
    r = rng.choice([3, 4])
    plan = [
        (r, [r * rng.randint(3, 8), r * rng.randint(3, 8) - 2, r * rng.randint(3, 8) - 1]),
        (5, [5 * rng.randint(2, 6) - 3, 2]),  # 2 samples on 5 ranks: the padding cycles
        (2, [2 * rng.randint(5, 20) - 1]),
    ]
    result = []
    for replicas, sizes in plan:
        datasets = []
        for n in sizes:
            best: tuple[int, list[float]] = (-1, [])
            for _ in range(100):  # keep the data on which most wrong answers differ
                correct = [float(rng.random() < 0.6) for _ in range(n)]
                truth = sum(correct) / n
                score = sum(abs(v - truth) > 1e-6 for v in biased_variants(correct, replicas))
                if score > best[0]:
                    best = (score, correct)
                if score == 4:
                    break
            datasets.append((n, best[1]))
        result.append((replicas, datasets))
    return result


def _run_accuracy(rank: int, fn: Callable, datasets: list[tuple[int, list[float]]]) -> list:
    """On each rank: the learner's accuracy for each dataset, from this rank's padded shard."""
    replicas = dist.get_world_size()
    out = []
    for n, correct in datasets:
        shard = list(DistributedSampler(range(n), replicas, rank, shuffle=False))
        got = fn(torch.tensor([correct[i] for i in shard]), n)
        out.append(float(got) if isinstance(got, (int, float, torch.Tensor)) else repr(got))
    return out


@checker("06.accuracy", points=3)
def check_accuracy(rng: random.Random, gathered_accuracy: Callable) -> Iterator[object]:
    from ddp_lab import spawn

    plan = accuracy_cases(rng)
    yield sum(len(d) for _, d in plan)
    _check_forbidden("06.accuracy", gathered_accuracy)
    for replicas, datasets in plan:
        results = spawn(
            _run_accuracy,
            args=(gathered_accuracy, datasets),
            nprocs=replicas,
            backend="gloo",
            quiet=True,
            timeout=60,
        )
        for k, (n, correct) in enumerate(datasets):
            label = f"world_size={replicas}, dataset_len={n}"
            truth = sum(correct) / n
            for rank, per_rank in enumerate(results):
                got = per_rank[k]
                if isinstance(got, str) or abs(got - truth) > 1e-6:
                    raise fail(mismatch(round(truth, 6), got).args[0], f"{label}, rank {rank}")
            yield label
