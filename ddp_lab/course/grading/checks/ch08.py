"""Checker of chapter 08's exercise: fix a buggy DDP training function.

The learner's ``fit(model, dataset, epochs, batch_size, lr, checkpoint_path)`` runs on every
rank of a gloo group, each rank in a sandbox of its own (``learner.ranks`` with ``share``:
the checkpoint's folder is one folder that rank 0 may write and the others only read).
``probe_fit`` reports each rank's own account: the order in which it read samples, its
writes into the checkpoint's folder (``ch08_writes._writes``), when rank 0's writes could
have ended at the earliest and when its ``fit`` returned, rank 0's files and the
checkpoint's tensors (loaded with ``weights_only=True``), the parameters and the logged
losses. The grader adds its own evidence: the folder's listing once the ranks are dead and
when each rank's reply reached it (``ch08_writes.judge_writes``). The checker judges here,
against torch's ``DistributedSampler`` with ``set_epoch`` and a correct run of torch's DDP
from the same initial model (on ranks of the grader's own): one file, a plain model's
``state_dict``, written by rank 0 only; no rank returns before rank 0's write has ended (the
barrier after the save); parameters identical on every rank and equal to the oracle's; the
same mean loss on every rank; the saved model as accurate. The oracle's ``reference_fit``
is in ``ch08_oracle``, hidden wherever learner code runs (``oracle`` here imports it when
a grader's rank calls it).
"""

from __future__ import annotations

import errno
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from ddp_lab.course.grading import checker, fail, running, wrong_form
from ddp_lab.course.grading.checks.ch08_writes import READ_ONLY, _writes, judge_writes, outside
from ddp_lab.i18n import _t


class RecordingDataset(Dataset):
    """A data set that remembers which indices were read, in order (a probe, not a copy)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads.append(int(i))
        return self.x[i], self.y[i]


def make_case(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
    """Hidden data (Gaussian blobs) and a hidden MLP, the same on every rank."""
    gen = torch.Generator().manual_seed(case["seed"])
    centers = 2.0 * torch.randn(case["classes"], case["features"], generator=gen)
    y = torch.randint(0, case["classes"], (case["n"],), generator=gen)
    x = centers[y] + torch.randn(case["n"], case["features"], generator=gen)
    torch.manual_seed(case["seed"])
    model = nn.Sequential(
        nn.Linear(case["features"], case["hidden"]),
        nn.ReLU(),
        nn.Linear(case["hidden"], case["classes"]),
    )
    return x, y, model


def _floats(values: Any) -> Any:
    """The learner's losses as plain floats (None stays None); else what they were."""
    if values is None:
        return None
    try:
        items = list(values)
    except Exception:  # noqa: BLE001  # not a sequence
        return {"kind": type(values).__name__}
    out = []
    for v in items:
        try:
            out.append(float(v))
        except Exception:  # noqa: BLE001  # not a number
            return {"kind": f"{type(values).__name__}[{type(v).__name__}]"}
    return out


def _checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's tensors by name, or the type of what it held / why it did not load."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001  # a pickled module, a missing file
        return {"error": type(exc).__name__}
    if not isinstance(state, dict):
        return {"error": type(state).__name__}
    return {
        "state": {
            str(k): v.detach().clone() if isinstance(v, torch.Tensor) else type(v).__name__
            for k, v in state.items()
        }
    }


def probe_fit(rank: int, objects: tuple, own: dict[str, Any]) -> dict[str, Any]:
    """In the learner's rank: their ``fit`` on the hidden case, and what it did (its own
    account). It answers as soon as ``fit`` returns: when the answer reaches the grader is
    the grader's evidence that the rank waited (``ch08_writes.judge_writes``)."""
    (fit,) = objects
    case = own["case"]
    where = Path(tempfile.gettempdir()) / str(own["folder"])
    where.mkdir(parents=True, exist_ok=True)
    path = where / "model.pt"
    x, y, model = make_case(case)
    dataset = RecordingDataset(x, y)
    with _writes(where, slow=rank == 0) as writes:
        try:
            losses = fit(model, dataset, case["epochs"], case["batch_size"], case["lr"], str(path))
        except Exception as exc:
            # Graded, the folder is read-only but to rank 0: a write of another rank fails.
            read_only = getattr(exc, "errno", None) == errno.EROFS
            if rank > 0 and (writes["count"] or read_only or "Read-only file" in str(exc)):
                raise PermissionError(_t(READ_ONLY, rank=rank)) from None
            raise
        returned_at = time.monotonic()  # one clock for every rank: they share the machine
    result: dict[str, Any] = {
        "reads": list(dataset.reads),
        "saves": writes["count"],
        "returned_at": returned_at,
        "losses": _floats(losses),
        "params": [p.detach().clone() for p in model.parameters()],
    }
    if rank == 0:
        result["saved_at"] = writes["until"]
        result["files"] = sorted(p.name for p in where.iterdir())
        result["checkpoint"] = _checkpoint(path)
    return result


def _close(got: list[float] | None, expected: list[float]) -> bool:
    return (
        got is not None
        and len(got) == len(expected)
        and all(abs(g - e) <= 1e-4 * max(1.0, abs(e)) for g, e in zip(got, expected, strict=True))
    )


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def _kind(value: Any) -> str:
    """A short, language-neutral description of what came back."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def _plain(case: dict[str, Any]) -> nn.Module:
    """The hidden model, built here without touching this process's random state."""
    with torch.random.fork_rng(devices=[]):
        return make_case(case)[2]


def _validate(results: Any, world: int, case: dict[str, Any], label: str) -> list[dict]:
    """The probe's results, checked to be of the form it returns (anything else fails)."""

    def bad(rank: object, field: str, value: Any) -> Exception:
        return wrong_form(rank, field, _kind(value), label)

    if not isinstance(results, list) or len(results) != world:
        raise bad("-", "ranks", results)
    shapes = [p.shape for p in _plain(case).parameters()]
    saved_at = results[0].get("saved_at") if isinstance(results[0], dict) else None
    if saved_at is not None and type(saved_at) is not float:
        raise bad(0, "saved_at", saved_at)
    for rank, r in enumerate(results):
        if not isinstance(r, dict):
            raise bad(rank, "result", r)
        reads, saves, losses, params = (r.get(k) for k in ("reads", "saves", "losses", "params"))
        if not isinstance(reads, list) or not all(type(i) is int for i in reads):
            raise bad(rank, "reads", reads)
        if type(saves) is not int:
            raise bad(rank, "saves", saves)
        if type(r.get("returned_at")) is not float:
            raise bad(rank, "returned_at", r.get("returned_at"))
        if isinstance(losses, dict):
            raise fail(
                _t(
                    "fit returned {kind}: return a list with one loss (a float) per epoch",
                    kind=str(losses.get("kind", "?"))[:40],
                ),
                label,
            )
        if losses is not None and (
            not isinstance(losses, list) or not all(type(v) is float for v in losses)
        ):
            raise bad(rank, "losses", losses)
        if (
            not isinstance(params, list)
            or len(params) != len(shapes)
            or not all(
                isinstance(p, torch.Tensor) and p.is_floating_point() and p.shape == s
                for p, s in zip(params, shapes, strict=True)
            )
        ):
            raise bad(rank, "params", params)
    files, ckpt = results[0].get("files"), results[0].get("checkpoint")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise bad(0, "files", files)
    if not isinstance(ckpt, dict) or not (
        isinstance(ckpt.get("error"), str) or isinstance(ckpt.get("state"), dict)
    ):
        raise bad(0, "checkpoint", ckpt)
    return results


def verify(
    results: Any,
    case: dict[str, Any],
    reference: dict[str, Any],
    world: int,
    seen: dict[str, Any] | None = None,
) -> None:
    """Raise CaseFailed (via ``fail``) at the first behaviour that differs from a correct run.

    ``results``: what ``probe_fit`` sent back from each of the ``world`` ranks;
    ``reference``: the oracle's rank 0 (``_oracle``); ``seen``: the grader's own evidence
    (``ch08_writes.judge_writes``), or None where there is none.
    """
    label = f"world_size={world}, epochs={case['epochs']}"
    results = _validate(results, world, case, label)
    expected_reads = [
        [_shard(case["n"], world, rank, epoch) for epoch in range(case["epochs"])]
        for rank in range(world)
    ]
    per_epoch = len(expected_reads[0][0])
    for rank, r in enumerate(results):
        reads = [r["reads"][e * per_epoch : (e + 1) * per_epoch] for e in range(case["epochs"])]
        if reads != expected_reads[rank]:
            same = len(reads) > 1 and reads[0] == reads[1] and len(reads[0]) == per_epoch
            raise fail(
                (
                    _t(
                        "rank {rank} read the samples in the same order in epoch 1 and epoch 2: "
                        "call sampler.set_epoch(epoch) at the start of every epoch",
                        rank=rank,
                    )
                    if same
                    else _t(
                        "rank {rank} did not read its DistributedSampler shard "
                        "(DistributedSampler(dataset) with set_epoch(epoch), batches from "
                        "DataLoader(dataset, batch_size, sampler=...))",
                        rank=rank,
                    )
                ),
                label,
            )
    judge_writes(results, label, seen)
    ckpt = results[0]["checkpoint"]
    state = ckpt.get("state")
    if state is None:
        raise fail(
            _t(
                "the checkpoint is not a plain state_dict ({error}): save "
                "ddp_model.module.state_dict(), not the model object",
                error=str(ckpt["error"])[:60],
            ),
            label,
        )
    for value in state.values():
        if not isinstance(value, torch.Tensor):
            raise fail(
                _t(
                    "the checkpoint is not a plain state_dict ({error}): save "
                    "ddp_model.module.state_dict(), not the model object",
                    error=str(value)[:60],
                ),
                label,
            )
    plain = _plain(case)
    try:
        plain.load_state_dict(state)
    except RuntimeError:
        raise fail(
            _t(
                "the checkpoint does not load into a plain model (keys like {key!r}): "
                "you saved the DDP wrapper; save ddp_model.module.state_dict()",
                key=next(iter(state), ""),
            ),
            label,
        ) from None
    for rank, r in enumerate(results[1:], start=1):
        diff = _max_diff(results[0]["params"], r["params"])
        if not diff == 0:
            raise fail(
                _t(
                    "the parameters differ between rank 0 and rank {rank} after training "
                    "(max difference {diff:.2e}): wrap the model in DDP so gradients are "
                    "averaged",
                    rank=rank,
                    diff=diff,
                ),
                label,
            )
    ref_params = reference["params"]
    diff = _max_diff(results[0]["params"], ref_params)
    diff = max(diff, _max_diff(list(plain.parameters()), ref_params))
    if not diff <= 1e-5:
        raise fail(
            _t(
                "the parameters differ from a correct DDP run (max difference "
                "{diff:.2e}): create the optimizer once, before the loop (SGD with "
                "momentum=0.9 keeps state), and call zero_grad() every step",
                diff=diff,
            ),
            label,
        )
    for rank, r in enumerate(results[1:], start=1):
        if r["losses"] != results[0]["losses"]:
            raise fail(
                _t(
                    "the ranks returned different losses ({a} on rank 0, {b} on rank "
                    "{rank}): average each epoch's loss over all ranks with dist.all_reduce",
                    a=results[0]["losses"],
                    b=r["losses"],
                    rank=rank,
                ),
                label,
            )
    got, expected, by_sample = results[0]["losses"], reference["by_batch"], reference["by_sample"]
    if not (_close(got, expected) or _close(got, by_sample)):
        short = [round(v, 4) for v in got] if got else got
        raise fail(
            _t(
                "the logged losses {got} are not the mean over all ranks {expected}",
                got=short,
                expected=[round(v, 4) for v in expected],
            ),
            label,
        )
    with torch.random.fork_rng(devices=[]):
        x, y, ref_model = make_case(case)
    with torch.no_grad():
        acc = (plain(x).argmax(1) == y).float().mean().item()
        for p, q in zip(ref_model.parameters(), ref_params, strict=True):
            p.copy_(q)
        ref_acc = (ref_model(x).argmax(1) == y).float().mean().item()
    if acc < ref_acc - 1e-6:
        raise fail(
            _t(
                "the saved model reaches {got:.1%} accuracy, a correct run {expected:.1%}",
                got=acc,
                expected=ref_acc,
            ),
            label,
        )


def oracle(rank: int, case: dict[str, Any]) -> dict[str, Any]:
    """In the grader's ranks: torch's DDP used correctly from the same model and data.

    ``reference_fit`` is imported here, not at this module's import: its module is hidden
    from the learner's processes (the runner imports this module for the probe), where this
    function only raises ImportError."""
    from ddp_lab.course.grading.checks.ch08_oracle import reference_fit

    x, y, model = make_case(case)
    by_batch, by_sample = reference_fit(
        model, RecordingDataset(x, y), case["epochs"], case["batch_size"], case["lr"]
    )
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "by_batch": by_batch,
        "by_sample": by_sample,
    }


def _shard(n: int, world: int, rank: int, epoch: int) -> list[int]:
    """The indices ``rank`` must read in ``epoch``: DistributedSampler with set_epoch."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank)
    sampler.set_epoch(epoch)
    return list(sampler)


@checker("08.fit", points=5)
def check_fit(rng: random.Random, learner: Any) -> Iterator[object]:
    from ddp_lab.runtime.launcher import spawn

    world_sizes = [2, rng.choice([2, 3])]
    yield len(world_sizes)
    for world_size in world_sizes:
        case = {
            "seed": rng.randrange(10**6),
            "n": rng.randint(40, 70),
            "features": rng.randint(3, 6),
            "classes": 3,
            "hidden": rng.choice([8, 16]),
            "epochs": 3,
            "batch_size": rng.choice([6, 8]),
            "lr": 0.05,
        }
        folder = f"ddp_lab_ch08_{uuid.uuid4().hex}"  # in the ranks' /tmp
        label = running(f"world_size={world_size}, epochs={case['epochs']}")
        own = [{"case": case, "folder": folder} for _ in range(world_size)]
        try:
            results = learner.ranks(probe_fit, own, timeout=120, share=folder)
        finally:  # without a sandbox the ranks wrote into this machine's /tmp
            shutil.rmtree(Path(tempfile.gettempdir()) / folder, ignore_errors=True)
        results = _validate(results, world_size, case, label)  # before the oracle's ranks
        seen = outside(learner, label)
        reference = spawn(
            oracle, args=(case,), nprocs=world_size, backend="gloo", quiet=True, timeout=120
        )[0]
        verify(results, case, reference, world_size, seen)
        yield f"world_size={world_size}"
