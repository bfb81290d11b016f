"""course/nbtraces.py: a notebook cell that shows a C++ stack trace fails, unless it is tagged."""

from __future__ import annotations

import subprocess
import sys

import nbformat

from ddp_lab.course import build, nbtraces

# A real c10::Error with its frames: torch prints them where TORCH_SHOW_CPP_STACKTRACES is set
# before it is imported (the kernel is fresh for each notebook).
SETUP = 'import os\nos.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"\nimport torch'
FAILS_IN_CPP = (
    "try:\n    torch.ones(2) @ torch.ones(3)\nexcept RuntimeError as err:\n    print(err)"
)


def test_a_cell_that_prints_a_cpp_trace_fails_unless_tagged(tmp_path):
    nb = nbformat.v4.new_notebook()
    tagged = nbformat.v4.new_code_cell(FAILS_IN_CPP)
    tagged.metadata["tags"] = ["lesson", nbtraces.TAG]
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(FAILS_IN_CPP),  # the learner would read the frames
        tagged,  # a failing run shown on purpose
        nbformat.v4.new_code_cell('print("no exception was raised from here")'),
        nbformat.v4.new_code_cell("[print(r) for r in range(2)]"),  # a result of Nones
        nbformat.v4.new_code_cell("[print(r) for r in range(2)];"),  # ... the learner never sees
        nbformat.v4.new_code_cell("[None, 1]"),
    ]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf"]
        + ["-p", "ddp_lab.course.nbtraces", "--nbval-lax"]
        + ["--nbval-kernel-name", build.KERNEL_NAME, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert "2 failed, 5 passed" in out, out
    assert "lesson.ipynb::Cell 1" in out and "Exception raised from dot_check" in out, out
    assert "lesson.ipynb::Cell 4" in out and "the cell's result is '[None, None]'" in out, out
    assert nbtraces.TAG in out, out  # the failure says how to mark a cell that means it


def test_cpp_trace_reads_every_kind_of_output():
    line = "Exception raised from add at store.cpp:7 (most recent call first):"
    assert nbtraces.cpp_trace([]) is None
    assert nbtraces.cpp_trace([{"output_type": "stream", "text": "ok\n"}]) is None
    assert nbtraces.cpp_trace([{"output_type": "stream", "text": f"x\n{line}\n#0 f\n"}]) == line
    shown = {"output_type": "display_data", "data": {"text/html": [f"<pre>{line}", "</pre>"]}}
    assert nbtraces.cpp_trace([shown]) == line + "</pre>"


def test_nothing_shown_reads_results_and_the_closing_semicolon():
    def result(text):
        return [{"output_type": "execute_result", "data": {"text/plain": text}}]

    assert nbtraces.nothing_shown(result("[None, None]"), "dl.spawn(f, 2)") == "[None, None]"
    assert nbtraces.nothing_shown(result("(None,)"), "f()") == "(None,)"
    assert nbtraces.nothing_shown(result("[None,\n None]"), "f()") == "[None,\n None]"
    assert nbtraces.nothing_shown(result("[None, None]"), "dl.spawn(f, 2);  # quiet") is None
    assert nbtraces.nothing_shown(result("[None, 0]"), "f()") is None
    assert nbtraces.nothing_shown(result("None"), "f()") is None  # IPython never shows None
    printed = [{"output_type": "stream", "name": "stdout", "text": "[None, None]\n"}]
    assert nbtraces.nothing_shown(printed, "print([None, None])") is None  # printed on purpose
