"""doctor: GPU situations from fixtures, this machine for real, CLI and JSON output."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from ddp_lab.tools import doctor as dr
from ddp_lab.tools import doctor_facts

FIX = Path(__file__).parent / "fixtures"


def smi(name: str) -> str:
    return next((FIX / "nvidia-smi").glob(f"{name}*")).read_text()


def nvcc(version: str) -> str:
    return (FIX / "nvcc" / f"{version}.txt").read_text()


BASE = dr.Facts(
    env={},
    torch_version="2.5.1+cu121",
    torch_cuda="12.1",
    cudnn=90100,
    nccl="2.21.5",
    backends={"gloo": True, "nccl": True, "mpi": False},
    device_count=1,
    shm_bytes=16 << 30,
    nofile=(65536, 65536),
    loopback="",
    interfaces=["lo", "eth0"],
    nvidia_smi=smi("535"),
)


def by_key(facts: dr.Facts) -> dict[str, dr.Finding]:
    return {f.key: f for f in dr.analyse(facts)}


def test_good_gpu_machine_is_all_ok() -> None:
    found = by_key(BASE)
    assert {f.level for f in found.values()} == {"ok"}, found
    assert "535.104.05" in found["driver"].value and "12.2" in found["driver"].value


def test_driver_too_old_for_torch() -> None:
    f = by_key(dataclasses.replace(BASE, nvidia_smi=smi("470")))
    assert f["driver_vs_torch"].level == "problem"
    assert ">= 530.30.02" in f["driver_vs_torch"].en and f["driver_vs_torch"].zh


def test_driver_minor_version_compatibility() -> None:
    f = by_key(dataclasses.replace(BASE, nvidia_smi=smi("525")))
    assert f["driver_vs_torch"].level == "warning"


@pytest.mark.parametrize(
    "name,needle", [("failed_no_driver", "install"), ("nvml_mismatch", "reboot")]
)
def test_driver_broken(name: str, needle: str) -> None:
    f = by_key(dataclasses.replace(BASE, nvidia_smi=smi(name), device_count=0))
    assert f["driver"].level == "problem" and needle in f["driver"].en


def test_no_nvidia_smi_cpu_build_is_fine_cuda_build_warns() -> None:
    cpu = dataclasses.replace(
        BASE,
        nvidia_smi=None,
        torch_cuda=None,
        nccl=None,
        backends={"gloo": True, "nccl": False, "mpi": False},
        device_count=0,
    )
    assert by_key(cpu)["driver"].level == "ok"
    assert by_key(dataclasses.replace(BASE, nvidia_smi=None))["driver"].level == "warning"


def test_cpu_build_on_gpu_machine_warns() -> None:
    f = by_key(
        dataclasses.replace(
            BASE,
            torch_cuda=None,
            nccl=None,
            device_count=0,
            backends={"gloo": True, "nccl": False, "mpi": False},
        )
    )
    assert f["driver_vs_torch"].level == "warning"


def test_cuda_visible_devices_hides_all() -> None:
    f = by_key(dataclasses.replace(BASE, device_count=0, env={"CUDA_VISIBLE_DEVICES": ""}))
    assert f["devices"].level == "problem" and "CUDA_VISIBLE_DEVICES" in f["devices"].value


def test_nvcc_missing_is_ok_and_says_why() -> None:
    f = by_key(BASE)
    assert f["nvcc"].level == "ok" and "not needed" in f["nvcc"].value


def test_two_toolkits_and_nvcc_of_other_major(tmp_path) -> None:
    a, b = tmp_path / "cuda-11.8", tmp_path / "cuda-12.1"
    for home in (a, b):
        (home / "bin").mkdir(parents=True)
        (home / "bin" / "nvcc").write_text("")
    facts = dataclasses.replace(
        BASE,
        env={"CUDA_HOME": str(b)},
        nvcc_path=str(a / "bin" / "nvcc"),
        nvcc_text=nvcc("11.8"),
        toolkits={str(a): nvcc("11.8"), str(b): nvcc("12.1")},
    )
    f = by_key(facts)
    assert f["toolkits"].level == "warning"
    assert f["nvcc"].level == "warning" and "CUDA_HOME" in f["nvcc"].en
    assert f["cuda_home"].level == "ok" and "from CUDA_HOME" in f["cuda_home"].value


def test_conda_cuda12_headers_under_targets_need_cuda_inc_path(tmp_path, monkeypatch) -> None:
    # conda's CUDA 12+ packages: bin/nvcc, headers in targets/x86_64-linux/include only
    home = tmp_path / "conda"
    (home / "bin").mkdir(parents=True)
    nvcc_bin = home / "bin" / "nvcc"
    nvcc_bin.write_text(f"#!/bin/sh\ncat <<'EOF'\n{nvcc('12.1')}\nEOF\n")
    nvcc_bin.chmod(0o755)
    inc = home / "targets" / "x86_64-linux" / "include"
    inc.mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("")
    assert dr.toolkit_include(str(home)) == str(inc)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("CUDA_INC_PATH", raising=False)
    facts = dr.gather()
    assert str(home.resolve()) in facts.toolkits  # a toolkit, not "no include/cuda_runtime.h"
    f = by_key(facts)["cuda_home"]
    assert f.level == "warning" and f"CUDA_INC_PATH={inc}" in f.en
    facts.env["CUDA_INC_PATH"] = str(inc)
    assert by_key(facts)["cuda_home"].level == "ok"


@pytest.mark.parametrize(
    "env,nvcc_rel",
    [
        ({"CUDA_HOME": "/opt/cuda-x"}, "/usr/bin/nvcc"),
        ({"CUDA_PATH": "/opt/cuda-y"}, None),
        ({}, "/opt/conda/bin/nvcc"),
        ({}, None),
    ],
)
def test_find_cuda_home_matches_torch(monkeypatch, env: dict, nvcc_rel: str | None) -> None:
    """Oracle: torch.utils.cpp_extension._find_cuda_home under the same environment."""
    for k in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cpp_extension.shutil, "which", lambda name: nvcc_rel)
    assert dr.find_cuda_home(dict(os.environ), nvcc_rel) == cpp_extension._find_cuda_home()


def test_small_shm_low_nofile_bad_ifname_and_leftover_rank() -> None:
    facts = dataclasses.replace(
        BASE,
        shm_bytes=64 << 20,
        nofile=(1024, 4096),
        env={
            "NCCL_SOCKET_IFNAME": "ib0",
            "GLOO_SOCKET_IFNAME": "eth",
            "RANK": "3",
            "NCCL_P2P_DISABLE": "1",
        },
    )
    f = by_key(facts)
    assert f["shm"].level == "problem" and "--shm-size" in f["shm"].en
    assert f["nofile"].level == "warning" and "ulimit -n 4096" in f["nofile"].en
    assert f["NCCL_SOCKET_IFNAME"].level == "problem"
    # Gloo looks names up exactly (gloo/transport/tcp/device.cc, strcmp): "eth" is no eth0
    assert f["GLOO_SOCKET_IFNAME"].level == "problem"
    assert f["leftover"].level == "warning" and f["NCCL_P2P_DISABLE"].level == "warning"
    assert "RANK=3" in f["env"].value


@pytest.mark.parametrize(
    ("var", "value", "missing"),
    [
        ("GLOO_SOCKET_IFNAME", "eth", ["eth"]),  # exact names only
        ("GLOO_SOCKET_IFNAME", "eth0", []),
        ("GLOO_SOCKET_IFNAME", "lo,eth", ["eth"]),  # a comma-separated list, each exact
        ("NCCL_SOCKET_IFNAME", "eth", []),  # NCCL: a prefix
        ("NCCL_SOCKET_IFNAME", "=eth", ["eth"]),  # "=": exact
        ("NCCL_SOCKET_IFNAME", "=eth0,lo", []),
        ("NCCL_SOCKET_IFNAME", "ib", ["ib"]),
        ("NCCL_SOCKET_IFNAME", "^docker,lo", []),  # "^": an exclude list
    ],
)
def test_ifname_rules_differ_between_gloo_and_nccl(var: str, value: str, missing: list) -> None:
    assert dr.missing_interfaces(var, value, ["lo", "eth0"]) == missing
    f = by_key(dataclasses.replace(BASE, env={var: value}))
    assert (var in f and f[var].level == "problem") == bool(missing)


def test_loopback_failure_is_a_problem() -> None:
    f = by_key(dataclasses.replace(BASE, loopback="rank 0: timeout"))
    assert f["loopback"].level == "problem"


def test_every_finding_not_ok_has_a_fix_in_both_languages() -> None:
    facts = dataclasses.replace(
        BASE,
        nvidia_smi=smi("470"),
        shm_bytes=1 << 20,
        nofile=(256, 256),
        loopback="x",
        device_count=0,
        env={"CUDA_VISIBLE_DEVICES": "", "WORLD_SIZE": "2"},
    )
    for f in dr.analyse(facts):
        assert f.level in ("ok", "warning", "problem")
        if f.level != "ok":
            assert f.en and f.zh, f


def test_gather_on_this_machine_is_consistent() -> None:
    import torch
    import torch.distributed as dist

    facts = dr.gather()
    assert facts.torch_version == torch.__version__
    assert facts.backends["gloo"] == dist.is_gloo_available()
    assert facts.loopback == ""  # gloo works over loopback on this machine
    report = dr.doctor(facts)
    assert report[0].key == "torch" and str(report)


def test_cli_json_and_exit_code() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "ddp_lab.course.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads(p.stdout)
    problems = data["summary"]["problem"]
    assert p.returncode == (1 if problems else 0)
    assert {f["level"] for f in data["findings"]} <= {"ok", "warning", "problem"}


def test_html_report() -> None:
    html = dr.doctor(BASE)._repr_html_()
    assert html.startswith("<table>") and "driver" in html


def test_dl_doctor_is_callable_and_the_function_still_importable() -> None:
    import ddp_lab as dl
    from ddp_lab.tools.doctor import doctor

    report = dl.doctor(BASE)  # the module is callable: dl.doctor() in a notebook
    assert [x.key for x in report] == [x.key for x in doctor(BASE)]
    assert callable(dl.doctor) and dl.doctor is dr


@pytest.mark.parametrize(
    "env, addrs, level, needle",
    [
        ({}, ["127.0.1.1"], dr.WARNING, "gloo binds to lo (127.0.1.1): hostname 'host1' resolves"),
        ({}, [], dr.WARNING, "gloo binds to lo (127.0.0.1): hostname 'host1' does not resolve"),
        ({}, ["10.77.0.2"], dr.OK, "gloo binds to eth0 (10.77.0.2)"),
        ({"GLOO_SOCKET_IFNAME": "eth0"}, ["127.0.1.1"], dr.OK, "eth0 (GLOO_SOCKET_IFNAME)"),
    ],
)
def test_doctor_says_which_interface_gloo_uses_and_why(
    env: dict, addrs: list, level: str, needle: str
) -> None:
    facts = dataclasses.replace(
        BASE,
        env=env,
        hostname="host1",
        hostname_addrs=addrs,
        iface_addrs={"lo": ["127.0.0.1"], "eth0": ["10.77.0.2"]},
    )
    finding = by_key(facts)["gloo_interface"]
    assert finding.level == level and needle in finding.value
    if level != dr.OK:
        assert "GLOO_SOCKET_IFNAME" in finding.en and "GLOO_SOCKET_IFNAME" in finding.zh
        assert "eth0" in finding.en  # the interface to name instead


@pytest.mark.parametrize(
    "env, ifaces, level, needle",
    [
        # ncclFindInterfaces (NCCL src/misc/socket.cc): ib* first ...
        ({}, ["lo", "eth0", "ib0"], dr.OK, "NCCL uses ib0: an InfiniBand"),
        # ... then anything but docker*, lo*, virbr*, in the machine's order ...
        ({}, ["lo", "docker0", "eth0", "eth1"], dr.OK, "NCCL uses eth0, eth1: no ib*"),
        # ... then docker, then the loopback: fine alone, unreachable from another host
        ({}, ["lo", "docker0"], dr.WARNING, "NCCL uses docker0: nothing else"),
        ({}, ["lo"], dr.WARNING, "NCCL uses lo: nothing else: the loopback"),
        # NCCL_SOCKET_IFNAME: prefixes, "=" exact, "^" exclude; one character is ignored
        (
            {"NCCL_SOCKET_IFNAME": "eth"},
            ["lo", "eth0", "eth1"],
            dr.OK,
            "NCCL uses eth0, eth1 (NCCL",
        ),
        ({"NCCL_SOCKET_IFNAME": "=eth1"}, ["lo", "eth0", "eth1"], dr.OK, "NCCL uses eth1 (NCCL"),
        (
            {"NCCL_SOCKET_IFNAME": "^eth0"},
            ["lo", "eth0", "eth1"],
            dr.OK,
            "NCCL uses lo, eth1 (NCCL",
        ),
        ({"NCCL_SOCKET_IFNAME": "l"}, ["lo", "eth0"], dr.OK, "NCCL uses eth0: no ib*"),
    ],
)
def test_doctor_says_which_interface_nccl_uses_and_why(
    env: dict, ifaces: list, level: str, needle: str
) -> None:
    facts = dataclasses.replace(
        BASE, env=env, iface_addrs={name: [f"10.0.0.{i}"] for i, name in enumerate(ifaces)}
    )
    finding = by_key(facts)["nccl_interface"]
    assert finding.level == level and needle in finding.value, finding.value
    if level != dr.OK:
        assert "NCCL_SOCKET_IFNAME" in finding.en and "NCCL_SOCKET_IFNAME" in finding.zh


def test_nccl_socket_ifname_matching_nothing_is_the_problem_finding() -> None:
    facts = dataclasses.replace(
        BASE,
        env={"NCCL_SOCKET_IFNAME": "=eth"},
        iface_addrs={"lo": ["127.0.0.1"], "eth0": ["10.0.0.1"]},
    )
    found = by_key(facts)
    assert "nccl_interface" not in found  # nothing matches: no claim about what NCCL uses
    assert (
        found.get("NCCL_SOCKET_IFNAME") is None or found["NCCL_SOCKET_IFNAME"].level == dr.PROBLEM
    )


def test_torch_that_lacks_the_courses_apis_is_named_with_its_chapters() -> None:
    """Issue 40 item 5: torch 2.11 (seen on a GPU machine) lacks four APIs the course uses."""
    have = dict.fromkeys(dr.TORCH_FEATURES, True)
    ok = by_key(dataclasses.replace(BASE, torch_features=have))["torch_features"]
    assert ok.level == "ok" and dr.MIN_TORCH in ok.value
    old = {**have, "dist.all_gather_single": False, "gloo all_to_all": False}
    found = by_key(dataclasses.replace(BASE, torch_version="2.11.0+cu130", torch_features=old))
    line = found["torch_features"]
    assert line.level == "warning"
    assert "dist.all_gather_single" in line.value and "gloo all_to_all" in line.value
    assert "2.13" in line.en and "04" in line.en and "torch>=" not in line.value
    assert line.zh and "2.13" in line.zh


def _this_torch_is_older() -> bool:
    """Whether this torch predates the course's (the GPU machine's 2.11 does)."""
    import torch

    from ddp_lab.tools.cuda_compat import parse_version

    this = parse_version(torch.__version__.split("+")[0])  # "2.11.0+cu130" -> (2, 11, 0)
    return this < parse_version(dr.MIN_TORCH)


def test_this_torch_has_every_feature_and_a_missing_one_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    found = dr.torch_features()
    if _this_torch_is_older():  # torch 2.11 lacks all four (its source has none of them)
        assert not any(found.values()), found
        pytest.skip(f"this torch predates {dr.MIN_TORCH}; it lacks {sorted(found)}")
    assert found == dict.fromkeys(dr.TORCH_FEATURES, True)
    monkeypatch.delattr(dist, "all_gather_single")
    assert dr.torch_features()["dist.all_gather_single"] is False


@pytest.mark.parametrize(("name", "old"), sorted(doctor_facts.OLD_COLLECTIVE_NAMES.items()))
def test_collective_takes_the_new_name_else_the_old_one_at_each_call(
    monkeypatch: pytest.MonkeyPatch, name: str, old: str
) -> None:
    import torch.distributed as dist

    def recorder(*args: object, **kw: object) -> str:
        return "the patched one"

    monkeypatch.setattr(dist, name, recorder, raising=False)
    # what a recording test or a grader's wrapper patches is what is called
    assert doctor_facts.collective(name)() == "the patched one"
    monkeypatch.delattr(dist, name)  # torch 2.11: only the old name
    assert doctor_facts.collective(name) is getattr(dist, old)
    with pytest.raises(KeyError):
        doctor_facts.collective("no_such_collective")  # only the names torch renamed


def test_chapter_00s_line(monkeypatch: pytest.MonkeyPatch) -> None:
    every = dict.fromkeys(dr.TORCH_FEATURES, True)
    monkeypatch.setattr(dr, "torch_features", lambda: every)
    assert dr.torch_check().startswith("all the APIs the course uses")
    monkeypatch.setattr(dr, "torch_features", lambda: {"gloo all_to_all": False})
    assert "lacks gloo all_to_all" in dr.torch_check() and "-> " in dr.torch_check()


def test_a_lesson_cell_skips_with_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(dr, "torch_features", lambda: {"gloo all_to_all": True})
    assert dr.has("gloo all_to_all") and capsys.readouterr().out == ""
    monkeypatch.setattr(dr, "torch_features", lambda: {"gloo all_to_all": False})
    assert not dr.has("gloo all_to_all")
    out = capsys.readouterr().out
    assert "lacks gloo all_to_all" in out and "2.13" in out
