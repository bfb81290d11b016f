/* ddp-lab: search snippets start at the page's content (ddp_lab/course/site.py).
 *
 * Sphinx's search (searchtools.js, Search.htmlToText) takes a result's snippet from the
 * text of the page's first [role="main"] element. In pydata-sphinx-theme that element is
 * <main>, which also holds the article header (the language switch, the download, theme
 * and search buttons), a copy of the title for print, the footers and the author line: a
 * snippet opened with "System Settings Light Dark". Here the page's article
 * (article.bd-article) stands in for it before Sphinx reads the text, and runs of white space
 * become one space; the rest is Sphinx's. A page without such an article is left as it is.
 */
(() => {
  const install = () => {
    if (typeof Search === "undefined" || Search.ddpLabContentOnly) return;
    const sphinxToText = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      const article = doc.querySelector("article.bd-article");
      if (!article) return sphinxToText(htmlString, anchor);
      doc.querySelectorAll('[role="main"]').forEach((el) => el.removeAttribute("role"));
      article.setAttribute("role", "main");
      // the template's indentation and blank lines would count against the 120 characters
      // of context Sphinx shows before a match (a snippet then opens with "...")
      return sphinxToText(doc.documentElement.outerHTML, anchor).replace(/\s+/g, " ").trim();
    };
    Search.ddpLabContentOnly = true;
  };

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  } else {
    install();
  }
})();
