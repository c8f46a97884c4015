// MathJax for pymdownx.arithmatex (generic mode): \( ... \) inline, \[ ... \] and $$ ... $$ displayed.
// The library is the copy in javascripts/mathjax/ (mkdocs.yml); it typesets the page when it has
// loaded, and again on each page change. Without it the formulas stay as TeX and nothing throws.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex", enableMenu: false},
  svg: {fontCache: "global"},
};
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (typeof MathJax.typesetPromise === "function") MathJax.typesetPromise();
  });
}
