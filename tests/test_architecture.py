"""The dependency rules of `docs/ARCHITECTURE.md`, read from the source with `ast` (nothing imported):

- `lit_rlhf/ops` and `lit_rlhf/losses` are pure torch: they import torch, the standard library and
  each other (and `lit_rlhf.types`), never transformers, Lightning, peft or the model code, and
  their functions take tensors, never a model;
- no import cycle between the files of `lit_rlhf`, `callbacks` and `benchmarks`, counting the
  imports deferred into functions (a cycle hidden there still ties two files into one).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PURE_ROOMS = ("lit_rlhf/ops", "lit_rlhf/losses")
PURE_OWN = ("lit_rlhf.ops", "lit_rlhf.losses", "lit_rlhf.types")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, at any depth (names imported
    `from` a module are listed as `module.name`)."""
    package = ".".join(path.relative_to(REPO).parent.parts)  # what a relative import is relative to
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def allowed_in_pure_room(name: str) -> bool:
    top = name.split(".")[0]
    if top in ("torch", "typing", "__future__") or top in sys.stdlib_module_names:
        return True
    return any(name == own or name.startswith(own + ".") for own in PURE_OWN)


def test_ops_and_losses_import_only_torch_the_standard_library_and_each_other():
    bad = []
    for room in PURE_ROOMS:
        for path in sorted((REPO / room).rglob("*.py")):
            bad += [f"{path.relative_to(REPO)}:{line}: {name}" for line, name in imports(path)
                    if not allowed_in_pure_room(name)]
    assert not bad, "ops/ and losses/ must stay pure torch; found:\n" + "\n".join(bad)


def test_ops_and_losses_run_no_model():
    """Their functions take tensors: no argument annotated as a module (`nn.Module`, `nn.Linear`);
    running a model for its log-probs is `lit_rlhf.models.logprobs`."""
    bad = []
    for room in PURE_ROOMS:
        for path in sorted((REPO / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                    bad += [f"{path.relative_to(REPO)}:{node.lineno}: {node.name}({arg.arg}: {ast.unparse(arg.annotation)})"
                            for arg in args if arg.annotation is not None and "nn." in ast.unparse(arg.annotation)]
    assert not bad, "functions of ops/ and losses/ that take a model:\n" + "\n".join(bad)


def module_files() -> dict[str, Path]:
    files = {}
    for top in ("lit_rlhf", "callbacks", "benchmarks"):
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def import_graph() -> dict[str, set[str]]:
    """File -> the files it imports. `from package import name` points at the file `name` when it is
    a module of the package, else at the package's `__init__`."""
    files = module_files()
    graph = {}
    for module, path in files.items():
        targets = set()
        for _, name in imports(path):
            if name in files:
                targets.add(name)
            elif name.rsplit(".", 1)[0] in files:
                targets.add(name.rsplit(".", 1)[0])
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative); a target that is
    not a key of `graph` has no edges of its own."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_deferred_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_counting_deferred_imports():
    found = cycles(import_graph())
    assert not found, "import cycles (deferred imports included):\n" + "\n".join(" <-> ".join(c) for c in found)
