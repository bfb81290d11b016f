"""cuda_compat: parsing real tool outputs and the driver table (chapter 01's checker: see
tests/course/checks/test_ch01.py)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ddp_lab.tools import cuda_compat as cc

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    "path", sorted((FIX / "nvidia-smi").glob("[0-9]*.txt")), ids=lambda p: p.name
)
def test_parse_nvidia_smi_fixtures(path: Path) -> None:
    # file names carry the truth: <driver>_cuda<version>_<gpus>.txt
    info = cc.parse_nvidia_smi(path.read_text())
    driver, rest = path.stem.split("_", 1)
    assert cc.fmt_driver(info.driver) == driver
    if rest.startswith("cuda"):
        assert cc.fmt(info.cuda) == rest[4:].split("_")[0]
    else:  # pre-410 drivers print no CUDA Version: it comes from the table
        assert info.cuda == (9, 2)
    count = int(path.stem.rsplit("x", 1)[1]) if path.stem[-2] == "x" else 1
    assert len(info.gpus) == count


@pytest.mark.parametrize("name", ["failed_no_driver.txt", "nvml_mismatch.txt"])
def test_parse_nvidia_smi_errors(name: str) -> None:
    info = cc.parse_nvidia_smi((FIX / "nvidia-smi" / name).read_text())
    assert info.driver is None and info.error
    assert cc.parse_nvidia_smi("") is None and cc.parse_nvidia_smi(None) is None


def test_parse_nvcc_fixtures() -> None:
    for path in (FIX / "nvcc").glob("*.txt"):
        got = cc.parse_nvcc(path.read_text())
        assert (got is None) if path.stem == "not_found" else cc.fmt(got) == path.stem


def test_parse_torch_cuda() -> None:
    assert cc.parse_torch_cuda("2.3.0+cu121") == (12, 1)
    assert cc.parse_torch_cuda("cu118") == (11, 8)
    assert cc.parse_torch_cuda("12.4") == (12, 4)
    assert cc.parse_torch_cuda("2.13.0+cpu") is None
    assert cc.parse_torch_cuda(torch.version.cuda) == (
        None if torch.version.cuda is None else cc.parse_version(torch.version.cuda)[:2]
    )


@given(st.lists(st.integers(0, 999), min_size=1, max_size=4))
def test_parse_version_roundtrip(parts: list[int]) -> None:
    assert cc.parse_version(".".join(map(str, parts))) == tuple(parts)


@pytest.mark.parametrize("bad", ["", "abc", "12..1", "1.2-rc"])
def test_parse_version_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="version"):
        cc.parse_version(bad)


def test_versions_compare_numerically_not_as_text() -> None:
    # "535.104.05" < "535.54.03" as strings; the driver is newer.
    assert cc.parse_version("535.104.05") > cc.parse_version("535.54.03")
    assert cc.max_cuda_for_driver("535.104.05") == (12, 2)


def test_cuda_11_0_minimum_driver_is_the_ga_release() -> None:
    # 11.0.2 GA needs >= 450.51.05; 450.36.06 was the 11.0.1 release candidate's
    assert cc.MIN_DRIVER_LINUX[(11, 0)] == "450.51.05"
    assert cc.max_cuda_for_driver("450.36.06") == (10, 2)


def test_table_is_monotonic() -> None:
    # a newer CUDA never needs an older driver
    items = sorted(cc.MIN_DRIVER_LINUX.items())
    drivers = [cc.parse_version(d) for _, d in items]
    assert drivers == sorted(drivers)
    for cuda, need in items:
        assert cc.max_cuda_for_driver(need) == cuda
    assert cc.max_cuda_for_driver("384.00") is None


@given(st.sampled_from(sorted(cc.MIN_DRIVER_LINUX)), st.sampled_from(sorted(cc.MIN_DRIVER_LINUX)))
def test_check_driver_runtime_levels(driver_of: tuple, runtime: tuple) -> None:
    driver = cc.MIN_DRIVER_LINUX[driver_of]
    v = cc.check_driver_runtime(driver, runtime)
    if runtime <= driver_of:
        assert v.level == cc.OK and v.change == "nothing"
    elif (
        runtime[0] == driver_of[0]
        and runtime[0] >= 11
        and cc.parse_version(driver) >= cc.parse_version(cc.MINOR_COMPAT_MIN_DRIVER[runtime[0]])
    ):
        assert v.level == cc.WARNING and v.change == "driver"
    else:
        assert v.level == cc.PROBLEM and v.change == "driver"
    assert v.en and v.zh


def _fake_toolkit(tmp_path: Path, nvcc_text: str) -> Path:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ncat <<'EOF'\n{nvcc_text}\nEOF\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return home


@pytest.mark.parametrize("nvcc_v", ["10.2", "11.8", "12.1", "12.4", "13.0"])
@pytest.mark.parametrize("torch_v", ["11.8", "12.1", "12.8"])
def test_check_nvcc_torch_matches_torch_cpp_extension(
    tmp_path, monkeypatch, caplog, nvcc_v: str, torch_v: str
) -> None:
    """Oracle: torch.utils.cpp_extension._check_cuda_version on a fake toolkit."""
    from torch.utils import cpp_extension

    home = _fake_toolkit(tmp_path, (FIX / "nvcc" / f"{nvcc_v}.txt").read_text())
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home))
    monkeypatch.setattr(torch.version, "cuda", torch_v)
    monkeypatch.setenv("TORCH_DONT_CHECK_COMPILER_ABI", "1")
    try:
        with caplog.at_level(logging.WARNING):
            cpp_extension._check_cuda_version("c++", cpp_extension.TorchVersion("13.0"))
        torch_ok = True
    except RuntimeError:
        torch_ok = False
    ours = cc.check_nvcc_torch(cc.parse_version(nvcc_v), cc.parse_version(torch_v))
    assert (ours.level == cc.OK) == torch_ok
    assert os.path.exists(home / "bin" / "nvcc")
