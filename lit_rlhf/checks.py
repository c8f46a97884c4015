"""Start-up checks: configurations that cannot work fail before the first training step.

`startup_checks(trainer, module)` runs in the module's `setup("fit")` (after the DataModule's
`setup`) and raises one `ConfigError` listing every problem, each naming the setting at fault:
the batch type against the module's `batch_types`; the DataModule's tokenizer against the
module's; prompt + completion (or `max_new_tokens`) past a model's context; frozen models sharing
tensors with trained ones; reward/value embeddings smaller than the vocabulary; bf16/fp16 weights
without an fp32 master copy; the module's own `check_config(trainer, datamodule)` hook
(`docs/ARCHITECTURE.md` section 5; helpers `yields`, `split_problem`; this module never imports
`modules/`); callbacks needing a split or validation the DataModule lacks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn


class ConfigError(ValueError):
    """A configuration that cannot work, found at start-up; the message lists every problem."""


def startup_checks(trainer: Any, module: Any) -> None:
    """Raise `ConfigError` listing every problem of this (trainer, module, DataModule) combination."""
    problems = collect_problems(trainer, module)
    if problems:
        raise ConfigError(f"{type(module).__name__}: the configuration cannot work ({len(problems)} problem(s)):\n  - "
                          + "\n  - ".join(problems))


def collect_problems(trainer: Any, module: Any) -> list[str]:
    dm = getattr(trainer, "datamodule", None)
    problems: list[str] = []
    for check in (_batch_type, _tokenizer_match, _context_length, _shared_weights, _embedding_sizes,
                  _low_precision_weights, _module_own, _callbacks_need_splits):
        problems += check(trainer, module, dm)
    return problems


def _module_own(trainer, module, dm) -> list[str]:
    """What the module finds wrong with its own settings (`check_config(trainer, datamodule)`)."""
    hook = getattr(module, "check_config", None)
    return list(hook(trainer, dm)) if callable(hook) else []


_SUGGESTED = {
    "SFTBatch": "TLDRSFTDataModule",
    "PackedSFTBatch": "TLDRSFTDataModule with packing: true",
    "PreferenceBatch": "TLDRPreferenceDataModule or UltraFeedbackPreferenceDataModule",
    "SingleBatch": "UltraFeedbackSingleDataModule",
    "ListBatch": "UltraFeedbackListDataModule",
    "PromptBatch": "TLDRPromptDataModule or UltraFeedbackPromptDataModule",
}


def _batch_type(trainer, module, dm) -> list[str]:
    accepted = tuple(getattr(module, "batch_types", ()) or ())
    if dm is None or not accepted or not callable(getattr(dm, "batch_type", None)):
        return []
    problems = []
    for role in ("train", "val"):
        if (getattr(dm, "splits", {}) or {}).get(role) is None:
            continue
        got = dm.batch_type(role)
        if got is not None and not issubclass(got, accepted):
            want = " or ".join(t.__name__ for t in accepted)
            hint = " or ".join(_SUGGESTED.get(t.__name__, t.__name__) for t in accepted)
            problems.append(
                f"{type(module).__name__} trains on {want}, but {type(dm).__name__} yields {got.__name__} "
                f"({role} split): use a DataModule that yields {want} (lit_rlhf.data.{hint})"
            )
    return problems


def _tokenizer_match(trainer, module, dm) -> list[str]:
    tok = getattr(module, "tokenizer", None)
    dm_tok = getattr(dm, "tokenizer", None) if dm is not None and hasattr(type(dm), "tokenizer") else None
    if tok is None or dm_tok is None or dm_tok is tok:
        return []
    mismatched = [name for name, a, b in (("vocabulary", tok.get_vocab(), dm_tok.get_vocab()),
                                          ("pad_token_id", tok.pad_token_id, dm_tok.pad_token_id),
                                          ("eos_token_id", tok.eos_token_id, dm_tok.eos_token_id)) if a != b]
    if not mismatched:
        return []
    return [
        f"the DataModule tokenises with {getattr(dm_tok, 'name_or_path', '?')!r} but {type(module).__name__} uses "
        f"{getattr(tok, 'name_or_path', '?')!r}; they differ in {', '.join(mismatched)}. Give the DataModule the "
        "module's tokenizer (the CLI links data.init_args.tokenizer to the model's; drop an explicit one)"
    ]


def _models(module) -> list[tuple[str, nn.Module]]:
    """(attribute, model) of every model of the module: policy, reference, reward, value."""
    return [(name, getattr(module, name)) for name in ("policy", "ref_model", "reward_model", "value_model", "value")
            if isinstance(getattr(module, name, None), nn.Module)]


def _context(model: nn.Module) -> int | None:
    for candidate in (model, getattr(model, "backbone", None)):
        config = getattr(candidate, "config", None)
        limit = getattr(config, "max_position_embeddings", None)
        if isinstance(limit, int) and limit > 0:
            return limit
    return None


def _longest(dm, role: str, column: str) -> int | None:
    stats = (getattr(dm, "length_stats", {}) or {}).get(role, {}).get(column)
    return int(stats["max"]) if stats and stats.get("count") else None


def _context_length(trainer, module, dm) -> list[str]:
    if dm is None:
        return []
    sampling = getattr(module, "sampling", None)
    problems = []
    for role in ("train", "val"):
        prompt = _longest(dm, role, "prompt")
        if prompt is None:
            continue
        if sampling is not None:  # online: prompts + exactly max_new_tokens sampled tokens (D23)
            extra, what = int(sampling.max_new_tokens), "max_new_tokens"
        else:
            completions = [c for c in (_longest(dm, role, k) for k in ("completion", "chosen", "rejected")) if c]
            if not completions:
                continue
            extra, what = max(completions), "the longest completion"
        for name, model in _models(module):
            limit = _context(model)
            if limit is not None and prompt + extra > limit:
                problems.append(
                    f"the longest {role} prompt ({prompt} tokens, max_prompt_length={getattr(dm, 'max_prompt_length', '?')}) "
                    f"+ {what} ({extra}) = {prompt + extra} tokens exceeds the context of {name} "
                    f"(max_position_embeddings={limit}): lower max_prompt_length / "
                    f"{'max_new_tokens' if sampling is not None else 'max_completion_length'}, or use a longer-context model"
                )
                break
        if problems:
            break
    return problems


def _trainable_storages(module) -> dict[int, str]:
    return {p.data_ptr(): n for n, p in module.named_parameters() if p.requires_grad}


def _shared_weights(trainer, module, dm) -> list[str]:
    problems = []
    frozen = list(getattr(module, "_frozen_names", ()) or ())
    trained = _trainable_storages(module) if frozen else {}
    for name in frozen:
        model = getattr(module, name, None)
        if model is None:
            continue
        shared = [n for n, p in model.named_parameters() if p.data_ptr() in trained]
        if shared:
            problems.append(
                f"the frozen {name} shares {len(shared)} parameter tensor(s) with the trained weights "
                f"(e.g. {name}.{shared[0]} is {trained[model.get_parameter(shared[0]).data_ptr()]}): it would move "
                "with training; load it as a separate copy (lit_rlhf.models.frozen_copy / load_reference_model)"
            )
    return problems


def same_path(a: str, b: str) -> bool:
    """True when the two paths name the same file or directory."""
    try:
        return Path(os.path.expanduser(a)).resolve() == Path(os.path.expanduser(b)).resolve()
    except OSError:
        return False


def _embedding_sizes(trainer, module, dm) -> list[str]:
    tok = getattr(module, "tokenizer", None)
    if tok is None:
        return []
    problems = []
    for name, model in _models(module):
        embeddings = _input_embeddings(model)
        if embeddings is not None and embeddings.num_embeddings < len(tok):
            problems.append(
                f"{name} has {embeddings.num_embeddings} token embeddings but the tokenizer has {len(tok)} tokens: "
                f"{name} must use the policy's tokenizer (same vocabulary, PAD added the same way)"
            )
    return problems


def _input_embeddings(model: nn.Module) -> nn.Embedding | None:
    for candidate in (model, getattr(model, "backbone", None)):
        getter = getattr(candidate, "get_input_embeddings", None)
        if callable(getter):
            try:
                emb = getter()
            except (NotImplementedError, AttributeError):
                continue
            if isinstance(emb, nn.Embedding):
                return emb
    return None


PURE_LOW_PRECISION = ("bf16-true", "16-true")  # Lightning precisions that train low-precision weights on purpose


def _low_precision_weights(trainer, module, dm) -> list[str]:
    """Trainable bf16/fp16 weights without an fp32 master copy: AdamW stepping bf16 weights rounds
    away updates below ~1/256 of a weight; `bf16-mixed` autocasts compute but steps the weights in
    their loaded dtype. DeepSpeed keeps its own fp32 copy; `bf16-true` / `16-true` are a choice."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if isinstance(getattr(trainer, "strategy", None), DeepSpeedStrategy):
        return []
    precision = str(getattr(trainer, "precision", "32-true"))
    if precision in PURE_LOW_PRECISION:
        return []
    low = {}
    for name, param in module.named_parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            low.setdefault(str(param.dtype).removeprefix("torch."), []).append(name)
    if not low:
        return []
    dtype, names = next(iter(low.items()))
    pure = "bf16-true" if dtype == "bfloat16" else "16-true"
    return [
        f"{sum(len(v) for v in low.values())} trainable parameter tensor(s) are {dtype} (e.g. {names[0]}; "
        f"model.init_args.dtype: {getattr(module, 'model_dtype', '?')}) and "
        f"trainer.precision is {precision!r}: the optimizer would step the {dtype} weights directly, with no fp32 "
        "master copy, and most small updates would round away. Load the weights in float32 (model.init_args.dtype: "
        "float32) and keep trainer.precision: bf16-mixed (bf16 compute, fp32 weights and optimizer state); or train "
        "under DeepSpeed (configs/strategy/deepspeed_*.yaml), which keeps its own fp32 master copy; or, to train "
        f"pure {dtype} on purpose, set trainer.precision: {pure}"
    ]


def yields(dm, batch_name: str) -> bool:
    """True when the DataModule's train split yields batches of the class named `batch_name`."""
    try:
        got = dm.batch_type("train") if callable(getattr(dm, "batch_type", None)) else None
    except Exception:  # noqa: BLE001 - a DataModule without a train split: nothing to check
        return False
    return got is not None and got.__name__ == batch_name


def split_problem(rows: int, minibatches: int, what: str) -> list[str]:
    """`what` ("a rollout has ... = N rows") when `rows` do not split into `minibatches` equal
    minibatches, as one message naming the nearest count that would; [] when they do."""
    if minibatches < 1 or rows % minibatches == 0:
        return []
    nearest = max(d for d in range(1, rows + 1) if rows % d == 0 and d <= minibatches) if rows else 1
    return [f"{what}, which do not split into num_minibatches={minibatches} equal minibatches: make {rows} "
            f"divisible by num_minibatches (e.g. num_minibatches={nearest})"]


def _callbacks_need_splits(trainer, module, dm) -> list[str]:
    splits = getattr(dm, "splits", None) if dm is not None else None
    no_val = getattr(trainer, "limit_val_batches", 1) == 0 or (splits is not None and splits.get("val") is None)
    problems = []
    for cb in getattr(trainer, "callbacks", []) or []:
        name = type(cb).__name__
        monitor = getattr(cb, "monitor", None)
        if isinstance(monitor, str) and monitor.startswith("val/") and no_val:
            problems.append(
                f"{name} monitors {monitor!r} but there is no validation ("
                + ("limit_val_batches=0" if getattr(trainer, "limit_val_batches", 1) == 0
                   else f"{type(dm).__name__} has val_split=null")
                + "): set val_split, or monitor a train/ metric"
            )
        split = getattr(cb, "split", None)
        reads_trainer_dm = all(getattr(cb, a, None) is None for a in ("datamodule", "path", "prompt_texts"))
        if splits is None or not isinstance(split, str) or not reads_trainer_dm:
            continue
        role = {"validation": "val"}.get(split, split)
        if role in splits and splits[role] is None:
            problems.append(
                f"{name} reads the {split!r} split of the trainer's DataModule, but {type(dm).__name__} has "
                f"{role}_split=null: set {role}_split, or give the callback its own data"
            )
        if getattr(cb, "needs_reference_texts", False) and not callable(getattr(dm, "reference_texts", None)):
            problems.append(
                f"{name} needs reference responses (reference_texts) and the trainer's {type(dm).__name__} has "
                "none: give the callback `path` (an SFT dataset) or `datamodule`"
            )
    return problems
