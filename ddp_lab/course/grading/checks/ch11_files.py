"""Chapter 11's checkpoint folder as data: read by the ranks of the stop launch, checked by the
checker, written back for the ranks of the resume launch (``ch11``: 11.resume).

Only bytes cross: each file's relative name and its content as a uint8 tensor
(``course.grading.wire`` data), at most ``CHECKPOINT_LIMIT`` in all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ddp_lab.course.grading import wrong_form

CHECKPOINT_LIMIT = 16 * 2**20  # bytes of checkpoint files handed from one launch to the next


def read_files(where: Path) -> dict[str, torch.Tensor]:
    """Every file under ``where`` (relative name -> its bytes as a uint8 tensor)."""
    files: dict[str, torch.Tensor] = {}
    for path in sorted(where.rglob("*")):
        if path.is_file() and not path.is_symlink():
            raw = bytearray(path.read_bytes())
            data = (
                torch.frombuffer(raw, dtype=torch.uint8)
                if raw
                else torch.empty(0, dtype=torch.uint8)
            )
            files[path.relative_to(where).as_posix()] = data.clone()
    return files


def write_files(where: Path, files: dict[str, torch.Tensor]) -> None:
    """The checkpoint folder as the first launch left it (each file written atomically, so that
    ranks sharing one folder, as in self-study, do not see each other's half-written copy)."""
    for name, data in files.items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_bytes(data.numpy().tobytes())
        os.replace(part, path)


def checkpoint_files(stopped: list[dict], label: str) -> dict[str, torch.Tensor]:
    """The checkpoint folder the ranks of the first launch left, as data: the union of the files
    each rank saw (where two ranks saw one name, the lowest rank's copy), checked for form."""
    files: dict[str, torch.Tensor] = {}
    total = 0
    for rank, r in enumerate(stopped):
        got = r.get("files")
        if not isinstance(got, dict):
            raise wrong_form(rank, "files", _kind(got), label)
        for name, data in got.items():
            parts = Path(name).parts if isinstance(name, str) else ()
            if (
                not parts
                or Path(name).is_absolute()
                or any(p in ("..", ".") for p in parts)
                or type(data) is not torch.Tensor
                or data.dtype != torch.uint8
                or data.dim() != 1
            ):
                raise wrong_form(rank, "files", _kind(data), label)
            if name not in files:
                files[name] = data
                total += data.numel()
    if total > CHECKPOINT_LIMIT:
        raise wrong_form("-", "files", f"{total} bytes", label)
    return files


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    return type(value).__name__
