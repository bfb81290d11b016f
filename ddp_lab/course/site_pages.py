"""The website's pages: what each page of ``ddp-lab site`` holds, from the chapter sources.

``pages`` lists a page per lesson and per exercise notebook (generated in memory by
``course/build.py``); ``page_notebook`` makes a page of one (the "Generated from" line gone,
the kernel-check cell hidden, a "Run this chapter" box after the title, widgets replaced by
a note); ``index_markdown`` and ``root_index`` are each language's index and the page that
picks a language. ``course/site.py`` builds the site from them and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat

from ddp_lab.course import build
from ddp_lab.i18n import _t

THEME = Path(__file__).resolve().parent / "site_theme"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@dataclass
class Page:
    """One notebook page of the site."""

    lang: str
    stem: str  # e.g. 05_ring_allreduce
    kind: str  # "notebooks" (a lesson) or "exercises"
    title: str
    nb: nbformat.NotebookNode  # as generated (no outputs)
    text: str  # the generated file's text: the cache key

    @property
    def docname(self) -> str:
        return self.stem if self.kind == "notebooks" else f"exercises/{self.stem}"


def pages(root: Path = build.ROOT) -> list[Page]:
    """Every page of the site, generated from ``chapters/`` (lessons and exercises only)."""
    out = []
    for src in build.sources(root):
        title = jupytext.read(src).metadata.get("ddp_lab", {}).get("title", {})
        for path, nb in build.targets(src, root).items():
            kind, lang = path.parent.parent.name, path.parent.name
            if kind == "solutions":
                continue
            out.append(Page(lang, src.stem, kind, title.get(lang, src.stem), nb, build.dumps(nb)))
    return out


def run_this_chapter(page: Page, repo_url: str, has_outputs: bool = True) -> str:
    """The markdown of the "Run this chapter" box (``has_outputs``: the lesson's outputs are
    on the page, from a run; a page built with ``--missing blank`` has none and says so)."""
    path = f"{page.kind}/{page.lang}/{page.stem}.ipynb"
    clone = f"git clone --depth 1 {repo_url or 'REPOSITORY_URL'}"
    folder = repo_url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") if repo_url else "ddp-lab"
    if page.kind == "exercises":
        steps = f"{clone}\ncd {folder}\nbash setup.sh --no-lab\n.venv/bin/ddp-lab exercise {page.stem[:2]}"
        body = _t(
            "This page shows the exercises. Work on them in JupyterLab on your own copy: "
            "the commands below install the course and copy this notebook to "
            "`work/{lang}/{stem}.ipynb`; `ddp-lab check` then grades it. Needs Linux and "
            "Python 3.10 or newer; no GPU.",
            page.lang,
            lang=page.lang,
            stem=page.stem,
        )
    elif not has_outputs:
        steps = f"{clone}\ncd {folder}\nbash setup.sh   # installs into .venv, opens JupyterLab"
        body = _t(
            "This page was built without running the lesson, so it shows no outputs. To "
            "see them, run it yourself: open `{path}` in JupyterLab; the commands below "
            "install the course and start JupyterLab. Needs Linux and Python 3.10 or newer; "
            "no GPU.",
            page.lang,
            path=path,
        )
    else:
        steps = f"{clone}\ncd {folder}\nbash setup.sh   # installs into .venv, opens JupyterLab"
        body = _t(
            "The outputs on this page come from a run of the lesson. To run it yourself, "
            "move its controls and change its code, open `{path}` in JupyterLab: the "
            "commands below install the course and start JupyterLab. Needs Linux and "
            "Python 3.10 or newer; no GPU.",
            page.lang,
            path=path,
        )
    title = _t("Run this chapter", page.lang)
    return f"```{{admonition}} {title}\n:class: tip\n\n{body}\n\n    {steps.replace(chr(10), chr(10) + '    ')}\n```"


def _static(cell_outputs: list, lang: str) -> list:
    """Outputs fit for a static page: a widget becomes a note."""
    out = []
    noted = False
    for o in cell_outputs:
        data = o.get("data", {})
        if WIDGET_MIME in data and noted:
            continue  # one note per cell
        if WIDGET_MIME in data:
            noted = True
            note = _t(
                "*(An interactive control is shown here when the notebook runs in "
                "JupyterLab: see \u201cRun this chapter\u201d at the top of the page.)*",
                lang,
            )
            o = nbformat.v4.new_output("display_data", data={"text/markdown": note})
        out.append(o)
    return out


def page_notebook(page: Page, executed: nbformat.NotebookNode | None, repo_url: str):
    """The notebook Sphinx renders for ``page``."""
    nb = nbformat.reads(page.text, as_version=4)
    if executed is not None:
        runs = [c for c in executed.cells if c.cell_type == "code"]
        code = [c for c in nb.cells if c.cell_type == "code"]
        if len(runs) != len(code):
            raise ValueError(f"cached run of {page.docname} ({page.lang}) does not match it")
        for cell, run in zip(code, runs, strict=True):
            cell.outputs = _static(run.get("outputs", []), page.lang)
            cell.execution_count = run.get("execution_count")
    cells = []
    box_done = False
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "generated" in tags and cell.cell_type == "markdown":
            continue  # "Generated from ...": for authors; the box below says how to run it
        if "kernel-check" in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
        if (
            page.kind == "exercises"
            and not box_done
            and cell.cell_type == "markdown"
            and cell.source.lstrip().startswith("# ")
        ):  # its own title: search lists the lesson and its exercises apart
            first, _, rest = cell.source.lstrip()[2:].partition("\n")
            heading = _t("Exercises: {title}", page.lang, title=first.strip())
            cell.source = f"# {heading}\n{rest}"
        cells.append(cell)
        if not box_done and cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            box = run_this_chapter(page, repo_url, executed is not None or page.kind != "notebooks")
            cells.append(nbformat.v4.new_markdown_cell(box))
            box_done = True
    if not box_done:
        box = run_this_chapter(page, repo_url, executed is not None or page.kind != "notebooks")
        cells.insert(0, nbformat.v4.new_markdown_cell(box))
    nb.cells = cells
    for i, cell in enumerate(nb.cells):  # stable ids: an unchanged page is an unchanged file
        cell.id = f"site-{i:03d}"
    return nb


def index_markdown(lang: str, lessons: list[Page], exercises: list[Page]) -> str:
    title = _t("PyTorch data-parallel training from the inside", lang)
    intro = _t(
        "A course in {n} chapters: each is a lesson, shown here with its outputs, and "
        "exercises that are graded when you run them. Every page links to its twin in the "
        "other language. To run the course, see \u201cRun this chapter\u201d on any page.",
        lang,
        n=len(lessons),
    )
    lessons_caption, exercises_caption = _t("Lessons", lang), _t("Exercises", lang)
    lines = [f"# {title}", "", intro, ""]
    lines += ["```{toctree}", ":maxdepth: 1", f":caption: {lessons_caption}", ""]
    lines += [p.docname for p in lessons] + ["```", ""]
    lines += ["```{toctree}", ":maxdepth: 1", f":caption: {exercises_caption}", ""]
    lines += [f"{p.title} <{p.docname}>" for p in exercises] + ["```", ""]
    return "\n".join(lines)


def root_index(all_pages: list[Page], repo_url: str) -> str:
    """``OUT/index.html``: what the course is, where to start, every chapter in both
    languages (lesson and exercises), and how to run it; styled like the pages."""
    import html

    template = (THEME / "root.html").read_text(encoding="utf-8")
    columns: dict[str, str] = {}
    for lang in build.LANGS:
        lessons = [p for p in all_pages if p.lang == lang and p.kind == "notebooks"]
        word = html.escape(_t("exercises", lang))
        about = html.escape(
            _t(
                "A course in {n} chapters, each a lesson with its outputs and graded exercises.",
                lang,
                n=len(lessons),
            )
        )
        start = html.escape(_t("Start here", lang))
        rows = "".join(
            f'<li><a href="{lang}/{p.docname}.html">{html.escape(p.title)}</a>'
            f' <a class="ex" href="{lang}/exercises/{p.stem}.html">{word}</a></li>'
            for p in lessons
        )
        first = f"{lang}/{lessons[0].docname}.html" if lessons else f"{lang}/index.html"
        columns[lang] = (
            f'<p>{about}</p><p><a class="start" href="{first}">{start} &rarr;</a></p>'
            f"<ul>{rows}</ul>"
        )
    clone = html.escape(f"git clone --depth 1 {repo_url or 'REPOSITORY_URL'}")
    for lang, body in columns.items():  # the template has a section per language
        template = template.replace(f"@@{lang}@@", body)
    return template.replace("@@CLONE@@", clone)
