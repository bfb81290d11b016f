"""The course as a learner meets it: JupyterLab in headless Chromium, widgets moved by hand.

An executed-notebook test (nbval) cannot see whether a widget shows up in JupyterLab: a
missing labextension, a front-end version mismatch or an output that only renders as text
all pass nbval. Here a real JupyterLab (from this project's environment, on a free
localhost port, no token) serves copies of the lesson notebooks, headless Chromium
(Debian's ``chromium``, driven by Playwright) opens each widget chapter in both languages,
runs it up to and including its widget cells through JupyterLab's Run menu, and checks
what a learner sees:

- the controls render as widgets (sliders, dropdowns), not as text;
- moving a control redraws the figure (the image data changes) or the table it drives;
- matplotlib figures appear as images;
- a multi-process cell prints its ``[rank N]`` lines in rank order;
- in the zh notebooks the widget labels are Chinese and no figure lost a glyph
  (matplotlib's "Glyph ... missing from font" warning), and the font ``dl.setup()`` picks
  covers every Chinese character the course draws.

Run alone:  .venv/bin/python -m pytest tests/course/test_browser.py   (or ``-m browser``)
Docs screenshots (docs/screenshots/, one per chapter and language):
    DDP_LAB_SCREENSHOTS=docs/screenshots .venv/bin/python -m pytest tests/course/test_browser.py
When a check fails, a screenshot of the page is saved under pytest's tmp dir (path printed).
Chromium comes from ``apt-get install chromium`` (test.sh does it when it can); without it,
or without Playwright, the browser tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from _servers import Jupyter, chromium, jupyter, require_chromium

from ddp_lab.i18n import _t

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_MS = 240_000  # running a notebook up to its widgets (a few seconds to ~1 min)
UI_TIMEOUT_MS = 30_000  # anything else the page has to do
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
# what Chromium shows for a soft line break left between two CJK characters (issue 18)
CJK_SPACE = re.compile(
    r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]\s+[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]"
)

pytestmark = pytest.mark.browser


# --------------------------------------------------------------------------------------
# What each widget chapter must show, and how a learner moves its controls
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chapter:
    notebook: str
    widget_cells: tuple[str, ...]  # a unique piece of each widget cell's source, in order
    labels: dict[str, tuple[str, ...]]  # texts on the first widget's controls, per language
    move: Callable  # (page, widget cell) -> None: move a control, wait for the redraw
    rank_cell: str | None = None  # a multi-process cell whose [rank N] lines are checked
    rank_order: tuple[int, ...] = ()  # the rank of each of its [rank N] lines, in order
    figure_cell: str | None = None  # a plain matplotlib cell (image outside any widget)


def _image_src(cell) -> str:
    img = cell.locator(".jupyter-widgets img").first
    img.wait_for(timeout=UI_TIMEOUT_MS)
    return img.get_attribute("src") or ""


def _wait_image_changed(cell, before: str) -> None:
    """Wait until the widget's image is a new picture (the data URI changed)."""
    handle = cell.element_handle()
    cell.page.wait_for_function(
        """([cell, before]) => {
            const img = cell.querySelector('.jupyter-widgets img');
            return img !== null && img.src.startsWith('data:image/png') && img.src !== before;
        }""",
        arg=[handle, before],
        timeout=UI_TIMEOUT_MS,
    )


def _nudge_slider(cell, index: int, key: str = "ArrowRight") -> None:
    """Move slider ``index`` of the cell's widgets one step, as a keyboard user does."""
    handle = cell.locator(".widget-slider .noUi-handle").nth(index)
    handle.focus()
    handle.press(key)


def move_compat(page, cell) -> None:  # 01: two dropdowns over a bar chart and a verdict
    before, verdict = _image_src(cell), cell.locator(".widget-html").first.inner_text()
    select = cell.locator(".widget-dropdown select").first
    options = select.locator("option").all_inner_texts()
    current = select.input_value()
    select.select_option(label=options[0] if options[0] != current else options[1])
    _wait_image_changed(cell, before)
    cell.page.wait_for_function(
        "([c, v]) => c.querySelector('.widget-html').innerText !== v",
        arg=[cell.element_handle(), verdict],
        timeout=UI_TIMEOUT_MS,
    )


def move_rank_table(page, cell) -> None:  # 02: sliders over a picture and a rank table
    rows = cell.locator(".jp-OutputArea-output table tr")
    rows.first.wait_for(timeout=UI_TIMEOUT_MS)
    assert rows.count() == 1 + 2 * 4  # header + nnodes=2 x nproc_per_node=4
    before = _image_src(cell)
    _nudge_slider(cell, 0)  # nnodes 2 -> 3
    _wait_image_changed(cell, before)
    page.wait_for_function(
        "c => c.querySelectorAll('.jp-OutputArea-output table tr').length === 1 + 3 * 4",
        arg=cell.element_handle(),
        timeout=UI_TIMEOUT_MS,
    )


def move_chunk_sizes(page, cell) -> None:  # 03: interactive() with three sliders
    before = _image_src(cell)
    _nudge_slider(cell, 1)  # num_devices 4 -> 5
    _wait_image_changed(cell, before)


def move_ring(page, cell) -> None:  # 05: N and step sliders over the ring picture
    before = _image_src(cell)
    _nudge_slider(cell, 1)  # step 0 -> 1
    _wait_image_changed(cell, before)


def move_sampler(page, cell) -> None:  # 06: sliders and checkboxes over the assignment grid
    before = _image_src(cell)
    _nudge_slider(cell, 1)  # num_replicas 4 -> 5
    _wait_image_changed(cell, before)


def move_costs(page, cell) -> None:  # 04: four sliders over the cost curves
    before = _image_src(cell)
    _nudge_slider(cell, 0)  # max N 16 -> 17
    _wait_image_changed(cell, before)


def move_buckets(page, cell) -> None:  # 07: a selection slider over bucket_cap_mb
    before = _image_src(cell)
    _nudge_slider(cell, 0)  # 0.5 MB -> 1 MB: other buckets
    _wait_image_changed(cell, before)


CHAPTERS = {
    "01": Chapter(
        "01_gpu_stack.ipynb",
        ("cc.compat_widget(",),
        {"en": ("driver", "CUDA runtime"), "zh": ("驱动", "CUDA 运行时")},
        move_compat,
    ),
    "02": Chapter(
        "02_processes_and_ranks.ipynb",
        ("ranks.rank_table_widget(",),
        {"en": ("nnodes", "GPUs/node"), "zh": ("nnodes", "每节点 GPU")},
        move_rank_table,
        figure_cell='ax.set_title(dl.tr(en="Two equal jobs',
    ),
    "03": Chapter(
        "03_data_parallel.ipynb",
        ("viz.chunk_sizes_widget()",),
        {"en": ("batch size", "devices"), "zh": ("批大小", "设备数")},
        move_chunk_sizes,
    ),
    "04": Chapter(
        "04_collectives.ipynb",
        ("costs.cost_widget()",),
        {"en": ("max N", "size (MiB)"), "zh": ("最大 N", "消息大小（MiB）")},
        move_costs,
    ),
    "05": Chapter(
        "05_ring_allreduce.ipynb",
        ("ring.ring_widget(4)", "ring.ring_widget(traces=traces)"),
        {"en": ("N", "step"), "zh": ("N", "步")},
        move_ring,
    ),
    "06": Chapter(
        "06_distributed_sampler.ipynb",
        ("sampler.sampler_widget(",),
        {"en": ("dataset length", "num_replicas"), "zh": ("数据集长度", "num_replicas")},
        move_sampler,
        rank_cell="dl.spawn(epochs_on_rank, args=(False,)",
        rank_order=(0, 0, 0, 1, 1, 1) * 2,  # two dl.spawn calls, 3 lines per rank each
    ),
    "07": Chapter(
        "07_ddp_from_scratch.ipynb",
        ("bucket_widget(wide_mlp()",),
        {"en": ("bucket_cap_mb",), "zh": ("bucket_cap_mb",)},
        move_buckets,
        rank_cell="torch.manual_seed(rank)  # a different",  # a %%ranks cell (persistent)
        rank_order=(0, 1),
    ),
}


# --------------------------------------------------------------------------------------
# JupyterLab and Chromium
# --------------------------------------------------------------------------------------


def _write_settings(settings: Path) -> None:
    """Lab settings for a test: every cell in the DOM, no news, no update check."""
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.fixture(scope="module")
def chromium_ready() -> None:
    require_chromium()
    try:
        import jupyterlab  # noqa: F401
    except ImportError as err:
        pytest.skip(f"JupyterLab is not installed ({err}): DDP_LAB_EXTRAS=test bash setup.sh")


@pytest.fixture(scope="module")
def lab(chromium_ready, tmp_path_factory) -> Iterator[Jupyter]:
    """JupyterLab on a free localhost port, serving copies of the lesson notebooks."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    for lang in ("en", "zh"):
        (root / "notebooks" / lang).mkdir(parents=True)
        for chapter in CHAPTERS.values():
            shutil.copy(ROOT / "notebooks" / lang / chapter.notebook, root / "notebooks" / lang)
        (root / "exercises" / lang).mkdir(parents=True)
        shutil.copy(ROOT / "exercises" / lang / EXERCISE, root / "exercises" / lang)
    _write_settings(tmp / "settings")
    with jupyter(
        tmp,
        root,
        app="jupyterlab",
        args=[
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LanguageServerManager.autodetect=False",
            "--ServerApp.terminals_enabled=False",
            "--LabApp.extension_manager=readonly",
        ],
        # a learner's kernel draws inline figures and takes its language from the path
        drop_env=("MPLBACKEND", "DDP_LAB_LANG"),
        env={
            "JUPYTER_PREFER_ENV_PATH": "1",
            "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
            "IPYTHONDIR": str(tmp / "ipython"),
            "PYTHONUNBUFFERED": "1",
        },
    ) as server:
        yield server


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("fonts")) as browser:
        yield browser


@contextmanager
def lab_page(browser, lab: Jupyter, lang: str, shot: Path) -> Iterator[object]:
    """A page of its own in ``browser``; a screenshot at ``shot`` when the test fails;
    JupyterLab's kernels shut down after it (one at a time: 2 cores, torch in each)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=lang)
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield page
    except BaseException:
        try:
            page.screenshot(path=shot, full_page=True)
            print(f"screenshot of the failing page: {shot}")
        except Exception as err:  # noqa: BLE001
            print(f"no screenshot ({err})")
        raise
    finally:
        context.close()
        lab.shutdown_kernels()


# --------------------------------------------------------------------------------------
# Driving a notebook
# --------------------------------------------------------------------------------------


def code_cell(page, snippet: str):
    """The notebook's code cell whose source contains ``snippet`` (exactly one)."""
    cells = page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea-editor", has_text=snippet)
    )
    cells.first.wait_for()
    assert cells.count() == 1, f"{cells.count()} code cells contain {snippet!r}"
    return cells.first


def run_through(page, cell) -> None:
    """Run every cell above ``cell`` and ``cell`` itself, with JupyterLab's Run menu."""
    following = cell.locator("xpath=following-sibling::div[contains(@class, 'jp-Cell')][1]")
    following.locator(".jp-InputPrompt").click()  # select the next cell (command mode)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
    page.get_by_role("menuitem", name="Run All Above Selected Cell").click()
    # done: the last widget cell has an execution count, or a cell failed (traceback)
    page.wait_for_function(
        """c => /\\[\\d+\\]/.test(c.querySelector('.jp-InputPrompt').textContent) ||
                [...document.querySelectorAll('.jp-OutputArea-output')]
                    .some(o => o.textContent.includes('Traceback'))""",
        arg=cell.element_handle(),
        timeout=RUN_TIMEOUT_MS,
        polling=250,
    )


def output_texts(page) -> list[str]:
    return page.locator(".jp-Notebook .jp-OutputArea-output").all_inner_texts()


def check_chapter(page, lab: Jupyter, key: str, lang: str, shots: Path | None) -> None:
    chapter = CHAPTERS[key]
    # a workspace of its own: JupyterLab reopens nothing from an earlier page
    page.goto(f"{lab.url}/lab/workspaces/{key}-{lang}/tree/notebooks/{lang}/{chapter.notebook}")
    # the notebook is loaded and its kernel has started ("Python 3 (ddp-lab) | Idle")
    page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-editor").first.wait_for(
        timeout=UI_TIMEOUT_MS * 2
    )
    page.wait_for_function(
        "() => /\\| Idle/.test(document.querySelector('#jp-main-statusbar').innerText)",
        timeout=UI_TIMEOUT_MS * 2,
    )
    assert page.locator(".jp-NotebookPanel").count() == 1
    cells = [code_cell(page, s) for s in chapter.widget_cells]
    run_through(page, cells[-1])

    errors = [t for t in output_texts(page) if "Traceback" in t]
    assert not errors, f"a cell failed:\n{errors[0][-2000:]}"
    for snippet, cell in zip(chapter.widget_cells, cells, strict=True):
        out = cell.locator(".jp-OutputArea-output")
        # a widget view, not its text repr ("VBox(children=...)") or "Error displaying widget"
        cell.locator(".jupyter-widgets.widget-container, .jupyter-widgets.widget-box").first \
            .wait_for(timeout=UI_TIMEOUT_MS)  # fmt: skip
        text = " ".join(out.all_inner_texts())
        assert "Error displaying widget" not in text, text
        assert not re.search(r"\b(VBox|HBox|interactive)\(children=", text), text
        assert cell.locator(".widget-slider, .widget-dropdown select").count() > 0, snippet
        src = _image_src(cell)  # the figure the widget draws, as an image
        assert src.startswith("data:image/png"), src[:80]

    widget = cells[0]
    labels = " ".join(widget.locator(".widget-label, label").all_inner_texts())
    for label in chapter.labels[lang]:
        assert label in labels, f"{label!r} not among the controls' labels {labels!r}"
    if lang == "en":
        assert not CJK.search(labels), labels
    else:  # the rendered Chinese prose has no stray space between two CJK characters
        paragraphs = page.locator(".jp-MarkdownCell .jp-RenderedMarkdown :is(p, li)")
        texts = [t for t in paragraphs.all_inner_texts() if CJK.search(t)]
        assert texts, "no rendered Chinese paragraph found"
        stray = [m.group(0) for t in texts for m in CJK_SPACE.finditer(t)]
        assert not stray, f"{len(stray)} stray spaces between CJK characters, e.g. {stray[:5]}"

    if chapter.figure_cell:  # a figure outside any widget: plt.show() in a plain cell
        img = code_cell(page, chapter.figure_cell).locator(".jp-OutputArea-output img")
        assert (img.first.get_attribute("src") or "").startswith("data:image/png")

    if chapter.rank_cell:  # a multi-process cell: its [rank N] lines, in rank order
        outputs = code_cell(page, chapter.rank_cell).locator(".jp-OutputArea-output")
        lines = "\n".join(outputs.all_inner_texts()).splitlines()
        ranks = [int(m.group(1)) for line in lines if (m := re.match(r"\[rank (\d+)\]", line))]
        assert ranks == list(chapter.rank_order), lines

    # every figure drawn so far kept its glyphs (matplotlib warns when a font lacks one),
    # and no font warning at all sits in the learner's outputs
    texts = output_texts(page)
    missing = [t for t in texts if re.search(r"Glyph \d+ .*missing from", t)]
    assert not missing, missing[0]
    font_noise = [t for t in texts if "findfont:" in t]
    assert not font_noise, font_noise[0]

    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
        _save_small(widget.locator(".jp-Cell-outputArea"), shots / f"{key}_{lang}.png")

    chapter.move(page, widget)


def _save_small(locator, path: Path) -> None:
    """An element screenshot, as a 256-colour PNG (small enough for the repository)."""
    from PIL import Image

    locator.screenshot(path=path, animations="disabled")
    with Image.open(path) as img:
        small = img.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("key", sorted(CHAPTERS))
def test_widget_chapter_in_jupyterlab(key, lang, lab, browser, tmp_path):
    shots = os.environ.get("DDP_LAB_SCREENSHOTS")
    with lab_page(browser, lab, lang, tmp_path / f"failure_{key}_{lang}.png") as page:
        check_chapter(page, lab, key, lang, Path(shots) if shots else None)


# --------------------------------------------------------------------------------------
# An exercise notebook, as a newcomer opens it
# --------------------------------------------------------------------------------------

EXERCISE = "00_quickstart.ipynb"


def _run_cell(page, cell) -> None:
    """Run one cell as a learner does: click into it, Shift+Enter."""
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        "c => /\\[\\d+\\]/.test(c.querySelector('.jp-InputPrompt').textContent)",
        arg=cell.element_handle(),
        timeout=RUN_TIMEOUT_MS,
        polling=250,
    )


def check_exercise(page, lab: Jupyter, lang: str) -> None:
    from ddp_lab.course import build

    page.goto(f"{lab.url}/lab/workspaces/ex-{lang}/tree/exercises/{lang}/{EXERCISE}")
    page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-editor").first.wait_for(
        timeout=UI_TIMEOUT_MS * 2
    )
    page.wait_for_function(
        "() => /\\| Idle/.test(document.querySelector('#jp-main-statusbar').innerText)",
        timeout=UI_TIMEOUT_MS * 2,
    )
    status = page.locator("#jp-main-statusbar").inner_text()
    assert "Python 3 (ddp-lab)" in status, status  # the kernel setup.sh installs
    # Opened and connected, the notebook is unmodified: no dot on its tab, nothing to save
    # (the kernel's language_info, which JupyterLab writes in on open, is the stored one).
    page.wait_for_timeout(1500)
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=EXERCISE)
    assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), tab.get_attribute("class")
    # before any work: no pass line reads as a verdict; the target is labelled as such
    label = _t("when solved, this cell prints: ", lang).strip()
    passed = build.grade_pass_line("00.average", 2, lang)
    target = build.notebook_pass_output("00.average", 2, lang)  # the pass line, then a note
    graded = code_cell(page, 'dl.grade("00.average"')
    shown = graded.locator(".jp-OutputArea-output").inner_text().strip()
    assert shown == f"{label} {target}" or shown == label + target, shown
    verdict = passed.split()[0]  # "PASS" / "通过"
    for text in output_texts(page):
        for line in text.splitlines():
            assert not line.strip().startswith(verdict), line
    # run the setup and the stub as they are, then the graded cell: it says "not solved yet"
    _run_cell(page, code_cell(page, "dl.setup()"))
    _run_cell(page, code_cell(page, "def average_across_ranks("))
    _run_cell(page, graded)
    after = graded.locator(".jp-OutputArea-output").all_inner_texts()
    text = "\n".join(after)
    verdict_line = _t(
        "NOT ATTEMPTED {grade_id}: 0/{points} points.",
        lang,
        grade_id="00.average",
        points=2,
    )
    failed = verdict_line.split(" 00.average")[0]  # "NOT ATTEMPTED" / "未作答"
    assert f"{failed} 00.average" in text, text[-2000:]
    stub = _t(
        "The exercise is not solved yet (NotImplementedError: replace the stub with your code).",
        lang,
    )
    assert stub[:12] in text, text[-2000:]
    assert label not in text and passed not in text


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_exercise_as_a_newcomer_opens_it(lang, lab, browser, tmp_path):
    with lab_page(browser, lab, lang, tmp_path / f"failure_exercise_{lang}.png") as page:
        check_exercise(page, lab, lang)


# --------------------------------------------------------------------------------------
# The CJK font, without a browser
# --------------------------------------------------------------------------------------


def _course_chinese() -> set[str]:
    """Every Chinese character the course can put into a figure or a widget: the zh texts
    in the package and in the chapters' code cells."""
    chars: set[str] = set()
    for path in [*ROOT.joinpath("ddp_lab").rglob("*.py"), *ROOT.joinpath("chapters").glob("*.py")]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.lstrip().startswith("#"):  # markdown cells and comments are not drawn
                chars.update(CJK.findall(line))
    return chars


def test_setup_font_covers_the_chinese_the_course_draws():
    """``dl.setup()`` in a zh notebook makes matplotlib pick a font that has every glyph."""
    import matplotlib
    from fontTools.ttLib import TTFont
    from matplotlib import font_manager

    import ddp_lab as dl
    from ddp_lab import i18n

    before, lang = matplotlib.rcParams.copy(), i18n.get_language()
    try:
        dl.setup("zh")
        path = font_manager.findfont(
            font_manager.FontProperties(family=matplotlib.rcParams["font.family"]),
            fallback_to_default=False,
        )
        cmap = TTFont(path, fontNumber=0, lazy=True).getBestCmap()
    finally:
        i18n.set_language(lang)
        matplotlib.rcParams.update(before)
    chars = _course_chinese()
    assert len(chars) > 100, "found too few Chinese characters: is the scan broken?"
    missing = sorted(c for c in chars if ord(c) not in cmap)
    assert not missing, f"{Path(path).name} lacks {''.join(missing)}"


def test_bold_chinese_draws_without_a_warning(caplog):
    """The CJK font has one weight: bold Chinese (the sampler's padding cells) is drawn
    regular with no glyph missing and no "findfont: Failed to find font weight" line."""
    import warnings

    import matplotlib
    import matplotlib.pyplot as plt

    import ddp_lab as dl
    from ddp_lab import i18n

    before, lang = matplotlib.rcParams.copy(), i18n.get_language()
    try:
        dl.setup("zh")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig, ax = plt.subplots()
            ax.set_title("每个 rank 读取的样本", fontweight="bold")
            ax.text(0.5, 0.5, "填充 ×2", fontweight="bold")
            fig.canvas.draw()
            plt.close(fig)
    finally:
        i18n.set_language(lang)
        matplotlib.rcParams.update(before)
    assert not [str(w.message) for w in caught if "Glyph" in str(w.message)]
    assert not [r.getMessage() for r in caplog.records if "findfont" in r.getMessage()]
