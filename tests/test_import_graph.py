"""Dependencies inside `lit_rlhf` point one way (DESIGN sections 1 and 6).

Every import of every file of `lit_rlhf/` is read with `ast`, the ones inside functions
included (a lazy import is a dependency all the same):

- nothing in `lit_rlhf` imports the top-level `callbacks` package (`callbacks` imports
  `lit_rlhf`; `main.py` is where the two meet);
- no cycle between the parts of `lit_rlhf` (its subpackages and top-level modules, e.g.
  `modules` <-> `checks`), nor between its modules (e.g. `models.adapters` <-> `models.heads`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.test_architecture import cycles

PACKAGE = REPO_ROOT / "lit_rlhf"


def modules() -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package's __init__)} of every module of lit_rlhf."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imported_names(path: Path, name: str, package: bool) -> list[tuple[str, int]]:
    """(dotted name, line) of every import in the file, function-level ones included, relative
    imports resolved; `from a import b` gives `a.b` (a submodule, or a name defined in `a`)."""
    here = name if package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


def module_graph() -> dict[str, set[str]]:
    """{module: modules of lit_rlhf it imports}: each imported name resolved to the longest
    module it names (`lit_rlhf.models.heads` a submodule, `lit_rlhf.checks.ConfigError` ->
    `lit_rlhf.checks`, `lit_rlhf.modules.SFTModule` -> the package `lit_rlhf.modules`)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, (path, package) in known.items():
        edges = set()
        for target, _ in imported_names(path, name, package):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("lit_rlhf") and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def part(module: str) -> str:
    """`lit_rlhf.training.base` -> `lit_rlhf.modules`; `lit_rlhf.checks` -> `lit_rlhf.checks`."""
    return ".".join(module.split(".")[:2])


def edges_between(graph, component) -> list[str]:
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component]


def test_lit_rlhf_never_imports_the_callbacks_package():
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {target}"
        for name, (path, package) in modules().items()
        for target, line in imported_names(path, name, package)
        if target.split(".")[0] == "callbacks"
    ]
    assert not found, "lit_rlhf must not depend on the top-level callbacks package:\n" + "\n".join(found)


def test_no_cycle_between_the_parts_of_lit_rlhf():
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        graph.setdefault(part(module), set()).update(part(t) for t in targets if part(t) != part(module))
    found = cycles(graph)
    assert not found, "\n".join(f"cycle {c}: {edges_between(graph, c)}" for c in found)


def test_no_cycle_between_the_modules_of_lit_rlhf():
    graph = module_graph()
    found = cycles(graph)
    assert not found, "\n".join(f"cycle {c}: {edges_between(graph, c)}" for c in found)


def test_the_walk_sees_function_level_imports_and_cycles(tmp_path):
    """The detector itself: a lazy import inside a function is an edge, and a cycle is found."""
    source = "def f():\n    from lit_rlhf.checks import ConfigError\n    import callbacks.progress\n"
    names = [n for n, _ in imported_names(_write(tmp_path / "m.py", source), "lit_rlhf.x", False)]
    assert "lit_rlhf.checks.ConfigError" in names and "callbacks.progress" in names
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
