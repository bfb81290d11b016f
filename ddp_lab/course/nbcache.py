"""Executed notebooks, cached by a hash of their source, for the course website.

The site (``ddp-lab site``, course/site.py) shows each lesson with its real outputs. Running
the lessons is the expensive part, and the test suite runs every one of them already (nbval),
so the outputs of that run are kept: this module is also a pytest plugin,

    pytest -p ddp_lab.course.nbcache --nb-cache DIR --nbval-lax notebooks

which, for each notebook whose every cell ran without an error, writes the notebook with the
outputs nbval received to ``DIR/<sha256 of the notebook file>.ipynb``. The site build looks
there first and runs (nbclient) only the notebooks it does not find: a chapter whose notebook
changed, or one the tests did not run. The key is the notebook's text alone: an edit to
``ddp_lab`` that changes what a lesson prints is seen at the next test run, which rewrites
the entry of every notebook it runs.
"""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path

import nbformat
import pytest  # nbval's, a dependency of the package

VERSION = "2"  # part of the key: bump it when what is stored changes


def key(text: str) -> str:
    """The cache key of a notebook: a hash of its file's text."""
    return hashlib.sha256((VERSION + "\n" + text).encode()).hexdigest()


def path_for(cache: Path, text: str) -> Path:
    return cache / f"{key(text)}.ipynb"


def load(cache: Path, text: str) -> nbformat.NotebookNode | None:
    """The executed notebook stored for a notebook with this text, or None."""
    p = path_for(cache, text)
    if not p.is_file():
        return None
    try:
        return nbformat.read(p, as_version=4)
    except Exception:  # a torn or foreign file is a miss, and is rewritten
        return None


def store(cache: Path, text: str, executed: nbformat.NotebookNode) -> Path:
    """Write ``executed`` under the key of ``text`` (atomically: a reader never sees half)."""
    cache.mkdir(parents=True, exist_ok=True)
    p = path_for(cache, text)
    tmp = p.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(nbformat.writes(executed), encoding="utf-8")
    os.replace(tmp, p)
    return p


# --------------------------------------------------------------------------------------
# The pytest plugin: keep what nbval ran
# --------------------------------------------------------------------------------------


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--nb-cache",
        metavar="DIR",
        default=None,
        help="ddp-lab: keep each notebook nbval ran without an error, with its outputs, in DIR "
        "(read by `ddp-lab site`)",
    )


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "test_outputs")


def pytest_runtest_logreport(report) -> None:
    # a failed setup/call/teardown of any cell keeps its notebook out of the cache
    if report.failed:
        _FAILED.add(report.nodeid.split("::", 1)[0])


_FAILED: set[str] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Start each notebook's kernel with the backend a learner's kernel has (inline figures),
    so that the stored outputs hold the figures: test.sh sets ``MPLBACKEND=agg`` for the unit
    tests, which ipykernel would keep (and then ``plt.show()`` draws nothing)."""
    if not item.config.getoption("--nb-cache", default=None) or not _is_nbval_cell(item):
        yield
        return
    saved = os.environ.pop("MPLBACKEND", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved


def pytest_runtest_teardown(item, nextitem) -> None:
    cache = item.config.getoption("--nb-cache", default=None)
    if not cache or not _is_nbval_cell(item):
        return
    if nextitem is not None and nextitem.parent is item.parent:
        return  # not the notebook's last cell yet
    _store_file(Path(cache), item.parent)


def _store_file(cache: Path, nbfile) -> None:
    """After the last cell of a notebook: store it if every cell ran, unskipped."""
    if nbfile.nodeid in _FAILED:
        return
    cells = [c for c in nbfile.nb.cells if c.cell_type == "code"]
    outputs = getattr(nbfile, "_ddp_lab_outputs", {})
    if len(outputs) != len(cells):
        return  # a cell was skipped or never ran: the notebook is not whole
    text = Path(str(nbfile.fspath)).read_text(encoding="utf-8")
    executed = copy.deepcopy(nbfile.nb)
    n = 0
    for cell in executed.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        quiet = shows_no_result(cell.source)
        for o in outputs[n]:
            out = nbformat.NotebookNode(copy.deepcopy(dict(o)))
            if out.output_type == "execute_result":
                if quiet:
                    continue
                out.execution_count = n + 1
            outs.append(out)
        cell.outputs = outs
        n += 1
        cell.execution_count = n
    store(cache, text, executed)


def shows_no_result(source: str) -> bool:
    """Whether a learner's kernel shows no result for this cell: its last expression ends in
    ``;``. nbval runs cells with ``store_history=False``, and IPython looks for the ``;`` in the
    history (``DisplayHook.quiet``), so nbval receives the result anyway; the stored notebook
    drops it, as JupyterLab would."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return DisplayHook.semicolon_at_end_of_expression(
            TransformerManager().transform_cell(source)
        )
    except Exception:  # a cell IPython cannot tokenize showed an error, not a result
        return False


def pytest_runtest_makereport(item, call) -> None:
    # nbval keeps each cell's outputs on the item (``test_outputs``) once it ran
    # (a cell nbval skips, tag ``nbval-skip``, is stored without outputs)
    if call.when != "call" or not _is_nbval_cell(item):
        return
    outputs = item.parent.__dict__.setdefault("_ddp_lab_outputs", {})
    if call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception):
        outputs[item.cell_num] = []
    elif call.excinfo is None and item.test_outputs is not None:
        outputs[item.cell_num] = list(item.test_outputs)
