"""The contents manager setup.sh gives JupyterLab (ddp_lab/course/lab_contents.py): a course
notebook is served with exactly the metadata a kernel of this install reports, so JupyterLab
has nothing to rewrite on open (the browser test shows the unmodified tab)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("jupyter_server")


def test_course_notebook_metadata_is_what_the_kernel_reports(tmp_path):
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    from ddp_lab.course.lab_contents import CourseContentsManager

    for kind in ("notebooks", "exercises"):
        shutil.copy(ROOT / kind / "zh" / "00_quickstart.ipynb", tmp_path / f"{kind}.ipynb")
    other = nbformat.v4.new_notebook(metadata={"language_info": {"name": "python"}})
    nbformat.write(other, tmp_path / "other.ipynb")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    manager = CourseContentsManager(root_dir=str(tmp_path))
    spec = KernelSpecManager().get_kernel_spec("python3")  # the kernel setup.sh installs
    for kind in ("notebooks", "exercises"):
        meta = asyncio.run(manager.get(f"{kind}.ipynb"))["content"]["metadata"]
        assert meta["language_info"] == IPythonKernel.language_info  # JupyterLab's deepEqual
        assert meta["kernelspec"] == {
            "name": "python3",
            "display_name": spec.display_name,
            "language": spec.language,
        }
    meta = asyncio.run(manager.get("other.ipynb"))["content"]["metadata"]
    assert meta["language_info"] == {"name": "python"}  # not a course notebook: as it is
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written
    assert json.loads(before["exercises.ipynb"])["metadata"]["language_info"].get("version") is None
