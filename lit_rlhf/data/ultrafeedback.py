"""UltraFeedback DataModules: pairs (reward model / DPO), single trajectories (KTO / DRO-V) and
prompts (online methods), on the hub datasets by default (schemas: `lit_rlhf.data.schema`;
openbmb has one split, `train`: hold out a slice such as `val_split: "train[98%:]"`).

The prompt is the chat template of the conversation before the last assistant message, with the
generation prompt; the completion is the template's continuation and EOS
(`formatting.chat_prompt_and_completion`). A chat prompt is never truncated: a longer one is a bad row.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import datasets
import torch

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.base import Formatter, RLHFDataModule
from lit_rlhf.data.kinds import CompletionDataModule, PreferenceDataModule, PromptDataModule, _ReferenceTexts
from lit_rlhf.data.collate import SingleCollator
from lit_rlhf.data.formatting import (
    BAD_STRUCTURE, IDENTICAL, MISSING, PROMPT_TOO_LONG, BadRow, chat_prompt, chat_prompt_and_completion,
    encode_prompt, require_chat_template, require_finite, require_messages, require_text
)
from lit_rlhf.data.processing import IDS, INT, STR, TRUNCATED

ULTRAFEEDBACK_BINARIZED_HUB = "HuggingFaceH4/ultrafeedback_binarized"
ULTRAFEEDBACK_HUB = "openbmb/UltraFeedback"

LabelMode = Literal["threshold", "pairs"]
NO_PAIR = "no pair (fewer than two distinct scores)"
COMPLETION_OPTIONS = ("max_prompt_length", "max_completion_length", "truncate_completions")


class _ChatFormatter(Formatter):
    options = COMPLETION_OPTIONS

    def __init__(self, dm: RLHFDataModule, **extra: Any):
        require_chat_template(dm.tokenizer, f"{type(dm).__name__} ({dm.source.describe()})")
        super().__init__(dm, **extra)

    def prompt_ids(self, text: str, field: str) -> list[int]:
        ids = encode_prompt(self.tokenizer, text, chat=True)
        if len(ids) > self.max_prompt_length:
            raise BadRow(PROMPT_TOO_LONG, field,
                         f"chat prompt of {len(ids)} tokens > max_prompt_length={self.max_prompt_length} "
                         "(chat prompts are not truncated)")
        return ids

    def answer(self, instruction: str, c: Any, field: str, score_field: str) -> tuple[str, str, float, list[int], int]:
        """An openbmb completion `c` of `instruction`: (response, completion text, score, ids, cut)."""
        if not isinstance(c, dict):
            raise BadRow(BAD_STRUCTURE, field, "expected a dict")
        response = require_text(c.get("response"), f"{field}.response")
        score = require_finite(c.get(score_field), f"{field}.{score_field}")
        messages = [{"role": "user", "content": instruction}, {"role": "assistant", "content": response}]
        text = chat_prompt_and_completion(self.tokenizer, messages)[1]
        return response, text, score, *self.completion_ids(text, f"{field}.response")


class UltraFeedbackPairFormatter(_ChatFormatter):
    """A binarized row -> prompt ids and chosen / rejected completion ids."""

    passthrough = ("prompt_id", "score_chosen", "score_rejected")
    options = (*COMPLETION_OPTIONS, "margin_from")

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "chosen": STR, "rejected": STR, "raw_prompt": STR,
                "_prompt_ids": IDS, "_chosen_ids": IDS, "_rejected_ids": IDS, "_margin": datasets.Value("float32"),
                "_prompt_len": INT, "_chosen_len": INT, "_rejected_len": INT, TRUNCATED: INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        raw_prompt = require_text(row.get("prompt"), "prompt")
        chosen = require_messages(row.get("chosen"), "chosen")
        rejected = require_messages(row.get("rejected"), "rejected")
        if chosen[:-1] != rejected[:-1]:
            raise BadRow(BAD_STRUCTURE, "rejected", "the conversation before the last message differs from chosen's")
        if chosen[-1]["content"] == rejected[-1]["content"]:
            raise BadRow(IDENTICAL, "rejected", "the chosen and rejected answers are identical")
        scores = {}
        for key in ("score_chosen", "score_rejected"):
            if key in row or self.margin_from == "score_difference":
                scores[key] = require_finite(row.get(key), key)
        prompt, chosen_text = chat_prompt_and_completion(self.tokenizer, chosen)
        _, rejected_text = chat_prompt_and_completion(self.tokenizer, rejected)
        prompt_ids = self.prompt_ids(prompt, "chosen")
        chosen_ids, cut_c = self.completion_ids(chosen_text, f"chosen[{len(chosen) - 1}].content")
        rejected_ids, cut_r = self.completion_ids(rejected_text, f"rejected[{len(rejected) - 1}].content")
        margin = None
        if self.margin_from == "score_difference":
            margin = scores["score_chosen"] - scores["score_rejected"]
        return [{"prompt": prompt, "chosen": chosen_text, "rejected": rejected_text, "raw_prompt": raw_prompt,
                 "_prompt_ids": prompt_ids, "_chosen_ids": chosen_ids, "_rejected_ids": rejected_ids,
                 "_margin": margin, "_prompt_len": len(prompt_ids), "_chosen_len": len(chosen_ids),
                 "_rejected_len": len(rejected_ids), TRUNCATED: cut_c + cut_r}]


class UltraFeedbackSingleFormatter(_ChatFormatter):
    """An openbmb/UltraFeedback row -> one (prompt, completion, raw reward) example per completion
    (or, with `label_mode="pairs"`, the best- and worst-scored completions labelled True/False).

    A bad completion is reported (or skipped) on its own; the row's other completions stay.
    """

    passthrough = ("source",)
    options = (*COMPLETION_OPTIONS, "reward_field", "label_mode")

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "completion": STR, "raw_prompt": STR, "model": STR,
                "completion_index": INT, "_reward": datasets.Value("float64"), "_label": datasets.Value("bool"),
                "_prompt_ids": IDS, "_completion_ids": IDS, "_prompt_len": INT, "_completion_len": INT,
                TRUNCATED: INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        instruction = require_text(row.get("instruction"), "instruction")
        completions = row.get("completions")
        if not isinstance(completions, list) or not completions:
            raise BadRow(MISSING if not completions else BAD_STRUCTURE, "completions", "expected a non-empty list")
        prompt = chat_prompt(self.tokenizer, [{"role": "user", "content": instruction}])
        prompt_ids = self.prompt_ids(prompt, "instruction")
        good, bad = [], []
        for i, c in enumerate(completions):
            try:
                _, text, reward, ids, cut = self.answer(instruction, c, f"completions[{i}]", self.reward_field)
            except BadRow as err:
                bad.append(self.bad(err))
                continue
            good.append({"prompt": prompt, "completion": text, "raw_prompt": instruction, "model": c.get("model"),
                         "completion_index": i, "_reward": reward, "_label": None, "_prompt_ids": prompt_ids,
                         "_completion_ids": ids, "_prompt_len": len(prompt_ids), "_completion_len": len(ids),
                         TRUNCATED: cut})
        if self.label_mode == "pairs" and good:
            rewards = [g["_reward"] for g in good]
            best = max(range(len(good)), key=lambda j: (rewards[j], -j))  # first of the best
            worst = min(range(len(good)), key=lambda j: (rewards[j], j))  # first of the worst
            if rewards[best] == rewards[worst]:
                bad.append(self.bad(BadRow(NO_PAIR, f"completions[*].{self.reward_field}",
                                           f"{len(good)} valid completion(s) with equal scores: no pair")))
                good = []
            else:
                good = [dict(good[best], _label=True), dict(good[worst], _label=False)]
        return good + bad


class UltraFeedbackPromptFormatter(_ChatFormatter):
    """A binarized preference row (conversation = `chosen` without its answer; reference = the
    chosen answer), a binarized SFT row (`prompt`, `messages`: conversation = `messages` without
    its last assistant answer; reference = that answer) or an openbmb row (`instruction`, no
    reference) -> chat generation prompt ids."""

    consumed = ("chosen", "rejected", "messages", "completions", "instruction", "prompt")
    options = ("max_prompt_length",)

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "reference": STR, "raw_prompt": STR, "_prompt_ids": IDS, "_prompt_len": INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        reference = None
        if "chosen" in row or (row.get("messages") is not None and row.get("prompt") is not None):
            field = "chosen" if "chosen" in row else "messages"  # a preference row, or an SFT row (`*_sft`)
            raw = require_text(row.get("prompt"), "prompt")
            prompt, reference = chat_prompt_and_completion(self.tokenizer, require_messages(row.get(field), field))
        else:
            field = "instruction" if "instruction" in row else "prompt"
            raw = require_text(row.get(field), field)
            prompt = chat_prompt(self.tokenizer, [{"role": "user", "content": raw}])
        ids = self.prompt_ids(prompt, field)
        return [{"prompt": prompt, "reference": reference, "raw_prompt": raw, "_prompt_ids": ids,
                 "_prompt_len": len(ids)}]


class UltraFeedbackPreferenceDataModule(PreferenceDataModule):
    """UltraFeedback pairs (binarized): the chosen answer against the rejected one.

    `margin_from="score_difference"` gives `batch.margin` `score_chosen - score_rejected`.
    Metadata: "prompt" (templated), "chosen", "rejected" (completion texts), "raw_prompt",
    "prompt_id", "score_chosen", "score_rejected".
    """

    defaults = {"path": ULTRAFEEDBACK_BINARIZED_HUB, "train_split": "train_prefs", "val_split": "test_prefs"}
    margin_sources = ("score_difference",)
    raw_schema = schemas.ULTRAFEEDBACK_BINARIZED
    schema_name = "ultrafeedback_binarized"

    def _formatter(self, role: str) -> Formatter:
        return UltraFeedbackPairFormatter(self)


class UltraFeedbackSingleDataModule(CompletionDataModule):
    """openbmb/UltraFeedback as single trajectories: one (prompt, completion, reward) row each.

    Rewards are normalised to mean 0, variance 1 by the training examples' mean and population
    std (DRO paper, Sec. 4), kept in `reward_stats` and `state_dict()`. Metadata: "prompt" (templated), "completion", "raw_prompt" (the instruction),
    "model", "completion_index", "source".

    Args:
        reward_field: the completion's score to use (`overall_score`, `fine-grained_score`, or
            any other numeric key of a completion).
        with_rewards: put the normalised rewards in the batch (False needs a `label_mode`).
        label_mode: KTO's desirable / undesirable labels: `threshold` (the raw reward above
            `label_threshold`), `pairs` (per prompt the best completion is desirable and the
            worst undesirable, first on ties, the others unused; a prompt whose completions all
            score the same is a bad row), or null: no labels.
        label_threshold: the raw reward above which a completion is desirable; null: the
            training mean (with `pairs`, of the selected examples).
    """

    defaults = {"path": ULTRAFEEDBACK_HUB, "val_split": None}
    raw_schema = schemas.ULTRAFEEDBACK
    schema_name = "openbmb/UltraFeedback"

    def __init__(self, *, reward_field: str = "overall_score", with_rewards: bool = True,
                 label_mode: LabelMode | None = None, label_threshold: float | None = None, **kwargs: Any):
        if label_mode not in (None, "threshold", "pairs"):
            raise ValueError(f"label_mode must be None, 'threshold' or 'pairs', got {label_mode!r}")
        if not with_rewards and label_mode is None:
            raise ValueError("with_rewards=False needs a label_mode: "
                             "the batches would carry neither rewards nor labels")
        if label_threshold is not None and label_mode != "threshold":
            raise ValueError("label_threshold is only used with label_mode='threshold'")
        super().__init__(**kwargs)
        self.reward_field = reward_field
        self.with_rewards = with_rewards
        self.label_mode = label_mode
        self.label_threshold = label_threshold
        self.reward_stats: dict[str, Any] | None = None

    def _formatter(self, role: str) -> Formatter:
        return UltraFeedbackSingleFormatter(self)

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self.ensure_reward_stats()

    def ensure_reward_stats(self) -> dict[str, Any]:
        """The training reward statistics: restored ones if any, else computed from the train split."""
        if self.reward_stats is None:
            if self.splits["train"] is None:
                raise ValueError("reward normalisation needs the train split "
                                 "(or statistics restored from a checkpoint)")
            raw = torch.tensor(list(self.dataset("train")["_reward"]), dtype=torch.float64)
            if raw.numel() < 2:
                raise ValueError(f"cannot normalise rewards over {raw.numel()} training example(s)")
            mean, std = float(raw.mean()), float(raw.std(correction=0))
            if not std > 0 or not math.isfinite(std):
                raise ValueError(f"training rewards ({self.reward_field}) have standard deviation {std}: "
                                 "cannot normalise")
            self.reward_stats = {"field": self.reward_field, "mean": mean, "std": std, "count": int(raw.numel())}
        elif self.reward_stats.get("field") != self.reward_field:
            raise ValueError(f"restored reward statistics are for {self.reward_stats.get('field')!r}, "
                             f"but reward_field is {self.reward_field!r}")
        return self.reward_stats

    def _collator(self, role: str) -> SingleCollator:
        stats = self.ensure_reward_stats()
        threshold = None
        if self.label_mode == "threshold":
            threshold = self.label_threshold if self.label_threshold is not None else stats["mean"]
        return SingleCollator(self.tokenizer.pad_token_id, stats["mean"] if self.with_rewards else None, stats["std"],
                              with_labels=self.label_mode is not None, label_threshold=threshold)

    def state_dict(self) -> dict[str, Any]:
        return {"reward_stats": dict(self.reward_stats) if self.reward_stats is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        stats = state_dict.get("reward_stats")
        self.reward_stats = dict(stats) if stats is not None else None


class UltraFeedbackPromptDataModule(_ReferenceTexts, PromptDataModule):
    """UltraFeedback prompts for online methods, chat-templated and left padded.

    Reads the binarized schema (preference splits: reference = the chosen answer; SFT splits such
    as `train_sft`: reference = the last assistant message of `messages`) or the openbmb schema
    (`instruction`, no reference). Metadata: "prompt", "reference", "raw_prompt", and the other
    scalar source columns (e.g. `prompt_id`, scores, `source`).
    """

    defaults = {"path": ULTRAFEEDBACK_BINARIZED_HUB, "train_split": "train_prefs", "val_split": "test_prefs"}
    raw_schema = schemas.ULTRAFEEDBACK_PROMPTS
    schema_name = "UltraFeedback (binarized or openbmb)"

    def _formatter(self, role: str) -> Formatter:
        consumed = UltraFeedbackPromptFormatter.consumed + ("models",)
        return UltraFeedbackPromptFormatter(self, passthrough=self.passthrough(role, consumed))
