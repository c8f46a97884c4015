// MathJax for pymdownx.arithmatex (generic mode): \( ... \) inline, \[ ... \] and $$ ... $$ displayed
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"},
};
document$.subscribe(() => { MathJax.typesetPromise(); });
