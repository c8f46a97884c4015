"""What a reader of a method must hold: its reading set, and its constructor's options.

The reading set of a method is the files that define the project classes in its MRO plus the
project files its own file imports directly, leaving out `types.py`, `ops/` and package
`__init__` files that define nothing (re-exports only). Measured at the last commit of the
mixin design: RLOO 11 files / 2,559 lines, GRPO 13 / 2,968, PPO 14 / 3,248, DPO 7 / 1,873.
The bounds below are the composed design's measures (`python -m tests.test_reading_set` prints
them), held so the sets cannot grow back unnoticed: RLOO 5 / 1,175, GRPO 6 / 1,500, PPO 6 / 1,408,
DPO 6 / 1,117 (PPO's value model is built by `PolicyModule.load_value_model`; DPO's precomputed
reference is `lit_rlhf.training.reference_table`; an online method's rollout steps and fit plumbing
are `lit_rlhf.online.rollout` and `lifecycle`, a module's optimizer set-up and non-finite guard
`lit_rlhf.training.optim` and `guard`, which the methods do not import).
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def defines_something(path: Path) -> bool:
    """A file that defines a class or function (a package `__init__` of imports only does not)."""
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) for node in tree.body)


def project_file(module_name: str) -> Path | None:
    parts = module_name.split(".")
    if parts[0] not in ("lit_rlhf", "callbacks"):
        return None
    base = REPO.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def counted(path: Path) -> bool:
    relative = path.relative_to(REPO).as_posix()
    if relative == "lit_rlhf/types.py" or relative.startswith("lit_rlhf/ops/"):
        return False
    return not (path.name == "__init__.py" and not defines_something(path))


def direct_imports(path: Path) -> set[Path]:
    """The project files `path` imports at its top level or in functions (`from a.b import c`
    counts `a/b/c.py` when c is a module, else `a/b`)."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            target = project_file(name)
            if target is not None and (name != getattr(node, "module", None) or not any(
                    project_file(f"{name}.{a.name}") for a in getattr(node, "names", []))):
                found.add(target)
    return found


def reading_set(cls: type) -> set[Path]:
    files = {Path(inspect.getfile(klass)).resolve() for klass in cls.__mro__
             if klass.__module__.split(".")[0] in ("lit_rlhf", "callbacks")}
    files |= direct_imports(Path(inspect.getfile(cls)).resolve())
    return {path for path in files if counted(path)}


def lines(files: set[Path]) -> int:
    return sum(len(path.read_text().splitlines()) for path in files)


BOUNDS = {  # method: (files, lines) at most; measured: RLOO 5 / 1,175, GRPO 6 / 1,500, PPO 6 / 1,408, DPO 6 / 1,117
    "RLOOModule": (6, 1250),
    "GRPOModule": (6, 1530),
    "PPOModule": (7, 1450),
    "DPOModule": (6, 1200),
}


@pytest.mark.parametrize("name", list(BOUNDS))
def test_a_method_reads_in_a_few_files(name):
    import lit_rlhf.modules as modules

    files = reading_set(getattr(modules, name))
    most_files, most_lines = BOUNDS[name]
    listing = ", ".join(sorted(p.relative_to(REPO).as_posix() for p in files))
    print(f"{name}: {len(files)} files, {lines(files)} lines: {listing}")
    assert len(files) <= most_files and lines(files) <= most_lines, (len(files), lines(files), listing)


def test_the_online_base_has_no_mixins():
    """`OnlineModule`'s bases are the policy base alone: every online part is an object it holds."""
    from lit_rlhf.modules import PolicyModule
    from lit_rlhf.modules.online import OnlineModule

    assert OnlineModule.__bases__ == (PolicyModule,)
    online_mro = OnlineModule.__mro__[:OnlineModule.__mro__.index(PolicyModule)]
    assert online_mro == (OnlineModule,)
    source = (REPO / "lit_rlhf/modules/online.py").read_text()
    assert len(source.splitlines()) <= 350 and code_lines(source) <= 180  # measured: 346 and 173


def code_lines(source: str) -> int:
    """Lines that are neither blank, comments nor docstrings."""
    tree = ast.parse(source)
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docs.update(range(node.lineno, node.end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docs)


def help_options(class_name: str) -> list[str]:
    """The `--model.*` options `python main.py fit --model.help <class>` lists."""
    from jsonargparse import ArgumentParser

    import lit_rlhf.modules as modules

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(getattr(modules, class_name), "model", fail_untyped=False)
    return sorted(a.dest for a in parser._actions if getattr(a, "dest", "").startswith("model."))


# measured: GRPO 43 (61 with the mixins), PPO 46 (60), DPO 20 (24), RLOO 35; `memory`, `rollout`
# and GRPO's `entropy` (Clip-Cov or KL-Cov and the entropy bonus, `losses.EntropyControl`) each count twice
# (the option and its `.help`), their settings live with their objects
@pytest.mark.parametrize("name,most", [("GRPOModule", 43), ("PPOModule", 46), ("DPOModule", 20), ("RLOOModule", 35)])
def test_a_method_lists_few_options(name, most):
    options = help_options(name)
    print(f"{name}: {len(options)} options")
    assert len(options) <= most, (len(options), options)


if __name__ == "__main__":  # python -m tests.test_reading_set: print the measures
    import lit_rlhf.modules as modules

    for method in sorted(set(BOUNDS) | {"DAPOModule", "GSPOModule", "ReMaxModule", "OnlineDPOModule"}):
        files = reading_set(getattr(modules, method))
        print(f"{method}: {len(files)} files, {lines(files)} lines, {len(help_options(method))} options")
    sys.exit(0)
