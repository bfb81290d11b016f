"""Stage 1 of grading, find and read: which files, whose they are, and their notebooks read
without trusting them (``find`` for a class, ``read`` for one submission).

A submission's file is learner-controlled data, read before any sandbox, so:
- only regular files count: a symlink anywhere below the submissions folder (to the
  solutions, to a classmate's notebook, to ``/dev/zero``), a FIFO or a device is that
  submission's ``error``; each path is opened one component at a time with ``O_NOFOLLOW``
  (no link is followed even if one appears after the folder was listed), the file with
  ``O_NONBLOCK`` (a FIFO cannot hang the grader) and checked with ``fstat``;
- a size cap is checked before reading, and reading stops at the cap;
- the JSON is parsed (``nbformat``) in a process of its own under an address-space limit
  and a timeout; what comes back is the notebook with every output, attachment and
  execution count removed: nothing the learner's kernel printed goes further.

Identity comes from the layout the instructor controls, never from a name the learner
picked inside it: ``SUBS/alice/anything.ipynb`` is alice's (the folder directly under the
folder given on the command line), ``SUBS/alice.ipynb`` and a notebook named on the command
line are booked under their file name (the instructor, or the LMS export, placed them
there). Two notebooks for one identity are reported (status ``duplicate``), not renamed.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ddp_lab.i18n import _t

MAX_BYTES = 20 * 2**20  # a chapter's notebook with its outputs is well under 1 MiB
PARSE_TIMEOUT = 60.0
MAX_DEPTH = 16  # folders below a student's folder
MAX_ENTRIES = 10_000  # files and folders in one student's folder
PARSE_MEMORY = 2 * 2**30  # address space of the parsing process


class BadFile(Exception):
    """A submission's file that is not read: the message says why (in the grader's words)."""


@dataclass
class Submission:
    """One student's notebook: who (from the layout), where, and why it cannot be read."""

    identity: str  # may hold surrogate escapes (a non-UTF-8 folder name): show via report.clean
    root: Path  # the folder named on the command line (or the file's own folder)
    rel: tuple[str, ...]  # path components below ``root``
    problem: str = ""  # a reason not to read it (already in the grader's language)
    status: str = "error"  # the status of its exercises when ``problem`` is set
    others: list[str] = field(default_factory=list)  # more notebooks of the same identity

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.rel)


def find(paths: list[str], release_stem: str, lang: str) -> list[Submission]:
    """The submissions in ``paths`` (notebooks or folders), one per identity, sorted.

    Symlinks are never followed: a linked notebook or folder becomes its identity's
    ``error``. Notebooks in ``.ipynb_checkpoints`` are Jupyter's autosaves, not submissions.
    """
    by_id: dict[str, list[Submission]] = {}
    for arg in paths:
        p = Path(arg)
        if not p.is_dir() or p.is_symlink():
            sub = Submission(p.stem, p.parent, (p.name,))
            if p.is_symlink():
                sub.problem = _t(
                    "{path} is a symbolic link (or lies in a linked folder): only regular "
                    "files are graded; submit the notebook itself.",
                    lang,
                    path=p.name,
                )
            by_id.setdefault(sub.identity, []).append(sub)
            continue
        for ident, rel, problem in _folder(p, lang):
            sub = Submission(ident, p, rel, problem=problem)
            by_id.setdefault(ident, []).append(sub)
    out = []
    for ident, found in sorted(by_id.items()):
        seen: dict[str, Submission] = {}  # one file named twice (a folder and the file in it)
        for s in found:
            seen.setdefault(os.path.abspath(s.path), s)
        subs = list(seen.values())
        chosen = subs[0]
        if len(subs) > 1:
            # A notebook named like the release wins when there is exactly one; else no guess.
            named = [s for s in subs if s.rel[-1] == release_stem + ".ipynb" and not s.problem]
            files = ["/".join(s.rel) for s in subs]
            if len(named) == 1:
                chosen = named[0]
                chosen.others = [f for f in files if f != "/".join(chosen.rel)]
            else:
                chosen = Submission(ident, subs[0].root, subs[0].rel, others=files)
                chosen.status = "duplicate"
                chosen.problem = _t(
                    "{n} notebooks were found for one student: {files}. None was graded; keep one.",
                    lang,
                    n=len(subs),
                    files=", ".join(files),
                )
        out.append(chosen)
    return out


def _linked(path: str, lang: str) -> str:
    return _t(
        "{path} is a symbolic link (or lies in a linked folder): only regular "
        "files are graded; submit the notebook itself.",
        lang,
        path=path,
    )


def _folder(top: Path, lang: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(identity, path below ``top``, problem) of each notebook (or link) in the submissions
    folder ``top``: the notebooks directly in it are booked under their names, each folder
    directly in it is one identity, walked by ``_walk``; a folder that cannot be walked
    (too deep, too many entries, unreadable) is that identity's error, never the class's."""
    found: list[tuple[str, tuple[str, ...], str]] = []
    with os.scandir(top) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = entry.name
        if entry.is_symlink():
            if name.endswith(".ipynb") or entry.is_dir():
                found.append(
                    (
                        Path(name).stem if name.endswith(".ipynb") else name,
                        (name,),
                        _linked(name, lang),
                    )
                )
            continue
        if entry.is_dir(follow_symlinks=False):
            if name == ".ipynb_checkpoints":
                continue
            try:
                for rel, linked in _walk(top, name, lang):
                    found.append((name, rel, _linked("/".join(rel), lang) if linked else ""))
            except _Unwalkable as exc:
                found.append((name, (name,), str(exc)))
            except OSError as exc:
                why = _t("{path} could not be read: {error}", lang, path=name, error=exc.strerror)
                found.append((name, (name,), why))
        elif name.endswith(".ipynb"):
            found.append((Path(name).stem, (name,), ""))
    return found


class _Unwalkable(Exception):
    pass


def _walk(top: Path, name: str, lang: str = "en") -> list[tuple[tuple[str, ...], bool]]:
    """(path below ``top``, is a link) of each notebook, and of each linked folder, below
    ``top/name``: iterative (no recursion limit), one directory file descriptor at a time
    (``openat`` with ``O_NOFOLLOW``: no path grows past ``PATH_MAX``), at most ``MAX_DEPTH``
    folders deep and ``MAX_ENTRIES`` entries in all."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    out: list[tuple[tuple[str, ...], bool]] = []
    stack: list[tuple[tuple[str, ...], int]] = [((name,), os.open(top / name, flags))]
    seen = 0
    try:
        while stack:
            rel, fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                seen += len(entries)
                if seen > MAX_ENTRIES:
                    raise _Unwalkable(
                        _t(
                            "{path} holds more than {n} files and folders: not graded; "
                            "submit the notebook itself.",
                            lang,
                            path=name,
                            n=MAX_ENTRIES,
                        )
                    )
                subdirs = []
                for entry in entries:
                    if entry.is_symlink():
                        if entry.name.endswith(".ipynb") or entry.is_dir():
                            out.append(((*rel, entry.name), True))
                    elif entry.is_dir(follow_symlinks=False):
                        if entry.name != ".ipynb_checkpoints":
                            subdirs.append(entry.name)
                    elif entry.name.endswith(".ipynb"):
                        out.append(((*rel, entry.name), False))
                if subdirs and len(rel) >= MAX_DEPTH:
                    raise _Unwalkable(
                        _t(
                            "{path} has folders more than {n} levels deep: not graded; "
                            "submit the notebook itself.",
                            lang,
                            path=name,
                            n=MAX_DEPTH,
                        )
                    )
                for d in reversed(subdirs):
                    stack.append(((*rel, d), os.open(d, flags, dir_fd=fd)))
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    return sorted(out)


def read_bytes(root: Path, rel: tuple[str, ...], limit: int = MAX_BYTES) -> bytes:
    """The bytes of ``root/rel``, following no symlink below ``root``; regular files only,
    at most ``limit`` bytes (``BadFile`` otherwise)."""
    shown = "/".join(rel)
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY))
            for part in rel[:-1]:
                fds.append(
                    os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1])
                )
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
            fds.append(os.open(rel[-1], flags, dir_fd=fds[-1]))
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise BadFile(
                    _t(
                        "{path} is a symbolic link (or lies in a linked folder): only regular "
                        "files are graded; submit the notebook itself.",
                        path=shown,
                    )
                ) from None
            raise BadFile(
                _t("{path} could not be read: {error}", path=shown, error=exc.strerror)
            ) from None
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise BadFile(
                _t("{path} is not a regular file (a FIFO, device or socket): not read.", path=shown)
            )
        if st.st_size > limit:
            raise BadFile(
                _t(
                    "{path} is larger than {limit} MiB: not read (clear the outputs and "
                    "submit again).",
                    path=shown,
                    limit=limit // 2**20,
                )
            )
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fds[-1], min(2**20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while we read
            raise BadFile(
                _t(
                    "{path} is larger than {limit} MiB: not read (clear the outputs and "
                    "submit again).",
                    path=shown,
                    limit=limit // 2**20,
                )
            )
        return b"".join(chunks)
    finally:
        for fd in fds:
            os.close(fd)


# Runs in a process of its own, limits set first: parse, validate, strip what the kernel wrote.
_PARSE = """\
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
sys.modules["rfc3987_syntax"] = None  # see ddp_lab/course/__init__.py
import nbformat
try:
    nb = nbformat.reads(sys.stdin.buffer.read().decode("utf-8"), as_version=4)
    if not isinstance(nb.get("cells"), list):
        raise ValueError("no list of cells")
    for cell in nb.cells:
        if not isinstance(cell, dict) or not isinstance(cell.get("source", ""), str):
            raise ValueError("a cell is not a notebook cell")
        cell.pop("attachments", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    text = nbformat.writes(nb, ensure_ascii=True)  # a lone surrogate stays an escape
except Exception as exc:
    text = json.dumps({{"error": type(exc).__name__ + ": " + str(exc)[:300]}})
sys.stdout.write(text)
"""


def parse(data: bytes, timeout: float = PARSE_TIMEOUT, memory: int = PARSE_MEMORY) -> str:
    """The notebook in ``data`` as nbformat JSON, outputs removed; parsed in a separate,
    limited process. ``ValueError`` if it is not a notebook, ``BadFile`` past the limits."""
    code = _PARSE.format(memory=memory, cpu=int(timeout) + 1)
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", code],
            input=data,
            capture_output=True,
            timeout=timeout,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    except subprocess.TimeoutExpired:
        raise BadFile(
            _t(
                "reading the notebook took more than {timeout:g} s or {memory} MiB of memory",
                timeout=timeout,
                memory=memory // 2**20,
            )
        ) from None
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0 or not out:
        if b"MemoryError" in proc.stderr or proc.returncode < 0:
            raise BadFile(
                _t(
                    "reading the notebook took more than {timeout:g} s or {memory} MiB of memory",
                    timeout=timeout,
                    memory=memory // 2**20,
                )
            )
        raise ValueError(proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or "?")
    if out.startswith('{"error": '):
        raise ValueError(json.loads(out)["error"])
    return out


@dataclass
class Read:
    """Stage 1's value for one submission: its notebook (every output removed), or why it
    was not read: ``status`` (``error``, ``duplicate``, ``invalid``) and ``why``."""

    notebook: nbformat.NotebookNode | None
    status: str = ""
    why: str = ""


def read(source: Path | Submission | nbformat.NotebookNode, lang: str) -> Read:
    """Stage 1 for one submission: ``source`` read without trusting it (``load``).

    ``source``: a notebook file (given by the instructor, or a learner's own), a found
    ``Submission`` (its ``problem`` is its reason not to be read), or a notebook already read
    by ``load``. ``lang``: the language of the reason when it is not a notebook."""
    if isinstance(source, nbformat.NotebookNode):
        return Read(source)
    try:
        if isinstance(source, Submission):
            if source.problem:
                raise BadFile(source.problem)
            return Read(load(source.root, source.rel))
        return Read(load(source.parent, (source.name,)))
    except BadFile as exc:
        return Read(None, source.status if isinstance(source, Submission) else "error", str(exc))
    except Exception as exc:  # noqa: BLE001  # any unreadable file scores 0, the rest go on
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return Read(None, "invalid", _t("not a valid notebook: {error}", lang, error=error))


def load(root: Path, rel: tuple[str, ...], limit: int = MAX_BYTES) -> nbformat.NotebookNode:
    """Read (``read_bytes``) and parse (``parse``) one submission: outputs removed."""
    text = parse(read_bytes(root, rel, limit))
    return nbformat.reads(text, as_version=4)
