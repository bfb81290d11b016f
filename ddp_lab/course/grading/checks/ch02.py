"""Checker of chapter 02's exercise: rank, local rank, node and GPU of every process.

The learner writes ``place(nproc_per_node, cuda_visible_devices, gpus_per_node)`` returning
one dict per process in global rank order. The ranks are checked against a real torchrun
launch on localhost (two simulated nodes, c10d rendezvous); the GPUs against CUDA's rule
for ``CUDA_VISIBLE_DEVICES`` (``ddp_lab.tools.ranks.visible_gpus``).

The probe (``probes.probe_place``) calls the learner's function in a rank of its own that
receives one launch only (``learner.ranks``; this module and ``ddp_lab.tools.ranks``, which compute
the answer, are hidden there) and returns its rows as data; torchrun and the model run, and the comparison happens, in the checker.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from ddp_lab.course.grading import checker, fail, running
from ddp_lab.course.grading.checks.probes import KEYS, one, probe_place
from ddp_lab.i18n import N_, _t, lookup
from ddp_lab.tools import ranks

MESSAGES = {
    "not_list": N_("expected a list of {count} dicts (one per process), got {got}"),
    "not_dict": N_("expected dicts, got {kind}"),
    "value": N_("process with rank {rank}: {key} should be {expected}, got {got}"),
    "case_torchrun": N_("torchrun, 2 nodes"),
    "case_hidden": N_("3 nodes, GPUs hidden"),
    "case_invalid": N_("invalid entry"),
    "case_too_few": N_("too few GPUs"),
}


def _kind(got: object) -> str:
    if isinstance(got, dict) and type(got.get("kind")) is str:
        return got["kind"][:40]
    return type(got).__name__


def _shown(value: object) -> str:
    if isinstance(value, dict) and set(value) == {"kind"}:
        return f"<{_kind(value)}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _compare(got: object, want: list[dict], case: str) -> None:
    if type(got) is not list or len(got) != len(want):
        n = len(got) if type(got) is list else _kind(got)
        raise fail(
            _t(
                "expected a list of {count} dicts (one per process), got {got}",
                count=len(want),
                got=n,
            ),
            case,
        )
    for g, w in zip(got, want, strict=True):
        if type(g) is not dict or set(g) - set(KEYS):
            raise fail(_t("expected dicts, got {kind}", kind=_kind(g)), case)
        for k in KEYS:
            have = g.get(k)  # plain data: no __eq__ of the learner's runs here
            if have != w[k]:
                raise fail(
                    _t(
                        "process with rank {rank}: {key} should be {expected}, got {got}",
                        rank=w["rank"],
                        key=k,
                        expected=repr(w[k]),
                        got=_shown(have),
                    ),
                    case,
                )


def _as_dicts(procs: list[ranks.Proc]) -> list[dict]:
    return [{k: getattr(p, k) for k in KEYS} for p in procs]


@checker("02.place", points=3)
def check_place(rng: random.Random, learner: Any) -> Iterator[object]:
    yield 4
    # Case 1: the oracle is torchrun itself (2 simulated nodes of different sizes).
    counts = rng.choice([[2, 3], [3, 2], [1, 3]])
    cvds = [rng.choice(["2,3,1", "1,0,3"]), None]
    seen = ranks.torchrun_assignment(counts, cvds)
    by_node = sorted(
        {(r["GROUP_RANK"], r["LOCAL_WORLD_SIZE"], r["CUDA_VISIBLE_DEVICES"]) for r in seen}
    )
    order_counts = [n for _, n, _ in by_node]
    order_cvds = [c for _, _, c in by_node]
    want = _as_dicts(ranks.assign(order_counts, cuda_visible_devices=order_cvds, gpus_per_node=4))
    for w, r in zip(want, seen, strict=True):  # torchrun's numbers replace the model's
        w.update(
            rank=r["RANK"],
            local_rank=r["LOCAL_RANK"],
            node_rank=r["GROUP_RANK"],
            world_size=r["WORLD_SIZE"],
        )
    case = running(_t("torchrun, 2 nodes"))
    got = one(learner.ranks(probe_place, [[order_counts, order_cvds, 4]], timeout=30))
    _compare(got, want, case)
    yield case
    # Cases 2-4: CUDA_VISIBLE_DEVICES edge cases on bigger launches. Each case holds both of
    # its forms, on nodes of their own, so that no seed lets a wrong rule through: "" and
    # "-1" both hide every GPU (not "" as unset); the list stops at an invalid entry in the
    # middle (not skipping it), on nodes with more processes than the entries before it.
    for key, forms, fewest in [
        ("case_hidden", ["", "-1", None], 2),
        ("case_invalid", ["1,3,8,2", "5,9,7"], 3),
        ("case_too_few", ["6,7", "3"], 2),
    ]:
        case = running(lookup(MESSAGES, key))
        cvds = rng.sample(forms, len(forms))
        counts = [rng.randint(fewest, 4) for _ in cvds]
        want = _as_dicts(ranks.assign(counts, cuda_visible_devices=cvds, gpus_per_node=8))
        _compare(one(learner.ranks(probe_place, [[counts, cvds, 8]], timeout=30)), want, case)
        yield case
