"""What a reader of a method opens: the project code one training step runs, traced as it runs.

`trace_step(name)` fits a method for one training batch on the tiny random Llama (bundled
prompts or pairs, a character-fraction reward, the in-process sampler, no environment, no
asynchronous rollouts) with a profiler on from the batch's `on_train_batch_start` to the return
of the module's `on_train_batch_end`, so the sampling, the scoring, the update and the hooks are
all in. It records every function of `lit_rlhf/` entered and reports:

- `files`: the `lit_rlhf` files entered, and `file_lines`, their lines; both without `types.py`
  and `ops/` (tensor helpers a reader takes on trust, like torch's);
- `functions`: the functions entered (every file), and `function_lines`, the lines those
  functions span (a nested function's lines counted once, inside its parent); `code_lines`, those
  of them that are code: neither blank, comments nor docstrings.

`roots`: the folders whose files count (the package; a test adds one to show what a helper of
its own costs).
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lit_rlhf"


class Trace(NamedTuple):
    files: int
    file_lines: int
    functions: int
    function_lines: int
    code_lines: int
    listing: tuple[str, ...]  # the counted files, with their lines


def counted_file(relative: str) -> bool:
    return relative != "lit_rlhf/types.py" and not relative.startswith("lit_rlhf/ops/")


@lru_cache(maxsize=None)
def not_code(path: str) -> frozenset[int]:
    """Lines of `path` that are blank, comments or a function's docstring."""
    source = Path(path).read_text()
    skip = {n for n, line in enumerate(source.splitlines(), 1) if not line.strip() or line.strip().startswith("#")}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
            skip.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return frozenset(skip)


@lru_cache(maxsize=None)
def function_spans(path: str) -> dict[int, tuple[int, int]]:
    """First line of each function's code object (its first decorator, as CPython counts it) ->
    (first line, last line) of its definition."""
    spans: dict[int, tuple[int, int]] = {}
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans[first] = (first, node.end_lineno)
            spans.setdefault(node.lineno, (first, node.end_lineno))
    return spans


class StepProfiler:
    """A `sys.setprofile` function recording the project functions entered between `start()` and
    the return of the traced module's `on_train_batch_end`."""

    def __init__(self, module: Any, roots: tuple[Path, ...] = (PACKAGE,)) -> None:
        self.module, self.entered, self.depth, self.on = module, set(), 0, False
        self.roots = tuple(str(root) + "/" for root in roots)

    def start(self) -> None:
        self.on = True
        sys.setprofile(self)

    def __call__(self, frame, event, arg) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if code.co_name == "on_train_batch_end" and frame.f_locals.get("self") is self.module:
            self.depth += 1 if event == "call" else -1
            if event == "return" and self.depth == 0:
                sys.setprofile(None)
                self.on = False
        if event == "call" and code.co_filename.startswith(self.roots):
            self.entered.add((code.co_filename, code.co_firstlineno, code.co_name))

    def trace(self) -> Trace:
        files: dict[str, int] = {}
        lines: set[tuple[str, int]] = set()
        functions = 0
        for filename, first, _ in self.entered:
            span = function_spans(filename).get(first)
            if span is None:  # a lambda, a comprehension or module-level code: inside a counted function
                continue
            functions += 1
            lines.update((filename, n) for n in range(span[0], span[1] + 1))
            relative = Path(filename).resolve().relative_to(REPO).as_posix()
            if counted_file(relative):
                files[relative] = len(Path(filename).read_text().splitlines())
        code = sum(1 for filename, n in lines if n not in not_code(filename))
        return Trace(len(files), sum(files.values()), functions, len(lines), code,
                     tuple(f"{name} ({n})" for name, n in sorted(files.items())))


def build(name: str) -> tuple[Any, Any]:
    """The module and DataModule of method `name`, as small as a step allows."""
    from lit_rlhf import modules
    from lit_rlhf.data import TLDRPreferenceDataModule, UltraFeedbackPromptDataModule
    from lit_rlhf.rewards import CharacterFractionReward

    if name == "DPOModule":
        module = modules.DPOModule(model="tiny-random-llama", lr=1e-4)
        data = TLDRPreferenceDataModule(path="bundled:tldr_comparisons", tokenizer="tiny-random-llama",
                                        train_split="train[:8]", val_split=None, batch_size=2,
                                        max_prompt_length=256, max_completion_length=16)
        return module, data
    online = {"GRPOModule": dict(num_generations=2), "RLOOModule": dict(num_generations=2),
              "PPOModule": dict(ppo_epochs=1), "XPOModule": dict()}[name]
    module = getattr(modules, name)(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abcdefghij")],
                                    max_new_tokens=4, lr=1e-4, total_episodes=64, **online)
    data = UltraFeedbackPromptDataModule(path="bundled:keyfact_chat", tokenizer="tiny-random-llama",
                                         train_split="train_sft[:8]", val_split=None, batch_size=2,
                                         max_prompt_length=512)
    return module, data


def trace_step(name: str, tmp_dir: str | Path, roots: tuple[Path, ...] = (PACKAGE,)) -> Trace:
    """Fit `name` for one training batch under the profiler (see the module docstring)."""
    import lightning as L

    L.seed_everything(0)
    module, data = build(name)
    profiler = StepProfiler(module, roots)

    class Start(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 0:
                profiler.start()

    trainer = L.Trainer(accelerator="cpu", max_steps=-1, limit_train_batches=1, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Start()], default_root_dir=str(tmp_dir))
    try:
        trainer.fit(module, datamodule=data)
    finally:
        sys.setprofile(None)
    assert not profiler.on, "the traced step never reached on_train_batch_end"
    return profiler.trace()
