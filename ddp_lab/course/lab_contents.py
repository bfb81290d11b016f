"""JupyterLab opens the course's notebooks unmodified: the Python version filled in on load.

When a kernel starts, JupyterLab writes the kernel's ``language_info`` into the notebook's
metadata; ipykernel's includes the Python version (``3.11.7``), which differs between
machines, so the generated notebooks leave it out (``build``) and JupyterLab then marks
every notebook modified on open (and autosaves it: a tracked file changes). setup.sh makes
JupyterLab's server use this contents manager, which adds the version of the server's Python
(the venv's, the same as the kernel's) to a course notebook as it is served. Nothing on
disk changes.
"""

from __future__ import annotations

import platform
from typing import Any

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


def fill_python_version(nb: Any) -> None:
    """Add this Python's version to a course notebook's ``language_info`` if it has none."""
    meta = nb.get("metadata", {}) if isinstance(nb, dict) else {}
    info = meta.get("language_info")
    if "ddp_lab" in meta and isinstance(info, dict) and info.get("name") == "python":
        info.setdefault("version", platform.python_version())


class CourseContentsManager(AsyncLargeFileManager):
    """jupyter_server's default contents manager, with ``fill_python_version`` on load."""

    async def get(self, path: str, content: bool = True, **kwargs: Any) -> dict:
        model = await super().get(path, content=content, **kwargs)
        if model.get("type") == "notebook" and model.get("content"):
            fill_python_version(model["content"])
        return model
