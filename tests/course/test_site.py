"""The course website (``ddp-lab site``, course/site.py) and its cache of executed lessons.

The cheap checks run in every test run: the cache plugin keeps what nbval ran (and nothing of
a notebook that failed), exercise pages hold no solution, widgets become a note.

The browser checks need a built site: test.sh builds it from the cache after the notebooks
ran and then runs

    DDP_LAB_SITE=build/site .venv/bin/python -m pytest tests/course/test_site.py

Headless Chromium (as in test_browser.py) opens the site over a local HTTP server: the index,
a lesson in each language (its figures loaded), the twin link and the language switch, the
search in both languages, the copy buttons; no JavaScript error and no request leaves the
machine. ``DDP_LAB_SCREENSHOTS=docs/screenshots`` also saves screenshots there.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from _servers import chromium, static_site

from ddp_lab.cluster import STORED_RUNS as STORED
from ddp_lab.course import build, nbcache, site, site_run
from ddp_lab.i18n import _t

ROOT = Path(__file__).resolve().parents[2]
SITE = os.environ.get("DDP_LAB_SITE")
CHAPTER = "02_processes_and_ranks"  # a lesson with a figure and a widget


# --------------------------------------------------------------------------------------
# The cache and the pages, without a browser
# --------------------------------------------------------------------------------------


def test_nbcache_keeps_what_nbval_ran(tmp_path):
    good = nbformat.v4.new_notebook()
    good.cells = [
        nbformat.v4.new_markdown_cell("# t"),
        nbformat.v4.new_code_cell("print(6 * 7)"),
        nbformat.v4.new_code_cell("6 * 7"),
        nbformat.v4.new_code_cell("[6, 7];"),  # a learner's kernel shows no result
    ]
    bad = nbformat.v4.new_notebook()
    bad.cells = [nbformat.v4.new_code_cell("print(1)"), nbformat.v4.new_code_cell("1 / 0")]
    good_path, bad_path = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(good, good_path)
    nbformat.write(bad, bad_path)
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["-p", "ddp_lab.course.nbcache", "--nb-cache", str(cache), "--nbval-lax"]
        + ["--nbval-kernel-name", build.KERNEL_NAME, str(good_path), str(bad_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "1 failed" in proc.stdout, proc.stdout + proc.stderr
    assert nbcache.load(cache, bad_path.read_text()) is None  # a failed notebook is not kept
    ran = nbcache.load(cache, good_path.read_text())
    assert ran is not None, proc.stdout
    code = [c for c in ran.cells if c.cell_type == "code"]
    assert code[0].outputs[0]["text"] == "42\n"
    assert code[1].outputs[0]["data"]["text/plain"] == "42"
    assert code[2].outputs == []  # nbval received [6, 7] (course/nbcache.py, shows_no_result)
    assert [c.execution_count for c in code] == [1, 2, 3]
    assert sorted(p.name for p in cache.iterdir()) == [
        f"{nbcache.key(good_path.read_text())}.ipynb"
    ]


def _solution_lines(src: Path) -> set[str]:
    """Lines of code only between the solution markers of a chapter (long enough to be
    telling; a line also written outside a solution, e.g. in the lesson, is not one)."""
    inside_lines, outside_lines, inside = set(), set(), False
    for line in src.read_text(encoding="utf-8").splitlines():
        if build.BEGIN in line:
            inside = True
        elif build.END in line:
            inside = False
        else:
            code = line.split("  #", 1)[0].strip()  # a trailing comment does not count
            if len(code) > 25:
                (inside_lines if inside else outside_lines).add(code)
    return inside_lines - outside_lines


@pytest.fixture(scope="module")
def all_pages() -> list[site.Page]:
    return site.pages()


def test_exercise_pages_hold_no_solution(all_pages):
    pages = [p for p in all_pages if p.kind == "exercises"]
    assert {p.lang for p in pages} == {"en", "zh"}
    assert len(pages) >= 2 * 10
    found = 0
    for p in pages:
        nb = site.page_notebook(p, None, "https://example.org/ddp-lab")
        text = "\n".join(c.source for c in nb.cells)
        src = ROOT / "chapters" / f"{p.stem}.py"
        found += len(_solution_lines(src))
        leaked = [line for line in _solution_lines(src) if line in text]
        assert not leaked, (p.docname, p.lang, leaked[:3])
        assert _t("Run this chapter", p.lang) in text
    assert found > 50  # the scan sees the solutions it looks for


def test_widget_output_becomes_one_note(all_pages):
    page = next(p for p in all_pages if p.kind == "notebooks" and p.lang == "zh")
    nb = nbformat.reads(page.text, as_version=4)
    widget = {"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "w"}
    ran = nbformat.reads(page.text, as_version=4)
    first = next(c for c in ran.cells if c.cell_type == "code")
    first.outputs = [
        nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="}),
        nbformat.v4.new_output("display_data", data=widget),
        nbformat.v4.new_output("execute_result", data=widget, execution_count=1),
    ]
    out = site.page_notebook(page, ran, "")
    cell = [c for c in out.cells if c.cell_type == "code"][0]
    kinds = [sorted(o.get("data", {})) for o in cell.outputs]
    assert kinds == [["image/png"], ["text/markdown"]]
    assert "JupyterLab" in cell.outputs[1]["data"]["text/markdown"]
    assert len([c for c in out.cells if c.cell_type == "code"]) == len(
        [c for c in nb.cells if c.cell_type == "code"]
    )


def test_without_the_site_tools_a_clear_error(monkeypatch, tmp_path, capsys):
    from ddp_lab.course import cli

    monkeypatch.setattr(site, "missing_tools", lambda: ["sphinx", "myst_nb"])
    rc = cli.main(["site", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c")])
    assert rc == 2
    assert "sphinx, myst_nb" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def test_a_lesson_run_reports_the_cpu_of_its_kernel_and_its_processes(tmp_path):
    # The build logs each lesson's CPU seconds (a first build's time on an idle machine is
    # about the CPU time over the cores): the kernel's, and its child's that it waited for.
    nb = nbformat.v4.new_notebook()
    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 1.5: pass')"
    nb.cells = [
        nbformat.v4.new_code_cell("import os, subprocess, sys\nprint(os.getcwd())"),
        nbformat.v4.new_code_cell(f"subprocess.run([sys.executable, '-c', {burn!r}], check=True)"),
        nbformat.v4.new_code_cell(
            "from ipykernel.kernelapp import IPKernelApp\n"
            "print(IPKernelApp.instance().transport, IPKernelApp.instance().ip)"
        ),
    ]
    (tmp_path / "notebooks" / "en").mkdir(parents=True)
    page = site.Page("en", "00_t", "notebooks", "t", nb, nbformat.writes(nb))
    ran, cpu_s = site_run.execute_lesson(page, tmp_path)
    assert ran.cells[0].outputs[0]["text"].strip() == str(tmp_path / "notebooks" / "en")
    assert cpu_s is not None and 1.5 <= cpu_s < 60, cpu_s
    # Its kernel on Unix sockets in a folder of the run (no TCP port race), removed after.
    transport, ip = ran.cells[2].outputs[0]["text"].split()
    folder = Path(ip).parent
    assert transport == "ipc" and folder.name.startswith("ddp-lab-kernel-"), (transport, ip)
    assert not folder.exists()


def test_a_missed_wake_up_costs_one_slice_not_the_cell_timeout(monkeypatch):
    # A lost wake-up: the poll sees nothing until its timeout fires, then finds the message
    # (zmq.asyncio's poll looks again with poll(0) then). Unsliced, that is the whole timeout.
    monkeypatch.setattr(site_run, "POLL_SLICE_S", 0.01)
    asked: list[float | None] = []

    async def lost_wake_up(timeout=None):
        asked.append(timeout)
        await asyncio.sleep(0)
        if len(asked) < 3:
            raise queue.Empty
        return {"msg": "reply"}

    got = asyncio.run(site_run._sliced(lost_wake_up)(timeout=300))
    assert got == {"msg": "reply"} and len(asked) == 3
    assert all(t is not None and t <= 0.01 for t in asked), asked  # never the cell's 300 s
    asked.clear()
    assert asyncio.run(site_run._sliced(lost_wake_up)(timeout=None)) == {"msg": "reply"}
    assert all(t is not None and t <= 0.01 for t in asked), asked  # no timeout: slices too

    async def never(timeout=None):
        asked.append(timeout)
        raise queue.Empty

    with pytest.raises(queue.Empty):  # a real timeout still ends the wait
        asyncio.run(site_run._sliced(never)(timeout=0.05))


def test_the_site_shows_the_cluster_labs_stored_runs_unless_asked(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(site, "_build_site", lambda *a: seen.append(os.environ.get(STORED)))
    monkeypatch.delenv(STORED, raising=False)
    site.build_site(tmp_path / "out", tmp_path / "cache", tmp_path / "work")
    site.build_site(tmp_path / "out", tmp_path / "cache", tmp_path / "work", live_labs=True)
    monkeypatch.setenv(STORED, "zh")  # test.sh's: the learner's own setting is kept
    site.build_site(tmp_path / "out", tmp_path / "cache", tmp_path / "work")
    assert seen == ["1", None, "zh"]
    assert os.environ[STORED] == "zh"
    monkeypatch.delenv(STORED)
    site.build_site(tmp_path / "out", tmp_path / "cache", tmp_path / "work")
    assert STORED not in os.environ  # set for the build's kernels only


# --------------------------------------------------------------------------------------
# The built site in Chromium
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_site(tmp_path_factory) -> Path:
    """Two pages built with the site's Sphinx configuration (``site.conf_py``): seconds, not
    the course's build."""
    pytest.importorskip("sphinx_book_theme")
    src, out = tmp_path_factory.mktemp("small-src"), tmp_path_factory.mktemp("small-html")
    (src / "conf.py").write_text(site.conf_py("en", ""), encoding="utf-8")
    (src / "index.md").write_text("# Home\n\n```{toctree}\npage\n```\n", encoding="utf-8")
    (src / "page.md").write_text(
        "# Gradient buckets\n\nBuckets let the all-reduce overlap the backward pass.\n",
        encoding="utf-8",
    )
    subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(out)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return out


@pytest.mark.browser
def test_search_snippet_starts_at_the_content(small_site, tmp_path):
    # Sphinx takes a snippet from the page's first [role=main]: the theme's <main>, which
    # also holds the article header's buttons (theme switcher, download, search)
    with static_site(small_site) as url, chromium(tmp_path) as browser:
        pg = browser.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        page = "Gradient buckets Buckets let the all-reduce overlap the backward pass."
        home = "Home Gradient buckets"  # its title and its table of contents
        # in a title (before: "...System Settings Light Dark Gradient buckets..."); further in
        for word, want in (("gradient", [page, home]), ("overlap", [page])):
            pg.goto(f"{url}/search.html?q={word}")
            pg.wait_for_function(  # every result listed, and each one's snippet fetched
                "() => document.querySelector('#search-results .search-summary')?.innerText"
                " && document.querySelectorAll('#search-results ul.search li').length"
                " === document.querySelectorAll('#search-results ul.search li p.context').length",
                timeout=60_000,
            )
            snippets = pg.locator("#search-results ul.search li p.context").all_inner_texts()
            assert sorted(snippets) == sorted(want), (word, snippets)
        assert not errors, errors


@pytest.fixture(scope="module")
def site_url():
    if not SITE:
        pytest.skip(
            "no built site: DDP_LAB_SITE=build/site (test.sh builds it after the notebooks)"
        )
    root = Path(SITE).resolve()
    assert (root / "index.html").is_file(), f"no site at {root}"
    with static_site(root) as url:
        yield url


@pytest.fixture(scope="module")
def page(site_url, tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("fonts")) as browser:
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        pg.errors, pg.outside = [], []
        pg.on("pageerror", lambda err: pg.errors.append(str(err)))
        # (console.error is left out: the theme logs a first visit's empty colour setting
        # there; a failed load is caught by its response)
        pg.on(
            "response",
            lambda r: pg.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )
        pg.on(
            "request",
            lambda req: None if req.url.startswith(site_url) else pg.outside.append(req.url),
        )
        yield pg


def _shot(pg, name: str) -> None:
    shots = os.environ.get("DDP_LAB_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(shots) / name), full_page=False)


def _figures_loaded(pg) -> int:
    return pg.evaluate(
        "() => [...document.querySelectorAll('.cell_output img')]"
        ".filter(i => i.complete && i.naturalWidth > 0).length"
    )


CJK_CHAR = re.compile(r"[\u4e00-\u9fff]")
CJK_SPACE = re.compile(
    r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]\s+[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]"
)


@pytest.mark.browser
def test_site_in_a_browser(page, site_url):
    pg = page
    pg.goto(f"{site_url}/index.html")
    _shot(pg, "site_index.png")
    pg.click("a[hreflang=zh]")
    pg.wait_for_url("**/zh/index.html")
    assert pg.get_attribute("html", "lang").startswith("zh")
    toc = pg.locator(".bd-article a.reference.internal")
    assert toc.count() >= 2 * 12  # the lessons and the exercises

    # a zh lesson: outputs with figures, the code copy buttons, Chinese without stray spaces
    pg.goto(f"{site_url}/zh/{CHAPTER}.html")
    assert _figures_loaded(pg) >= 1
    assert pg.locator("button.copybtn").count() >= 1
    prose = pg.locator(".bd-article p").all_inner_texts()
    stray = [m.group(0) for t in prose for m in CJK_SPACE.finditer(t)]
    assert not stray, stray[:5]
    assert pg.locator(".admonition.tip").count() == 1  # "Run this chapter"
    _shot(pg, f"site_{CHAPTER[:2]}_zh.png")
    pg.locator(".cell_output img").first.scroll_into_view_if_needed()
    _shot(pg, f"site_{CHAPTER[:2]}_zh_figure.png")

    # a widget is a note to run the notebook
    assert "JupyterLab" in " ".join(pg.locator(".cell_output").all_inner_texts())

    # no stray space between Chinese characters on any zh lesson or exercise page
    for html in sorted((Path(SITE) / "zh").glob("[0-9]*.html")) + sorted(
        (Path(SITE) / "zh" / "exercises").glob("*.html")
    ):
        pg.goto(f"{site_url}/{html.relative_to(Path(SITE)).as_posix()}")
        prose = pg.locator(".bd-article p, .bd-article li").all_inner_texts()
        stray = [m.group(0) for t in prose for m in CJK_SPACE.finditer(t)]
        assert not stray, (html.name, stray[:5])
    pg.goto(f"{site_url}/zh/{CHAPTER}.html")

    # the twin link in the header goes to the same lesson in English, and back
    pg.locator(".bd-header-article .ddp-lab-twin").click()
    pg.wait_for_url(f"**/en/{CHAPTER}.html")
    assert pg.get_attribute("html", "lang") == "en"
    assert _figures_loaded(pg) >= 1
    _shot(pg, f"site_{CHAPTER[:2]}_en.png")
    pg.locator(".bd-header-article .ddp-lab-twin").click()
    pg.wait_for_url(f"**/zh/{CHAPTER}.html")

    # every page of both languages has a twin link that resolves to a page of the site
    for lang, other in (("en", "zh"), ("zh", "en")):
        for html in sorted((Path(SITE) / lang).glob("**/*.html")):
            rel = html.relative_to(Path(SITE) / lang).as_posix()
            if rel.startswith("_"):
                continue
            text = html.read_text(encoding="utf-8")
            up = "../" * rel.count("/")
            assert f'href="../{up}{other}/{rel}"' in text, (lang, rel)
            assert (Path(SITE) / other / rel).is_file(), (other, rel)

    # an exercise page: the stubs, not the solutions
    pg.goto(f"{site_url}/en/exercises/05_ring_allreduce.html")
    assert "NotImplementedError" in pg.inner_text(".bd-article")

    # search works offline, in both languages
    pg.goto(f"{site_url}/en/search.html?q=rank")
    pg.wait_for_selector("#search-results ul.search li", timeout=30_000)
    title = build.jupytext.read(ROOT / "chapters" / f"{CHAPTER}.py").metadata["ddp_lab"]
    word = "".join(CJK_CHAR.findall(title["title"]["zh"]))[
        :2
    ]  # the first two characters of its title
    pg.goto(f"{site_url}/zh/search.html?q={word}")
    pg.wait_for_selector("#search-results ul.search li", timeout=30_000)

    # a phone-sized screen
    pg.set_viewport_size({"width": 390, "height": 844})
    pg.goto(f"{site_url}/zh/{CHAPTER}.html")
    _shot(pg, f"site_{CHAPTER[:2]}_zh_phone.png")

    assert not pg.errors, pg.errors
    assert not pg.outside, pg.outside  # nothing fetched from outside the site
