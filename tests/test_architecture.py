"""The dependency rules of `docs/ARCHITECTURE.md`, read from the source with `ast` (nothing imported):

- `lit_rlhf/ops` and `lit_rlhf/losses` are pure torch: they import torch, the standard library and
  each other (and `lit_rlhf.types`), never transformers, Lightning, peft or the model code, and
  their functions take tensors, never a model;
- no import cycle between the files of `lit_rlhf`, `callbacks` and `benchmarks`, counting the
  imports deferred into functions (a cycle hidden there still ties two files into one);
- Lightning's private attributes are touched only in `lit_rlhf/lightning_compat.py`.

(`lit_rlhf` never importing the top-level `callbacks` package is `tests/test_import_graph.py`'s.)
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


# ----------------------------------------------------------------------------------------------
# Lightning's private attributes: touched only in lit_rlhf/lightning_compat.py
# ----------------------------------------------------------------------------------------------

COMPAT = "lit_rlhf/lightning_compat.py"
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
# Lightning private names flagged wherever they appear (also on `self`, and even were the project
# to define a name of its own so spelled)
LIGHTNING_PRIVATE = {
    "_trainer", "_fabric", "_logger_connector", "_signal_connector", "_checkpoint_connector", "_data_connector",
    "_callback_connector", "_accelerator_connector", "_results", "_active_loop", "_current_fx_name",
    "_should_accumulate", "_skip_next_val", "_batches_that_stepped", "_warn_if_modules_in_eval_mode",
    "_ALLOWED_INSTANTIATORS", "_find_last_checkpoints", "_ModelCheckpoint__resolve_ckpt_dir", "_extract_stats",
    "_original_handlers", "_version", "_duration", "_instantiate_trainer", "_run_subcommand", "_get",
}
# private names of other libraries the project reads (not Lightning's)
OTHER_LIBRARIES = {
    "_replace", "_asdict", "_fields", "_make",  # NamedTuple's public API
    "_apply", "_non_persistent_buffers_set", "_foreach_mul_",  # torch
    "_active_adapter", "_disable_adapters",  # peft layers
    "_attn_implementation", "_no_split_modules",  # transformers configs and models
    "_fingerprint",  # datasets
    "_actions",  # argparse
}
# sites in files rewritten elsewhere (the online wing), to move to lightning_compat there
PENDING: dict[str, set[str]] = {}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def project_sources() -> list[Path]:
    return sorted(p for top in ("lit_rlhf", "callbacks") for p in (REPO / top).rglob("*.py"))


def own_private_names(paths: list[Path]) -> set[str]:
    """The private names the project defines: functions and classes, attributes it assigns
    (`x._name = ...`, `setattr(x, "_name", ...)`) and class-level names."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Attribute):
                            names.add(sub.attr)
                        elif isinstance(sub, ast.Name):
                            names.add(sub.id)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1:
                if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    names.add(node.args[1].value)
    return {n for n in names if private(n)} - LIGHTNING_PRIVATE


def lightning_private_uses(path: Path, own: set[str]) -> list[tuple[int, str]]:
    """(line, what) of each use of a Lightning private name in `path`: an import of a private
    Lightning module or name; an attribute `x._name`, `self._name` or `super()._name` (also as
    `getattr(x, "_name")`) whose name is Lightning's, i.e. a known Lightning private name, or on
    another object than `self`/`cls` a private name neither the project defines nor another
    library owns (`OTHER_LIBRARIES`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for module in modules:
                if module.split(".")[0] in LIGHTNING_PACKAGES and (
                        any(private(part) for part in module.split(".")) or any(private(n) for n in names)):
                    found.append((node.lineno, f"import from {module}: {', '.join(names) or module}"))
            continue
        if isinstance(node, ast.Attribute):
            receiver, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            receiver, name = node.args[0], node.args[1].value
        else:
            continue
        if not private(name):
            continue
        on_self = ast.unparse(receiver) in ("self", "cls")
        if name in LIGHTNING_PRIVATE or (not on_self and name not in own and name not in OTHER_LIBRARIES):
            found.append((node.lineno, f"{ast.unparse(receiver)}.{name}"))
    return found


def test_lightning_private_attributes_only_in_lightning_compat():
    """Every use of a Lightning private attribute is a function of `lit_rlhf/lightning_compat.py`
    (its reason written down, a test that fails when Lightning changes under it)."""
    paths = project_sources()
    own = own_private_names(paths)
    bad = []
    for path in paths:
        relative = path.relative_to(REPO).as_posix()
        if relative == COMPAT:
            continue
        uses = lightning_private_uses(path, own)
        bad += [f"{relative}:{line}: {what}" for line, what in uses
                if what.rsplit(".", 1)[-1] not in PENDING.get(relative, ())]
    assert not bad, ("Lightning private attributes outside lit_rlhf/lightning_compat.py (add a function there, with "
                     "its reason and a test):\n" + "\n".join(bad))


def test_the_private_attribute_check_finds_each_kind(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "from lightning.pytorch.trainer.connectors import _private\n"
        "from lightning.pytorch.core.saving import _ALLOWED_INSTANTIATORS\n"
        "def f(trainer, self):\n"
        "    trainer._logger_connector.should_update_logs\n"
        "    trainer.fit_loop.epoch_loop._skip_next_val = True\n"
        "    getattr(trainer, '_signal_connector', None)\n"
        "    self._trainer\n"
        "    super()._instantiate_trainer({}, [])\n"
        "    rollout._replace(scores=None)\n"
        "    self._own\n"
    )
    lines = sorted(line for line, _ in lightning_private_uses(source, own={"_own"}))
    assert lines == [1, 2, 4, 5, 6, 7, 8]

