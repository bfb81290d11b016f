/* ddp-lab: search snippets start at the page's content (ddp_lab/course/site.py).
 *
 * Sphinx's search (searchtools.js, Search.htmlToText) takes a result's snippet from the
 * text of the page's first [role="main"] element. In pydata-sphinx-theme that element is
 * <main>, which also holds the article header (the language switch, the download, theme
 * and search buttons), the search box and the footers: a snippet then opened with their
 * words. Here those parts are removed before Sphinx reads the text; the rest is Sphinx's.
 */
(() => {
  const NOT_CONTENT = [
    ".bd-header-article",
    ".bd-search",
    "#searchbox",
    ".bd-footer-article",
    ".prev-next-footer",
  ].join(", ");

  const install = () => {
    if (typeof Search === "undefined" || Search.ddpLabContentOnly) return;
    const sphinxToText = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll(NOT_CONTENT).forEach((el) => el.remove());
      return sphinxToText(doc.documentElement.outerHTML, anchor);
    };
    Search.ddpLabContentOnly = true;
  };

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  } else {
    install();
  }
})();
