"""What chapters 03, 10 and 12 say about one GPU, checked on CPU with torch's device queries
faked, and on a real GPU under ``-m gpu`` (issue 40 items 2 and 3)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import ddp_lab as dl


@pytest.mark.parametrize(("gpus", "fails_in"), [(0, "step"), (1, "init"), (2, "step")])
def test_data_parallel_of_an_optimizer_fails_where_chapter_03_says(
    monkeypatch: pytest.MonkeyPatch, gpus: int, fails_in: str
) -> None:
    """torch/nn/parallel/data_parallel.py: one device -> ``self.module.to(...)`` at once."""
    import importlib

    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")

    if gpus:
        monkeypatch.setattr(data_parallel, "_get_available_device_type", lambda: "cuda")
        monkeypatch.setattr(data_parallel, "_get_all_device_indices", lambda: list(range(gpus)))
        monkeypatch.setattr(data_parallel, "_check_balance", lambda ids: None)
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    where = "init"
    with pytest.raises(AttributeError) as err:
        wrapped = nn.DataParallel(optimizer)
        where = "step"
        wrapped.step()
    assert where == fails_in
    assert ("'to'" if fails_in == "init" else "'step'") in str(err.value)


def test_gpus_hidden_hides_them_from_the_ranks_only() -> None:
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    with dl.gpus_hidden():
        seen = dl.spawn(_visible, nprocs=1)
    assert seen == [("", False)]
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


def _visible(rank: int) -> tuple[str | None, bool]:
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()


def test_powersgd_with_a_cpu_model_fails_where_cuda_is_available() -> None:
    """The torch behaviour chapter 10 works around: decompress synchronizes the bucket's
    device whenever CUDA is available, a CPU one too (powerSGD_hook.py)."""
    with pytest.raises(dl.DistributedError) as err:
        dl.spawn(_powersgd_step, args=(True,), nprocs=1, backend="gloo", quiet=True)
    # On a GPU machine: "Expected a cuda device, but got: cpu"; a CPU build of torch
    # cannot synchronize at all. Either way, the call that fails is this one:
    assert "synchronize" in str(err.value) and "decompress" in str(err.value), err.value
    assert dl.spawn(_powersgd_step, args=(False,), nprocs=1, backend="gloo") == [True]


def _powersgd_step(rank: int, cuda_available: bool) -> bool:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.is_available = lambda: cuda_available  # the rank's own torch, faked
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4)))
    state = ps.PowerSGDState(process_group=dist.group.WORLD, matrix_approximation_rank=1,
                             start_powerSGD_iter=2)  # fmt: skip
    model.register_comm_hook(state, ps.powerSGD_hook)
    for _ in range(3):  # iterations 0 and 1 are plain all-reduces
        model(torch.randn(8, 16)).sum().backward()
    return True


@pytest.mark.gpu
def test_gpu_chapter_10s_hook_comparison_runs_with_the_gpus_hidden() -> None:
    from ddp_lab.comm_hooks import compare_hooks

    with dl.gpus_hidden():
        rows = dl.spawn(compare_hooks, args=(None, 6), nprocs=2, backend="gloo")[0]
    assert {r["hook"] for r in rows} and all(r["bytes_per_step"] > 0 for r in rows)
    assert torch.cuda.is_available()  # the notebook's own view is unchanged


def _chapter_12_on_cpu(rank: int) -> dict:
    from ddp_lab.pipeline import torch_pipeline_runs
    from ddp_lab.tensor_parallel import torch_tp_and_2d

    out = {"tp": torch_tp_and_2d(rank), "pp": torch_pipeline_runs(rank)}
    out["cuda_initialized"] = torch.cuda.is_initialized()
    return out


@pytest.mark.gpu
def test_gpu_chapter_12s_meshes_and_stages_compute_on_cpu_with_one_gpu() -> None:
    """Chapter 12, section 2: its "cpu" meshes, ``fully_shard`` given its mesh and CPU
    pipeline stages run on 4 ranks where CUDA is available, and no rank starts CUDA (a
    "cuda" mesh would set cuda:LOCAL_RANK: ranks 1-3 have no GPU on a one-GPU machine)."""
    res = dl.spawn(_chapter_12_on_cpu, nprocs=4, backend="gloo")
    assert not any(r["cuda_initialized"] for r in res)
    assert max(r["tp"]["2d"]["grad_diff"] for r in res) < 1e-6
    assert all(r["pp"]["1f1b"]["max_grad_diff"] < 1e-12 for r in res)
    assert torch.cuda.is_available()


def _lesson_cell(notebook: str, needle: str) -> str:
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).parents[1] / notebook).read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells if needle in "".join(c["source"])]
    return source


@pytest.mark.parametrize("has_it", [True, False])
def test_chapter_04s_all_to_all_cell_skips_it_on_a_torch_without_gloo_all_to_all(
    capfd: pytest.CaptureFixture[str], has_it: bool
) -> None:
    """Issue 40 item 5: torch 2.11's gloo has no all_to_all; the cell's barrier half still runs."""
    import time

    import torch.distributed as dist

    from ddp_lab.runtime.magic import run_cell
    from ddp_lab.tools.doctor import torch_features

    if has_it and not torch_features()["gloo all_to_all"]:
        pytest.skip(f"this torch ({torch.__version__}) has no gloo all_to_all to run")
    source = _lesson_cell("notebooks/en/04_collectives.ipynb", "dist.all_to_all(received")
    assert source.startswith("%%ddp -n 4\n")
    user_ns = {"torch": torch, "dist": dist, "time": time, "gloo_all_to_all": has_it}
    run_cell(source.split("\n", 1)[1], user_ns, nprocs=4, backend="gloo")
    lines = [ln for ln in capfd.readouterr().out.splitlines() if "all_to_all:" in ln]
    assert len(lines) == 4
    if has_it:  # piece i of every rank went to rank i
        assert "all_to_all: [10.0, 20.0, 30.0, 40.0]" in lines[0]
    else:
        assert all("all_to_all: skipped | waited" in ln for ln in lines)
