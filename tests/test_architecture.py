"""The dependency rules of `docs/ARCHITECTURE.md`, read from the source with `ast` (nothing imported):

- `lit_rlhf/ops` and `lit_rlhf/losses` are pure torch: they import torch, the standard library and
  each other (and `lit_rlhf.types`), never transformers, Lightning, peft or the model code, and
  their functions take tensors, never a model;
- no import cycle between the files of `lit_rlhf`, `callbacks` and `benchmarks`, counting the
  imports deferred into functions (a cycle hidden there still ties two files into one);
- Lightning's private attributes are touched only in `lit_rlhf/lightning_compat/`.

(`lit_rlhf` never importing the top-level `callbacks` package is `tests/test_import_graph.py`'s.)
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
import textwrap
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
# Lightning's private attributes: touched only in lit_rlhf/lightning_compat/
# ----------------------------------------------------------------------------------------------

COMPAT = "lit_rlhf/lightning_compat/"
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
# private names of other libraries the project reads (not Lightning's)
OTHER_LIBRARIES = {
    "_replace", "_asdict", "_fields", "_make",  # NamedTuple's public API
    "_apply", "_non_persistent_buffers_set", "_foreach_mul_", "_init_group",  # torch
    "_active_adapter", "_disable_adapters",  # peft layers
    "_attn_implementation", "_no_split_modules",  # transformers configs and models
    "_fingerprint",  # datasets
    "_actions",  # argparse
}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def project_sources() -> list[Path]:
    return sorted([REPO / "main.py", *(p for top in ("lit_rlhf", "callbacks") for p in (REPO / top).rglob("*.py"))])


def defined_private_names(tree: ast.AST) -> set[str]:
    """The private names `tree` defines: functions and classes, the names and attributes it assigns
    (`x._name = ...`: `_name`, not what it is reached through; `setattr(x, "_name", ...)`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for sub in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                    names.add(sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", ""))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1:
            if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                names.add(node.args[1].value)
    return {n for n in names if private(n)}


def lightning_names(tree: ast.AST) -> dict[str, tuple[str, str]]:
    """Local name -> (Lightning module, name in it or "") of every Lightning import in `tree`."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIGHTNING_PACKAGES:
            found.update({a.asname or a.name: (node.module, a.name) for a in node.names})
        elif isinstance(node, ast.Import):
            found.update({a.asname or a.name.split(".")[0]: (a.name if a.asname else a.name.split(".")[0], "")
                          for a in node.names if a.name.split(".")[0] in LIGHTNING_PACKAGES})
    return found


class ProjectClass:
    """A class of the project, read from its source: its base expressions, the private names it
    defines and the Lightning names its file imports."""

    def __init__(self, node: ast.ClassDef, imported: dict[str, tuple[str, str]]) -> None:
        self.node, self.imported, self.own = node, imported, defined_private_names(node)


def project_classes(paths: list[Path]) -> dict[str, list[ProjectClass]]:
    classes: dict[str, list[ProjectClass]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        imported = lightning_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(ProjectClass(node, imported))
    return classes


def lightning_class(expr: ast.expr, imported: dict[str, tuple[str, str]]) -> type | None:
    """The Lightning class a base expression (`Callback`, `L.LightningModule`) names, else None."""
    dotted = ast.unparse(expr).split(".")
    if dotted[0] not in imported:
        return None
    module, name = imported[dotted[0]]
    obj = importlib.import_module(module)
    for part in ([name] if name else []) + dotted[1:]:
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None


def lightning_bases(cls: ProjectClass, classes: dict[str, list[ProjectClass]], seen=None) -> list[type]:
    """The Lightning classes `cls` derives from, directly or through project classes."""
    seen = seen if seen is not None else {id(cls)}
    bases = []
    for expr in cls.node.bases:
        found = lightning_class(expr, cls.imported)
        if found is not None:
            bases.append(found)
            continue
        for other in classes.get(ast.unparse(expr).split(".")[-1], []):
            if id(other) not in seen:
                seen.add(id(other))
                bases += lightning_bases(other, classes, seen)
    return bases


@functools.cache
def lightnings_own(cls: type) -> frozenset[str]:
    """The private names Lightning's own classes in `cls`'s MRO define, read from their source:
    class attributes and what their methods assign (`self._trainer = ...`); torch's are not Lightning's."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in LIGHTNING_PACKAGES:
            names |= {n for n in vars(klass) if private(n)}
            names |= defined_private_names(ast.parse(textwrap.dedent(inspect.getsource(klass))))
    return frozenset(names - {klass.__name__ for klass in cls.__mro__})


def reaches_trainer(expr: ast.expr) -> bool:
    """Whether `expr` is a trainer or reached through one (`trainer.fit_loop`, `self.trainer`)."""
    return any(isinstance(n, ast.Name) and n.id == "trainer" or isinstance(n, ast.Attribute) and n.attr == "trainer"
               for n in ast.walk(expr))


def attribute_uses(tree: ast.AST):
    """(node, receiver, name) of every private attribute read or written: `x._name` and
    `getattr(x, "_name")` (also setattr, hasattr, delattr)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            receiver, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            receiver, name = node.args[0], node.args[1].value
        else:
            continue
        if private(name):
            yield node, receiver, name


def lightning_private_uses(path: Path, own: set[str], classes: dict[str, list[ProjectClass]]) -> list[tuple[int, str]]:
    """(line, what) of each use of a Lightning private in `path`, found by scanning, not by a list
    of names:

    - an import of a private Lightning module or name;
    - any private attribute of a trainer or of what is reached through one (`trainer._x`,
      `trainer.fit_loop.epoch_loop._x`, `self.trainer._x`);
    - in a class deriving from a Lightning class (directly or through project classes), `self._x`
      or `super()._x` where `_x` is a private name of a Lightning class in its MRO (read from
      Lightning's source), and a method overriding one;
    - on any object, `self` included, a private name that neither the project defines nor another
      library owns (`OTHER_LIBRARIES`)."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for module in modules:
                if module.split(".")[0] in LIGHTNING_PACKAGES and (
                        any(private(part) for part in module.split(".")) or any(private(n) for n in names)):
                    found.add((node.lineno, f"import from {module}: {', '.join(names) or module}"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        record = next(c for c in classes[node.name] if ast.dump(c.node) == ast.dump(node))
        lightnings = set().union(*(lightnings_own(base) for base in lightning_bases(record, classes)))
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in lightnings:
                found.add((item.lineno, f"{node.name}.{item.name} overrides Lightning's"))
        for use, receiver, name in attribute_uses(node):
            if ast.unparse(receiver) in ("self", "cls", "super()") and name in lightnings:
                found.add((use.lineno, f"{ast.unparse(receiver)}.{name}"))
    for use, receiver, name in attribute_uses(tree):
        if reaches_trainer(receiver) or (name not in own and name not in OTHER_LIBRARIES):
            found.add((use.lineno, f"{ast.unparse(receiver)}.{name}"))
    return sorted(found)


def test_lightning_private_attributes_only_in_lightning_compat():
    """Every use of a Lightning private attribute is a function of `lit_rlhf/lightning_compat/`
    (its reason written down, a test that fails when Lightning changes under it)."""
    paths = project_sources()
    classes = project_classes(paths)
    own = set().union(*(defined_private_names(ast.parse(p.read_text())) for p in paths
                        if not p.relative_to(REPO).as_posix().startswith(COMPAT)))
    bad = []
    for path in paths:
        relative = path.relative_to(REPO).as_posix()
        if not relative.startswith(COMPAT):
            bad += [f"{relative}:{line}: {what}" for line, what in lightning_private_uses(path, own, classes)]
    assert not bad, ("Lightning private attributes outside lit_rlhf/lightning_compat/ (add a function there, with "
                     "its reason and a test):\n" + "\n".join(bad))


def test_the_private_attribute_check_finds_each_kind(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "from lightning.pytorch.trainer.connectors import _private\n"          # 1 private import
        "from lightning.pytorch.core.saving import _ALLOWED_INSTANTIATORS\n"  # 2 private import
        "from lightning.pytorch.callbacks import TQDMProgressBar\n"
        "def f(trainer, rollout):\n"
        "    trainer._logger_connector.should_update_logs\n"                  # 5 through a trainer
        "    trainer.fit_loop.epoch_loop._own = True\n"                       # 6 through a trainer, even a name we use
        "    getattr(trainer, '_signal_connector', None)\n"                   # 7
        "    rollout._replace(scores=None)\n"
        "class Bar(TQDMProgressBar):\n"
        "    def __init__(self):\n"
        "        self._own = 0\n"
        "    def _resolve_refresh_rate(self, n):\n"                            # 12 overrides Lightning's
        "        self._own += self._should_update(n, 3)\n"                    # 13 a Lightning private on self
        "        self.trainer._results\n"                                     # 14
        "        super()._get_metrics_never_heard_of()\n"                     # 15 not defined by the project
        "class Plain:\n"
        "    def g(self):\n"
        "        self._own, self._anything\n"                                 # 18 a name nobody here defines
    )
    paths = [source]
    lines = [line for line, _ in lightning_private_uses(source, own={"_own"}, classes=project_classes(paths))]
    assert sorted(set(lines)) == [1, 2, 5, 6, 7, 12, 13, 14, 15, 18]
