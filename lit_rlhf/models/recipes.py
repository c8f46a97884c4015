"""Which shipped recipe writes a model directory: the hint for a local model path that does not
exist yet (e.g. `outputs/quickstart/reward_model` before `configs/quickstart/reward.yaml` ran).

`recipes_writing(path)` reads the repository's `configs/**/*.yaml` (nothing when lit_rlhf is
used outside the repository) and returns those whose `model.init_args.export_dir` is `path` or
holds it (a LoRA export's `adapter` directory); `lit_rlhf.models.loading` puts them in its error.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def recipes_writing(path: str) -> list[str]:
    """Repository-relative paths of the shipped recipes whose export_dir is or holds `path`."""
    configs = REPO_ROOT / "configs"
    if "/" not in path or not configs.is_dir():
        return []
    import yaml

    target = os.path.normpath(path)
    found = []
    for recipe in sorted(configs.rglob("*.yaml")):
        try:
            config = yaml.safe_load(recipe.read_text())
        except (OSError, yaml.YAMLError):
            continue
        init = ((config or {}).get("model") or {}).get("init_args") if isinstance(config, dict) else None
        export = init.get("export_dir") if isinstance(init, dict) else None
        if isinstance(export, str) and (target + os.sep).startswith(os.path.normpath(export) + os.sep):
            found.append(recipe.relative_to(REPO_ROOT).as_posix())
    return found


def missing_path_message(name: str, writers: list[str], builtin: str) -> str:
    """One line: the path does not exist, and the recipe to run first (else what to pass)."""
    message = f"model path {name!r} does not exist (relative to {os.getcwd()})"
    if writers:
        commands = " or ".join(f"`python main.py fit --config {w}`" for w in writers)
        return f"{message}; it is written by {commands} (its export_dir): run that recipe first"
    return f"{message}: point it at a model directory, a .gguf file, or a builtin name such as {builtin!r}"
