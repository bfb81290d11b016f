"""``ddp-lab site``: the course as a static website (Sphinx + MyST-NB + sphinx-book-theme).

From the chapter sources (through course/build.py, in memory) it writes a Sphinx project per
language under ``WORK/src/<lang>/`` and builds it into ``OUT/<lang>/``:

- ``index``: the chapters in order, then the exercises;
- one page per lesson, with its outputs: the executed notebook is taken from the cache
  (course/nbcache.py: the test run's outputs, keyed by a hash of the notebook), and only a
  lesson that is not there is run (nbclient) and then stored;
- ``exercises/<chapter>``: the exercise notebook as a learner receives it, not run (its
  solutions are stubs; solutions/ is never read);
- every page has a link to its twin in the other language (the same path under the other
  language's folder) in the header and the sidebar, and a "Run this chapter" box.

Widgets cannot move on a static page: a widget's output is replaced by a note that says to
run the chapter. ``OUT/index.html`` lets the reader pick a language. Sphinx rebuilds only the
pages whose source changed (its environment is kept in ``WORK``), and the sources are written
only when they change, so a rebuild after editing one chapter re-runs and re-renders that one.

What each page holds is ``course/site_pages.py`` (re-exported here); this module writes the
Sphinx projects, runs the lessons missing from the cache and builds the site.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from ddp_lab.cluster import STORED_RUNS
from ddp_lab.course import build, nbcache
from ddp_lab.course.site_pages import (
    THEME,
    WIDGET_MIME,
    Page,
    _static,
    index_markdown,
    page_notebook,
    pages,
    root_index,
    run_this_chapter,
)
from ddp_lab.i18n import _t

__all__ = [
    "CELL_TIMEOUT",
    "THEME",
    "WIDGET_MIME",
    "Page",
    "build_site",
    "conf_py",
    "default_repo_url",
    "https_url",
    "index_markdown",
    "missing_tools",
    "page_notebook",
    "pages",
    "root_index",
    "run_this_chapter",
    "site_main",
    "_static",
]

CELL_TIMEOUT = 300


def _tree_cpu(pid: int | None) -> float | None:
    """CPU seconds of process ``pid`` and every process under it, those it waited for
    included (a rank that ended and was reaped); None without psutil or the process."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except (psutil.Error, TypeError, ValueError):
        return None
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended meanwhile: its parent's children_* count it
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _execute(page: Page, root: Path) -> tuple[nbformat.NotebookNode, float | None]:
    """Run a lesson as the tests do: in its folder, with the course's kernel. Returns the
    notebook and the CPU seconds its kernel and the kernel's processes used (None where
    that cannot be read)."""
    from nbclient import NotebookClient

    class Client(NotebookClient):
        cpu_s: float | None = None

        async def _async_cleanup_kernel(self) -> None:
            process = getattr(getattr(self.km, "provisioner", None), "process", None)
            self.cpu_s = _tree_cpu(getattr(process, "pid", None))  # before it shuts down
            await super()._async_cleanup_kernel()

    nb = nbformat.reads(page.text, as_version=4)
    client = Client(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=build.KERNEL_NAME,
        # ipykernel warns "Kernel is running over TCP without encryption" at every start: the
        # kernel listens on 127.0.0.1 for this build only; the warning alarms and tells nothing.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        resources={"metadata": {"path": str(root / page.kind / page.lang)}},
    )
    client.execute()
    return nb, client.cpu_s


def conf_py(lang: str, repo_url: str) -> str:
    """The Sphinx configuration of one language's site."""
    other = "zh" if lang == "en" else "en"
    options = {
        "article_header_end": ["lang-switch.html", "article-header-buttons.html"],
        "use_download_button": True,
        "use_fullscreen_button": False,
        "show_toc_level": 2,
        "home_page_in_toc": True,
    }
    if repo_url:
        options.update(repository_url=repo_url, use_repository_button=True)
    settings = {
        "project": "ddp-lab",
        "html_title": _t("PyTorch data-parallel training from the inside", lang),
        # zh_CN: Sphinx's own words (the search page's status line) come in Chinese; the
        # search index still uses the zh (jieba) splitter (sphinx/search/__init__.py).
        "language": "zh_CN" if lang == "zh" else lang,
        "extensions": ["myst_nb", "sphinx_copybutton", "sphinx-mathjax-offline"],
        "myst_enable_extensions": ["dollarmath", "amsmath", "colon_fence"],
        "nb_execution_mode": "off",  # outputs come from the cache (ddp-lab site)
        "nb_merge_streams": True,
        "html_theme": "sphinx_book_theme",
        "html_theme_options": options,
        "html_sidebars": {
            "**": [
                "navbar-logo.html",
                "lang-switch.html",
                "search-button-field.html",
                "sbt-sidebar-nav.html",
            ]
        },
        "templates_path": [str(THEME / "templates")],
        "html_static_path": [str(THEME / "static")],
        "html_css_files": ["ddp-lab-site.css"],
        # search snippets start at the page's content, not at the article header's buttons
        "html_js_files": ["ddp-lab-search.js"],
        "html_copy_source": True,  # the header's download button offers the page's notebook
        "html_show_sourcelink": False,
        "html_last_updated_fmt": None,
        "exclude_patterns": ["**.ipynb_checkpoints"],
        "suppress_warnings": ["mystnb.unknown_mime_type", "misc.highlighting_failure"],
        "copybutton_exclude": ".linenos, .gp, .go",
    }
    body = "".join(f"{k} = {v!r}\n" for k, v in settings.items())
    return (
        "# Generated by `ddp-lab site` (ddp_lab/course/site.py); edits here are overwritten.\n"
        + body
        + f"""

def _twin(app, pagename, templatename, context, doctree):
    # the same page in the other language's site, next to this one
    up = "../" * (pagename.count("/") + 1)
    context["ddp_twin_url"] = f"{{up}}{other}/{{pagename}}.html"
    context["ddp_twin_lang"] = {other!r}


def setup(app):
    app.connect("html-page-context", _twin)
    # Sphinx 9.0's Chinese search data ends with `window.Stemmer = ChineseStemmer`, a name it
    # never defines (its stemmer is the English one, for Latin words): the search page then
    # stops with a ReferenceError. Name the stemmer it ships.
    from sphinx.search.zh import SearchChinese

    if SearchChinese.js_stemmer_rawcode == "english-stemmer.js":

        class _SearchChinese(SearchChinese):
            language_name = "English"

        app.add_search_language(_SearchChinese)
"""
    )


def _write(path: Path, text: str) -> bool:
    """Write ``text`` unless ``path`` holds it already (Sphinx rebuilds by mtime)."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True


def build_site(
    out: Path,
    cache: Path,
    work: Path,
    root: Path = build.ROOT,
    repo_url: str = "",
    missing: str = "run",
    jobs: int = 2,
    log=None,
    live_labs: bool = False,
) -> dict[str, float]:
    """Build the site into ``out``; return timings (seconds) and counts.

    Lessons missing from the cache run ``jobs`` at a time (each in its own kernel); the two
    languages' Sphinx builds run side by side. The cluster labs of chapters 04, 09 and 11
    (local hosts, Slurm) show their stored real runs, as their pages say, unless
    ``live_labs`` or ``DDP_LAB_STORED_RUNS`` is set (``ddp_lab.cluster``).
    """
    import functools
    import tempfile
    import threading

    log = log or functools.partial(print, flush=True)  # a redirected log shows each line now
    t0 = time.monotonic()
    # Kernels' and Sphinx's temporary files (dl.scratch folders, dl.spawn launches, kernel
    # connection files, jieba's dictionary cache) go in WORK/tmp, emptied at each start: a
    # killed build leaves nothing in /tmp.
    tmp = work / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    saved_tmp = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(tmp), str(tmp)
    # A page shows what a lab printed; building hosts or a Slurm cluster for it costs a first
    # build minutes (and root), and the stored run is a real one, dated, with its command.
    stored = None if live_labs or STORED_RUNS in os.environ else "1"
    if stored:
        os.environ[STORED_RUNS] = stored
    try:
        return _build_site(out, cache, work, root, repo_url, missing, jobs, log, t0, threading)
    finally:
        if stored:
            os.environ.pop(STORED_RUNS, None)
        if saved_tmp[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_tmp[0]
        tempfile.tempdir = saved_tmp[1]
        shutil.rmtree(tmp, ignore_errors=True)


def _build_site(out, cache, work, root, repo_url, missing, jobs, log, t0, threading):
    all_pages = pages(root)
    stats = {"executed": 0, "cached": 0, "blank": 0}
    runs: dict[int, nbformat.NotebookNode | None] = {}
    todo = []
    for i, p in enumerate(all_pages):
        if p.kind != "notebooks":
            continue
        runs[i] = nbcache.load(cache, p.text)
        where = f"notebooks/{p.lang}/{p.stem}.ipynb"
        if runs[i] is not None:
            stats["cached"] += 1
        elif missing == "fail":
            raise SystemExit(f"no cached run of {where} in {cache} (`--missing run` runs it)")
        elif missing == "blank":
            log(f"{where}: not in the cache, shown without outputs")
            stats["blank"] += 1
        else:
            todo.append(i)
    t = time.monotonic()
    if todo:
        from concurrent.futures import ThreadPoolExecutor

        lock, started, cpu_total = threading.Lock(), [0], [0.0]

        def run(i: int) -> None:
            p = all_pages[i]
            with lock:
                started[0] += 1
                k = started[0]
            log(f"[{k}/{len(todo)}] running notebooks/{p.lang}/{p.stem}.ipynb ...")
            t_one = time.monotonic()
            runs[i], cpu_s = _execute(p, root)
            nbcache.store(cache, p.text, runs[i])
            cpu = "" if cpu_s is None else f", {cpu_s:.0f} s CPU"
            with lock:
                cpu_total[0] += cpu_s or 0.0
            log(
                f"[{k}/{len(todo)}] notebooks/{p.lang}/{p.stem}.ipynb: "
                f"{time.monotonic() - t_one:.0f} s{cpu}"
            )

        backend = os.environ.pop("MPLBACKEND", None)  # a learner's kernel draws inline
        try:
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                list(pool.map(run, todo))  # the first error stops the build
        finally:
            if backend is not None:
                os.environ["MPLBACKEND"] = backend
        stats["executed"] = len(todo)
        stats["execute_cpu_s"] = round(cpu_total[0], 1)
    stats["execute_s"] = round(time.monotonic() - t, 1)

    procs = {}
    for lang in build.LANGS:
        src = work / "src" / lang
        mine = [(i, p) for i, p in enumerate(all_pages) if p.lang == lang]
        wanted = {"conf.py", "index.md"}
        for i, p in mine:
            rel = f"{p.docname}.ipynb"
            wanted.add(rel)
            _write(src / rel, nbformat.writes(page_notebook(p, runs.get(i), repo_url)))
        lessons = [p for _, p in mine if p.kind == "notebooks"]
        exercises = [p for _, p in mine if p.kind == "exercises"]
        _write(src / "conf.py", conf_py(lang, repo_url))
        _write(src / "index.md", index_markdown(lang, lessons, exercises))
        for f in src.rglob("*"):  # a chapter that is gone leaves no page behind
            if f.is_file() and f.relative_to(src).as_posix() not in wanted:
                f.unlink()
        # Sphinx writes into WORK/html/<lang>/site (MyST-NB writes its own files next to the
        # output folder: one such folder per language), then the result is copied to OUT/<lang>.
        procs[lang] = subprocess.Popen(
            [sys.executable, "-m", "sphinx", "-b", "html", "-q"]
            + ["-d", str(work / "doctrees" / lang), str(src), str(work / "html" / lang / "site")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    log(_t("Sphinx: building the {n} pages of each language ...", n=len(all_pages) // 2))
    t = time.monotonic()
    failed = []
    for lang, proc in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode:
            failed.append(f"sphinx failed for {lang}:\n{stdout}\n{stderr}")
        elif stderr.strip():
            log(stderr.strip())
    if failed:
        raise SystemExit("\n".join(failed))
    stats["sphinx_s"] = round(time.monotonic() - t, 1)
    for lang in build.LANGS:
        shutil.rmtree(out / lang, ignore_errors=True)
        shutil.copytree(
            work / "html" / lang / "site", out / lang, ignore=shutil.ignore_patterns(".buildinfo*")
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(root_index(all_pages, repo_url), encoding="utf-8")
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ as it is
    stats["total_s"] = round(time.monotonic() - t0, 1)
    return stats


def default_repo_url(root: Path = build.ROOT) -> str:
    """The repository readers are told to clone: GitHub Actions' repository, else this
    checkout's ``origin`` when it is a public https URL, else none (a placeholder is shown)."""
    if os.environ.get("GITHUB_REPOSITORY"):
        server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
        return f"{server}/{os.environ['GITHUB_REPOSITORY']}"
    proc = subprocess.run(
        ["git", "-C", str(root), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
    )
    return https_url(proc.stdout.strip())


def https_url(url: str) -> str:
    """A git remote as the https URL readers can clone without credentials: ``git@host:o/r``
    and ``ssh://git@host/o/r`` become ``https://host/o/r``; a URL with a password, a local
    path or anything else: "" (the box then shows a placeholder)."""
    import re

    m = re.fullmatch(r"(?:ssh://)?git@([\w.-]+)[:/]([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    if m:
        return f"https://{m.group(1)}/{m.group(2)}"
    return url if url.startswith("https://") and "@" not in url else ""


def missing_tools() -> list[str]:
    """The modules of the ``site`` extra that are not installed."""
    import importlib.util

    wanted = ("sphinx", "myst_nb", "sphinx_book_theme", "sphinx_copybutton", "jieba")
    return [m for m in wanted if importlib.util.find_spec(m) is None]


def site_main(args) -> int:
    missing_mods = missing_tools()
    if missing_mods:
        print(
            _t(
                "ddp-lab site needs the site tools, which are not installed ({modules}): "
                "DDP_LAB_EXTRAS=course,site bash setup.sh --no-lab "
                "(or .venv/bin/pip install -e '.[site]')",
                modules=", ".join(missing_mods),
            ),
            file=sys.stderr,
        )
        return 2
    out = Path(args.out).resolve()
    stats = build_site(
        out,
        cache=Path(args.cache).resolve(),
        work=Path(args.work).resolve(),
        repo_url=default_repo_url() if args.repo_url is None else args.repo_url,
        missing=args.missing,
        jobs=args.jobs,
        live_labs=args.live_labs,
    )
    cpu = f", {stats['execute_cpu_s']} s CPU" if stats.get("execute_cpu_s") else ""
    print(
        f"wrote {out}/index.html ({stats['cached']} lessons from the cache, "
        f"{stats['executed']} run in {stats['execute_s']} s{cpu}; Sphinx {stats['sphinx_s']} s; "
        f"{stats['total_s']} s in all)"
    )
    return 0
