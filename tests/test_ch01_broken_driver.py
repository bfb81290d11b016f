"""Chapter 01 on the machine it exists to diagnose: nvidia-smi is there but fails.

A fake ``nvidia-smi`` on PATH prints a stored failure (no driver, or a driver/library
version mismatch after an upgrade without reboot) and exits non-zero; every cell of the
chapter's lesson notebook must still run, in both languages.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ddp_lab.tools import cuda_compat as cc

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "nvidia-smi"


def _fake_smi(folder: Path, fixture: str) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat '{FIX / fixture}'\nexit 9\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    "lang,fixture",
    [("en", "failed_no_driver.txt"), ("zh", "nvml_mismatch.txt")],
)
def test_chapter_01_runs_with_a_failing_nvidia_smi(tmp_path, monkeypatch, lang, fixture):
    _fake_smi(tmp_path, fixture)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    path = ROOT / "notebooks" / lang / "01_gpu_stack.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "nvidia-smi FAILED here" in printed
    assert cc.parse_nvidia_smi((FIX / fixture).read_text()).error in printed


def test_an_smi_with_only_an_error_formats_and_draws():
    info = cc.parse_nvidia_smi((FIX / "nvml_mismatch.txt").read_text())
    assert info.error and info.driver is None
    assert cc.fmt_driver(info.driver) == "-"
    pytest.importorskip("ipywidgets")
    box = cc.compat_widget(driver=info, runtime="12.1")
    assert box.children[0].children[0].value == max(
        box.children[0].children[0].options, key=cc.parse_version
    )
    cc.compat_widget(driver=cc.fmt_driver(info.driver))
