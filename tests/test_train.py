"""ddp_lab.tools.train and ddp_lab.tools.data: the training program, checked against torch itself.

Oracles: a single-process model on the same data (evaluation, loss logging), the real
DistributedSampler (padding), an uninterrupted run (resume), and torchrun (single node
and two agents with --nnodes=2 on localhost).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import private_tmp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler, TensorDataset

import ddp_lab as dl
from ddp_lab.runtime.launcher import free_port
from ddp_lab.tools import data, train

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR")
    }
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=private_tmp(), **extra)
    return env


# --- command line -------------------------------------------------------------------------


def test_help_lists_the_options():
    out = subprocess.run(
        [PY, "-m", "ddp_lab.tools.train", "--help"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert out.returncode == 0
    for option in ("--epochs", "--batch-size", "--checkpoint-dir", "--resume", "--backend"):
        assert option in out.stdout


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--epochs", "0"], "--epochs"),
        (["--lr", "-0.1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--batch-size", "0"], "--batch-size"),
        (["--resume"], "--checkpoint-dir"),
        (["--resume", "/nonexistent/ckpt.pt"], "/nonexistent/ckpt.pt"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        train.parse_args(argv)
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_checkpoint_dir_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SystemExit):
        train.parse_args(["--checkpoint-dir", str(f)])
    assert "not a folder" in capsys.readouterr().err


def test_bad_arguments_fail_before_any_rank_starts():
    with pytest.raises(ValueError, match="--epochs"):
        train.launch(["--epochs", "-1"], nprocs=2)


def test_cli_error_in_chinese():
    out = subprocess.run(
        [PY, "-m", "ddp_lab.tools.train", "--batch-size", "0"],
        capture_output=True,
        text=True,
        env=_env(DDP_LAB_LANG="zh"),
        timeout=120,
    )
    assert out.returncode == 2 and "必须是正数" in out.stderr


def test_scaled_lr():
    assert train.scaled_lr(0.05, 64, 32, "linear") == pytest.approx(0.1)
    assert train.scaled_lr(0.05, 128, 32, "sqrt") == pytest.approx(0.1)
    assert train.scaled_lr(0.05, 128, 32, "none") == 0.05


# --- evaluation without padding bias ------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40), world=st.integers(1, 7), shuffle=st.booleans(), seed=st.integers(0, 1000)
)
def test_unpadded_mean_equals_the_mean_over_the_data_set(n, world, shuffle, seed):
    values = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    dataset = TensorDataset(values)
    shards = [
        list(DistributedSampler(dataset, num_replicas=world, rank=r, shuffle=shuffle, seed=seed))
        for r in range(world)
    ]
    index = torch.tensor([i for s in shards for i in s])
    got = train.unpadded_mean(index, values[index])
    assert got == pytest.approx(values.mean().item(), rel=1e-12)


def _eval_case(rank: int, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    torch.manual_seed(3)
    model = train.SmallCNN()
    return train.evaluate(model, TensorDataset(images, labels), 5, torch.device("cpu"))


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_evaluate_equals_single_process(world):
    gen = torch.Generator().manual_seed(1)
    images, labels = (
        torch.rand(23, 1, 8, 8, generator=gen),
        torch.randint(0, 10, (23,), generator=gen),
    )
    torch.manual_seed(3)
    model = train.SmallCNN().eval()
    with torch.no_grad():
        out = model(images)
    expected_loss = F.cross_entropy(out, labels).item()
    expected_acc = (out.argmax(1) == labels).double().mean().item()
    results = dl.spawn(
        _eval_case, args=(images, labels), nprocs=world, backend="gloo", quiet=True, timeout=120
    )
    for loss, acc in results:  # 23 is not a multiple of 2 or 3: the sampler pads
        assert acc == pytest.approx(expected_acc, abs=1e-12)
        assert loss == pytest.approx(expected_loss, rel=1e-5)


def _mean_case(rank: int, chunks: list[torch.Tensor]) -> float:
    return train.mean_across_ranks(chunks[rank].sum().item(), len(chunks[rank]))


def test_logged_loss_is_the_mean_over_every_rank_sample():
    gen = torch.Generator().manual_seed(5)
    chunks = [torch.rand(k, generator=gen, dtype=torch.float64) for k in (7, 3, 5)]
    results = dl.spawn(_mean_case, args=(chunks,), nprocs=3, backend="gloo", quiet=True)
    assert results == pytest.approx([torch.cat(chunks).mean().item()] * 3, rel=1e-12)


# --- data prepared once -------------------------------------------------------------------


def _zero_first_case(rank: int, folder: str) -> bool:
    marker = Path(folder) / "ready"
    with data.zero_first(rank):
        if rank == 0:
            time.sleep(0.5)  # a slow "download": the others must still wait for it
            marker.write_text("ok")
        seen = marker.exists()
    return seen


def test_zero_first_makes_the_others_wait(tmp_path):
    assert dl.spawn(
        _zero_first_case, args=(str(tmp_path),), nprocs=3, backend="gloo", quiet=True
    ) == [True, True, True]


def _load_case(rank: int, folder: str) -> tuple[int, float]:
    train_set, test_set = data.load_digits_split(folder)
    return len(train_set) + len(test_set), train_set.tensors[0].sum().item()


def test_digits_prepared_once_and_identical_on_every_rank(tmp_path):
    results = dl.spawn(_load_case, args=(str(tmp_path),), nprocs=2, backend="gloo", quiet=True)
    from sklearn.datasets import load_digits

    expected = data.build_digits()
    assert results[0] == results[1]
    assert results[0][0] == len(load_digits().target) == 1797
    assert results[0][1] == pytest.approx(expected["x_train"].sum().item())
    assert [p.name for p in tmp_path.iterdir()] == [data.DIGITS_FILE]  # no temp files left


# --- full runs ----------------------------------------------------------------------------


def test_training_checkpoint_and_resume_equal_an_uninterrupted_run(tmp_path):
    # --deterministic: where each rank has a GPU (auto: nccl) cuDNN may pick other kernels.
    common = ["--threads", "1", "--quiet", "--deterministic", "--data-dir", str(tmp_path / "data")]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    straight = train.launch(
        [*common, "--epochs", "3", "--checkpoint-dir", a], nprocs=2, quiet=True, timeout=300
    )
    train.launch(
        [*common, "--epochs", "2", "--checkpoint-dir", b], nprocs=2, quiet=True, timeout=300
    )
    resumed = train.launch(
        [*common, "--epochs", "3", "--checkpoint-dir", b, "--resume"],
        nprocs=2,
        quiet=True,
        timeout=300,
    )
    # Parameters identical across ranks, and resume lands exactly where the straight run did.
    assert straight[0]["final_weights_sum"] == straight[1]["final_weights_sum"]
    assert resumed[0]["test_acc"] == straight[0]["test_acc"]
    sa = torch.load(Path(a) / "last.pt", weights_only=True)
    sb = torch.load(Path(b) / "last.pt", weights_only=True)
    assert sa["epoch"] == sb["epoch"] == 3
    for key, value in sa["model"].items():
        torch.testing.assert_close(sb["model"][key], value, rtol=1e-6, atol=1e-7)
    # The checkpoint is the plain model's (no "module." prefix) and scores what was logged.
    model = train.SmallCNN()
    model.load_state_dict(sa["model"])
    _, test_set = data.load_digits_split(tmp_path / "data")
    with torch.no_grad():
        acc = (model(test_set.tensors[0]).argmax(1) == test_set.tensors[1]).double().mean()
    assert acc.item() == pytest.approx(straight[0]["test_acc"][-1], abs=1e-12)


def _accuracy(output: str) -> float:
    found = re.findall(r"done: test accuracy ([0-9.]+)%", output)
    assert len(found) == 1, output  # rank 0 only reports
    return float(found[0])


def test_torchrun_single_node_reaches_95_percent(tmp_path):
    ckpt = tmp_path / "ckpt"
    cmd = [
        TORCHRUN,
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "ddp_lab.tools.train",
        "--checkpoint-dir",
        str(ckpt),
        "--data-dir",
        str(tmp_path / "data"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _accuracy(out.stdout) >= 95.0
    assert out.stdout.count("epoch 1/10 ") == 1  # one progress bar: rank 0's
    assert [p.name for p in ckpt.iterdir()] == ["last.pt"]


def test_torchrun_two_nodes_on_localhost(tmp_path):
    port = free_port()
    agents = []
    for node in (0, 1):
        cmd = [
            TORCHRUN,
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "ddp_lab.tools.train",
            "--epochs",
            "2",
            "--data-dir",
            str(tmp_path / f"data{node}"),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
        agents.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
            )
        )
    outs = [a.communicate(timeout=300) for a in agents]
    for agent, (_, err) in zip(agents, outs, strict=True):
        assert agent.returncode == 0, err[-3000:]
    assert "world size 2" in outs[0][0] and outs[1][0] == ""  # node 1 holds rank 1: silent
    assert _accuracy(outs[0][0]) > 50
    # Each node prepared its own data (its local rank 0 did), as on separate disks.
    assert (tmp_path / "data0" / data.DIGITS_FILE).exists()
    assert (tmp_path / "data1" / data.DIGITS_FILE).exists()
    assert torch.load(tmp_path / "ckpt" / "last.pt", weights_only=True)["epoch"] == 2


# --- the end of a launched worker -----------------------------------------------------------

_THREADS_AFTER_DESTROY = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
dist.init_process_group("gloo")
if sys.argv[1] == "ddp":
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    del model
dist.destroy_process_group()
import gc; gc.collect()
print(f"rank {os.environ['RANK']} threads {before} -> {threads()}", flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_destroy_process_group_leaves_the_gloo_threads_of_a_ddp_model():
    """Why train.py ends workers with os._exit: after DDP the group outlives destroy."""
    counts = {}
    for case in ("plain", "ddp"):
        cmd = [TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python",
               PY, "-c", _THREADS_AFTER_DESTROY, case]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        counts[case] = re.findall(r"threads (\d+) -> (\d+)", out.stdout)
        assert len(counts[case]) == 2, out.stdout
    assert all(before == after for before, after in counts["plain"])  # threads joined
    # With DDP they are not: if this fails, torch frees the group now (pytorch#107298 fixed),
    # and train.exit_without_finalizing may be replaced by a plain return.
    assert all(int(after) > int(before) for before, after in counts["ddp"]), counts


def test_a_launched_worker_exits_without_finalizing_and_keeps_its_output(tmp_path):
    code = (
        "import atexit, runpy\n"
        "atexit.register(lambda: print('FINALIZED', flush=True))\n"
        "runpy.run_module('ddp_lab.tools.train', run_name='__main__', alter_sys=True)\n"
    )
    cmd = [PY, "-c", code, "--epochs", "1", "--data-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^done: test accuracy", out.stdout, re.M), out.stdout  # flushed
    assert "FINALIZED" not in out.stdout  # no atexit, no finalization: os._exit
