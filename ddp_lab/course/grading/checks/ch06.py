"""Checkers of chapter 06: the sampler's indices, and an evaluation without padding bias.

The probes call the learner's function in ranks of their own (``learner.ranks``, a sandbox
per rank when graded, where ``ddp_lab.sampler`` and ``ddp_lab.labs.evaluation`` are hidden):
``probe_forbidden`` (a static look at the names the code refers to) and ``probe_indices``
(once per case for every rank) on one rank that receives that case only; ``probe_accuracy`` on
gloo ranks, rank r with only its own padded shard, so that the exact accuracy proves that the
ranks communicated) with the package's and torch's
ready-made answers refused for the duration of the call (``course.grading.learner.refuse``), and
return what came out as data. The oracles (torch's ``DistributedSampler``; the exact accuracy) run and
the comparisons happen in the checker.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.ch06_names import uses_forbidden
from ddp_lab.course.grading.checks.probes import _int_or_kind
from ddp_lab.course.grading.learner import refuse
from ddp_lab.i18n import N_, _t, lookup

FORBIDDEN = {
    "06.indices": {
        "DistributedSampler",
        "ResumableDistributedSampler",  # chapter 11's sampler: torch's indices at start=0
        "pad_or_trim",
        "padded_indices",
        "assignment_grid",
        "num_samples_for",
    },
    "06.accuracy": {"gather_in_index_order", "gather_by_index", "all_reduce_accuracy"},
}
MESSAGES = {
    "case_divisible_no_shuffle": N_("divisible, shuffle=False"),
    "case_padding_no_shuffle": N_("padding, shuffle=False"),
    "case_padding_shuffled": N_("padding, shuffled"),
    "case_short_dataset": N_("dataset_len < num_replicas"),
    "case_padding_longer": N_("padding larger than the dataset"),
    "case_empty": N_("dataset_len = 0"),
    "case_drop_last_divisible": N_("drop_last, divisible"),
    "case_drop_last_not_divisible": N_("drop_last, not divisible"),
    "case_drop_last_short": N_("drop_last, dataset_len < num_replicas"),
    "case_epoch_1": N_("epoch 1 (set_epoch)"),
    "case_later_epoch": N_("later epoch"),
    "case_other_seed": N_("other seed, drop_last, later epoch"),
    "case_one_replica": N_("one replica"),
}


def probe_forbidden(rank: int, objects: tuple, names: list[str]) -> str:
    """In the learner's rank: the first of ``names`` their function's code refers to."""
    (fn,) = objects
    return uses_forbidden(fn, set(names))


def _refused_for_indices() -> dict[str, Any]:
    from ddp_lab.tools.resume import ResumableDistributedSampler  # chapter 11's, not hidden

    # With start=0 chapter 11's sampler deals out torch's very indices; its own methods
    # (``_order``, ``__iter__``) would serve an instance made without torch's refused __init__.
    resumable = {"ddp_lab.tools.resume.ResumableDistributedSampler": ResumableDistributedSampler}
    try:
        from ddp_lab import sampler
    except ImportError:  # a grading rank: the module is hidden there (course.grading.rankhost)
        return {"DistributedSampler": DistributedSampler, **resumable}

    return {
        "DistributedSampler": DistributedSampler,
        **resumable,
        "ddp_lab.sampler.DistributedSampler": sampler.DistributedSampler,
        "ddp_lab.sampler.pad_or_trim": sampler.pad_or_trim,
        "ddp_lab.sampler.permutation": sampler.permutation,
        "ddp_lab.sampler.assignment_grid": sampler.assignment_grid,
        "ddp_lab.sampler.num_samples_for": sampler.num_samples_for,
    }


def _refuses_indices() -> tuple[dict[str, Any], str]:
    return _refused_for_indices(), "torch.randperm, torch.Generator"


def _refuses_accuracy() -> tuple[dict[str, Any], str]:
    return _refused_for_accuracy(), "dist.all_gather / dist.all_reduce"


def _refused_for_accuracy() -> dict[str, Any]:
    try:
        from ddp_lab.labs import evaluation
    except ImportError:  # a grading rank: the module is hidden there (course.grading.rankhost)
        return {}

    return {
        "ddp_lab.labs.evaluation.gather_in_index_order": evaluation.gather_in_index_order,
        "ddp_lab.labs.evaluation.gather_by_index": evaluation.gather_by_index,
        "ddp_lab.labs.evaluation.all_reduce_accuracy": evaluation.all_reduce_accuracy,
    }


# A graded rank enters these before it loads the learner's objects and keeps them for its life
# (``learner.refusing``): code run while the objects load (a ``__reduce__``) or by the first
# probe would otherwise meet no refusal, and could keep a fresh copy of torch's sampler for the
# calls below, whose own ``refuse`` changes only the copy already imported. ``probe_forbidden``
# comes first in the ranks of both exercises; what it refuses (torch's sampler) neither needs.
probe_forbidden.refuses = _refuses_indices  # type: ignore[attr-defined]


def _check_forbidden(grade_id: str, learner: Any) -> None:
    got = learner.ranks(probe_forbidden, [sorted(FORBIDDEN[grade_id])], timeout=30)
    name = got[0] if type(got) is list and len(got) == 1 else got
    if name:
        shown = name if type(name) is str else type(name).__name__
        raise fail(_t("write it yourself: your function calls {name}", name=shown[:60]), "-")


def _kind(got: object) -> str:
    if isinstance(got, dict) and type(got.get("kind")) is str:
        return got["kind"][:40]
    return type(got).__name__


def _accuracy_mistake(
    got: float, truth: float, n: int, replicas: int, in_rank_order: list[float]
) -> str:
    """The verdict on a wrong accuracy; a hint when ``got`` is what the padded results give
    (their mean, their sum over ``n``, or the first ``n`` in rank order: on some cases two of
    these agree, so one hint names both mistakes)."""
    fields = {"expected": round(truth, 6), "got": round(got, 6), "n": n, "replicas": replicas}
    total = len(in_rank_order)
    padded = (
        sum(in_rank_order) / total,  # all_gather + cat + mean
        sum(in_rank_order) / n,  # ... divided by dataset_len
        sum(in_rank_order[:n]) / n,  # ... trimmed to dataset_len in rank order
    )
    if total > n and any(abs(got - value) <= 1e-6 for value in padded):
        return _t(
            "expected accuracy {expected}, got {got}: the {total} gathered results include "
            "the padding's duplicates, and rank r's j-th result is sample j * {replicas} + r, "
            "so neither all of them nor the first {n} in rank order are the {n} samples: "
            "count each sample once",
            total=total,
            **fields,
        )
    return _t("expected accuracy {expected}, got {got}", **fields)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


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
    """Hidden cases of 06.indices: (label key, keyword arguments without rank)."""

    def case(key: str, n: int, replicas: int, **kw: object) -> tuple[str, dict]:
        args = dict(
            dataset_len=n, num_replicas=replicas, epoch=0, seed=0, shuffle=True, drop_last=False
        )
        args.update(kw)
        return key, args

    r = rng.randint(2, 4)
    return [
        case("divisible_no_shuffle", r * rng.randint(2, 5), r, shuffle=False),
        case(
            "padding_no_shuffle",
            r * rng.randint(2, 5) + rng.randint(1, r - 1),
            r,
            shuffle=False,
        ),
        case(
            "padding_shuffled",
            rng.randint(11, 30) * 4 + rng.randint(2, 3),
            4,
            seed=rng.randint(1, 99),
        ),
        case(
            "short_dataset",
            rng.randint(2, 3),
            rng.randint(5, 8),
            shuffle=rng.random() < 0.5,
        ),
        case("padding_longer", 1, rng.randint(3, 6), seed=rng.randint(0, 9)),
        case("empty", 0, rng.randint(2, 4), drop_last=rng.random() < 0.5),
        case(
            "drop_last_divisible",
            3 * rng.randint(3, 9),
            3,
            drop_last=True,
            seed=rng.randint(0, 99),
        ),
        case(
            "drop_last_not_divisible",
            4 * rng.randint(3, 9) + rng.randint(1, 3),
            4,
            drop_last=True,
            seed=rng.randint(0, 99),
        ),
        case("drop_last_short", rng.randint(1, 3), 4, drop_last=True),
        case("epoch_1", rng.randint(12, 40), r, epoch=1, seed=rng.randint(0, 99)),
        case(
            "later_epoch",
            rng.randint(12, 40),
            3,
            epoch=rng.randint(2, 9),
            seed=rng.randint(100, 10**6),
        ),
        case(
            "other_seed",
            rng.randint(20, 60),
            5,
            epoch=rng.randint(2, 9),
            seed=rng.randint(10, 10**4),
            drop_last=True,
        ),
        case("one_replica", rng.randint(5, 20), 1, seed=rng.randint(0, 99)),
    ]


def probe_indices(rank: int, objects: tuple, args: dict) -> Any:
    """In the learner's rank (one, holding this case's arguments only): their indices for
    every rank of one case, as data."""
    (distributed_indices,) = objects
    out = []
    for rank in range(args["num_replicas"]):
        with refuse(_refused_for_indices(), allowed="torch.randperm, torch.Generator"):
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
        if isinstance(got, (list, tuple)):
            out.append([_int_or_kind(x) for x in got])
        else:
            out.append({"kind": type(got).__name__})
    return out


probe_indices.refuses = _refuses_indices  # type: ignore[attr-defined]


@checker("06.indices", points=4)
def check_indices(rng: random.Random, learner: Any) -> Iterator[object]:
    cases = index_cases(rng)
    yield len(cases)
    _check_forbidden("06.indices", learner)
    for key, args in cases:
        label = running(
            _t(
                "{what}: dataset_len={n}, num_replicas={replicas}",
                what=lookup(MESSAGES, f"case_{key}"),
                n=args["dataset_len"],
                replicas=args["num_replicas"],
            )
        )
        got = learner.ranks(probe_indices, [args], timeout=60)
        results = got[0] if type(got) is list and len(got) == 1 else got
        if type(results) is not list or len(results) != args["num_replicas"]:
            got = len(results) if type(results) is list else _kind(results)
            raise fail(
                _t(
                    "the learner's process answered for {got} ranks instead of {expected}",
                    got=got,
                    expected=args["num_replicas"],
                ),
                label,
            )
        for rank, got in enumerate(results):
            expected = torch_indices(
                args["dataset_len"],
                args["num_replicas"],
                rank,
                args["epoch"],
                args["seed"],
                args["shuffle"],
                args["drop_last"],
            )
            where = f"{label}, rank={rank}"
            if type(got) is not list:
                raise fail(_t("return a list of ints, not {kind}", kind=_kind(got)), where)
            bad = next((x for x in got if type(x) not in (int, bool, float)), None)
            if bad is not None:
                raise fail(
                    _t("return a list of ints, not {kind}", kind=f"list ({_kind(bad)})"), where
                )
            if got != expected:
                raise fail(
                    _t(
                        "expected {expected}, got {got}", expected=_short(expected), got=_short(got)
                    ),
                    where,
                )
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


def probe_accuracy(rank: int, objects: tuple, datasets: list[tuple[int, list]]) -> Any:
    """On each of the learner's ranks: their accuracy for each dataset, from this rank's
    padded shard (``datasets``: per dataset, its length and this rank's shard, the only one
    it receives)."""
    (gathered_accuracy,) = objects
    out: list[Any] = []
    for n, shard in datasets:
        with refuse(_refused_for_accuracy(), allowed="dist.all_gather / dist.all_reduce"):
            got = gathered_accuracy(torch.tensor(shard), n)
        if isinstance(got, (int, float, torch.Tensor)):
            got = float(got)
        out.append(got if type(got) is float else {"kind": type(got).__name__})
    return out


probe_accuracy.refuses = _refuses_accuracy  # type: ignore[attr-defined]


@checker("06.accuracy", points=3)
def check_accuracy(rng: random.Random, learner: Any) -> Iterator[object]:
    plan = accuracy_cases(rng)
    yield sum(len(d) for _, d in plan)
    _check_forbidden("06.accuracy", learner)
    for replicas, datasets in plan:
        shards = [  # the padded shards that torch's sampler gives each rank
            (
                n,
                [
                    [correct[i] for i in DistributedSampler(range(n), replicas, r, shuffle=False)]
                    for r in range(replicas)
                ],
            )
            for n, correct in datasets
        ]
        inputs = [[(n, per_rank[r]) for n, per_rank in shards] for r in range(replicas)]
        running(f"world_size={replicas}")  # one run covers several datasets
        results = learner.ranks(probe_accuracy, inputs, timeout=60)
        for k, (n, correct) in enumerate(datasets):
            label = f"world_size={replicas}, dataset_len={n}"
            truth = sum(correct) / n
            in_rank_order = [x for shard in shards[k][1] for x in shard]  # all_gather + cat
            if type(results) is not list or len(results) != replicas:
                got = len(results) if type(results) is list else _kind(results)
                raise fail(
                    _t(
                        "the learner's process answered for {got} ranks instead of {expected}",
                        got=got,
                        expected=replicas,
                    ),
                    label,
                )
            for rank, per_rank in enumerate(results):
                got = per_rank[k] if type(per_rank) is list and len(per_rank) > k else per_rank
                where = f"{label}, rank {rank}"
                if type(got) is not float:
                    raise fail(
                        _t("return the accuracy as a float, not {kind}", kind=_kind(got)), where
                    )
                if not abs(got - truth) <= 1e-6:
                    raise fail(_accuracy_mistake(got, truth, n, replicas, in_rank_order), where)
            yield label
