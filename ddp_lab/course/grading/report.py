"""What the grader writes and prints: learner text made harmless, and the class's gradebook.

Learner text (a folder name, an exception message, a checker's line quoting the learner's
output) reaches a spreadsheet, a Markdown viewer, Gradescope's page and the instructor's
terminal. Everywhere it goes through ``clean``: lone surrogates (a non-UTF-8 file name) and
control, format and escape characters become visible escapes, and the length is capped.
Then, per destination:
- CSV: a cell that a spreadsheet would read as a formula (``= + - @``, tab, CR first: OWASP's
  "CSV injection" rule) gets a leading ``'``;
- Markdown (feedback files, Gradescope's ``output``): learner text inside a code span or
  fence whose backtick run is longer than any in the text, so it never becomes markup;
- terminal: ``shown`` (``clean`` then no raw escape can reach the terminal).
File names of feedback come from ``file_name``: printable, short, unique per identity.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

MAX_TEXT = 2000  # characters of one learner text in a report
MAX_NAME = 80  # characters of an identity in file names and tables


def clean(text: object, limit: int = MAX_TEXT, newlines: bool = False) -> str:
    """``text`` with every character that is not printable shown as an escape, capped.

    Lone surrogates (from ``surrogateescape``: a non-UTF-8 byte) become ``\\xNN``; control
    and format characters (escape sequences, bidi overrides) ``\\uNNNN``; tab and newline
    are kept only with ``newlines``.
    """
    s = str(text) if not isinstance(text, bytes) else text.decode("utf-8", "surrogateescape")
    out = []
    for ch in s:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape of byte code - 0xDC00
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        elif newlines and ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cn"):
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
        if len(out) > limit:
            return "".join(out[:limit]) + "…"
    return "".join(out)


def shown(text: object, limit: int = MAX_NAME) -> str:
    """Learner text for the terminal: one line, escaped, capped (two long names that
    differ only past the cap still look different: a hash of the whole is added)."""
    s = clean(text, limit)
    if s.endswith("…") and len(s) > limit:
        raw = str(text).encode("utf-8", "surrogateescape")
        s += hashlib.sha256(raw).hexdigest()[:8]
    return s


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A CSV cell no spreadsheet runs as a formula (numbers pass unchanged)."""
    if isinstance(value, (int, float)):
        return value
    s = clean(value, MAX_TEXT)
    return "'" + s if s.startswith(_FORMULA) else s


def code_span(text: object, limit: int = MAX_TEXT) -> str:
    """Learner text as one inline Markdown code span (never markup or HTML)."""
    s = clean(text, limit).replace("\n", " ")
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{ticks}{pad}{s}{pad}{ticks}"


def code_block(text: object, limit: int = MAX_TEXT) -> str:
    """Learner text (several lines) as a fenced Markdown block (never markup or HTML)."""
    s = clean(text, limit, newlines=True)
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    return f"{fence}text\n{s}\n{fence}"


_HASHED = re.compile(r"-[0-9a-f]{10}$", re.IGNORECASE)


def file_name(identity: str, hashed: bool = False) -> str:
    """A file name for ``identity``: printable ASCII-safe, short, and unique (a hash of the
    original is added whenever the name had to change, or ``hashed``). A name that already
    ends the way a hashed one does is hashed too: "a b" becomes "a_b-c8687a08aa", so a
    student whose folder is called "a_b-c8687a08aa" must not keep that name."""
    safe = re.sub(r"[^\w.-]", "_", clean(identity, MAX_NAME), flags=re.ASCII).lstrip(".-")
    plain = safe == identity and safe and len(safe) <= MAX_NAME and not _HASHED.search(safe)
    if plain and not hashed:
        return safe
    raw = identity.encode("utf-8", "surrogateescape")
    return f"{safe[:MAX_NAME] or 'student'}-{hashlib.sha256(raw).hexdigest()[:10]}"


def file_names(identities: Iterable[str]) -> dict[str, str]:
    """``file_name`` of each identity, with no two names alike even on a file system that
    ignores case ("Alice" and "alice": the second is hashed)."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for identity in identities:
        name = file_name(identity)
        if name.casefold() in used:
            name = file_name(identity, hashed=True)
        used.add(name.casefold())
        names[identity] = name
    return names


def write_text(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all (a full disk leaves no half file under ``path``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


HEADER = ["student", "exercise", "points", "max_points", "status"]


def read_gradebook(out: Path) -> list[list[str]] | None:
    """The rows of the ``gradebook.csv`` an earlier run left in ``out`` (None: none there).
    Its cells were made CSV-safe when written: they are written back as they are."""
    path = out / "gradebook.csv"
    if not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != HEADER or any(len(r) != len(HEADER) for r in rows[1:]):
        raise ValueError("not the columns ddp-lab grade writes")
    return rows[1:]


def gradebook_clash(
    earlier: list[list[str]] | None, students: list[str], grade_ids: list[str], regrade: bool
) -> tuple[list[str], list[str]]:
    """What an earlier gradebook holds that this run must not lose or mix: (students,
    exercises) of its rows that a run would not write again (another assignment's, a
    student not graded now), or for a regrade (``regrade``), its exercises that this
    release does not have (the kept rows would mix two assignments)."""
    if not earlier:
        return [], []
    ids = {csv_cell(g) for g in grade_ids}
    other = sorted({r[1] for r in earlier} - ids)
    if regrade:
        return [], other
    now = {csv_cell(n) for n in students}
    return sorted({r[0] for r in earlier} - now), other


def write_gradebook(
    out: Path, rows: list[tuple[str, list]], kept: list[list[str]] | None = None
) -> list[Path]:
    """``gradebook.csv`` (one row per student and exercise) and ``totals.csv`` (one row per
    student: total and maximum). ``rows``: (identity, ``judge.Result``s); ``kept``: an earlier
    gradebook's rows (a regrade): a student graded now replaces theirs, the others stay, in
    the earlier order."""
    book = out / "gradebook.csv"
    totals = out / "totals.csv"
    new: dict[str, list[list[object]]] = {}
    for name, results in rows:
        cell = csv_cell(name)
        new[cell] = [
            [cell, csv_cell(r.grade_id), r.points, r.max_points, r.status] for r in results
        ]
    merged: dict[object, list[list[object]]] = {}
    for row in kept or []:
        if row[0] not in new:
            merged.setdefault(row[0], []).append(row)
        else:
            merged.setdefault(row[0], new[row[0]])
    for cell, lines in new.items():
        merged.setdefault(cell, lines)
    lines: list[list[object]] = [HEADER]
    sums: list[list[object]] = [["student", "total", "max_points", "statuses"]]
    for cell, student in merged.items():
        lines += student
        sums.append(
            [
                cell,
                _number(sum(float(r[2]) for r in student)),
                _number(sum(float(r[3]) for r in student)),
                " ".join(sorted({str(r[4]) for r in student})),
            ]
        )
    for path, table in ((book, lines), (totals, sums)):
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(table)
        os.replace(tmp, path)
    return [book, totals]


def _number(x: float) -> int | float:
    return int(x) if x == int(x) else x
