"""Notebook helpers: language detection, translated labels, Chinese text in figures."""

from __future__ import annotations

import warnings

import pytest

import ddp_lab as dl
from ddp_lab import i18n
from ddp_lab.course import notebook


def test_detect_language_from_env_session_and_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("DDP_LAB_LANG", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/ddp-lab/notebooks/zh/03_dp.ipynb")
    assert notebook.detect_language() == "zh"
    monkeypatch.delenv("JPY_SESSION_NAME")
    (tmp_path / "en").mkdir()
    monkeypatch.chdir(tmp_path / "en")
    assert notebook.detect_language() == "en"
    monkeypatch.chdir(tmp_path)
    assert notebook.detect_language() == "en"
    monkeypatch.setenv("DDP_LAB_LANG", "zh")
    assert notebook.detect_language() == "zh"


def test_tr_follows_language():
    try:
        dl.set_language("zh")
        assert dl.tr(en="time", zh="时间") == "时间"
    finally:
        i18n.set_language("en")
    assert dl.tr(en="time", zh="时间") == "time"


def test_chinese_text_renders_without_missing_glyphs():
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    assert notebook.use_cjk_font() == notebook.CJK_FONT_NAME
    fig, ax = plt.subplots()
    ax.set_title("全归约的耗时")
    ax.set_xlabel("进程数")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)"
        fig.canvas.draw()
    plt.close(fig)


def test_show_source_shows_package_code():
    shown = dl.show_source(dl.spawn)
    text = getattr(shown, "data", shown)
    assert "def spawn(" in text


def test_show_source_shows_in_the_middle_of_a_cell():
    # A real kernel: a show_source call followed by more code in the same cell (chapter 07's
    # Hogwild cell, 12's two in a row) showed nothing when it only returned the code.
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import ddp_lab as dl\n"
            "dl.show_source(dl.scratch)\n"
            "dl.show_source(dl.tr)\n"
            "print('after')"
        ),
        nbformat.v4.new_code_cell("dl.show_source(dl.compare)"),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    middle, last = nb.cells[0].outputs, nb.cells[1].outputs
    shown = [o["data"]["text/plain"] for o in middle if "data" in o]
    assert ["def scratch(" in s for s in shown] == [True, False]
    assert "def tr(" in shown[1]
    assert middle[-1]["text"] == "after\n"
    # as a cell's last expression it shows once, not twice
    assert [("def compare(" in o["data"]["text/plain"]) for o in last] == [True]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_setup_returns_language(lang):
    try:
        assert dl.setup(lang) == lang
        assert i18n.get_language() == lang
    finally:
        i18n.set_language("en")


@pytest.mark.parametrize("shutdown", ["graceful", "immediate"])
def test_scratch_folder_goes_away_with_the_kernel(tmp_path, monkeypatch, shutdown):
    # A real kernel, shut down as JupyterLab does ("graceful": atexit runs) or killed as nbval
    # does ("immediate": SIGKILL, no atexit): the folder and what the notebook wrote in it are
    # gone after, and nothing is left in TMPDIR.
    import os
    import time

    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's tempfile.gettempdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import ddp_lab as dl\n"
            "work = dl.scratch('ch99')\n"
            "(work / 'ckpt').mkdir()\n"
            "(work / 'ckpt' / 'step_1.pt').write_bytes(b'x')\n"
            "print(dl.scratch('ch99b'))\n"
            "print(work)"
        )
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3", shutdown_kernel=shutdown).execute()
    folders = nb.cells[0].outputs[0]["text"].split()
    assert len(folders) == 2 and all(f.startswith(str(tmp_path / "ddp_lab_ch99")) for f in folders)
    deadline = time.monotonic() + 30  # the reaper notices the kernel's end at once; a busy machine
    while any(os.path.exists(f) for f in folders) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f) for f in folders)
    assert list(tmp_path.iterdir()) == []
