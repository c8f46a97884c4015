"""Collators: lists of tokenised examples (token ids and numbers under `_`-prefixed keys, metadata
under the others) -> the typed batches of `lit_rlhf.types` (D5): prompt+completion right padded,
prompts for generation left padded, bool masks and a PAD distinct from EOS (D3). Classes, not
closures, so DataLoader workers can pickle them.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lit_rlhf.losses.listwise import rank_by_scores
from lit_rlhf.types import ListBatch, PreferenceBatch, PromptBatch, SFTBatch, SingleBatch


def pad_right(seqs: Sequence[Sequence[int]], pad_token_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and bool mask, each row followed (`left`: preceded) by PAD up to the longest row."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        at = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, at] = torch.as_tensor(s, dtype=torch.long)
        mask[i, at] = True
    return ids, mask


def pad_left(seqs: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and bool mask, each row preceded by PAD up to the longest row."""
    return pad_right(seqs, pad_token_id, left=True)


def prompt_completion_tensors(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                              pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt+completion: (input_ids, attention_mask, loss_mask, prompt_lengths);
    `loss_mask` is True exactly on the completion tokens (its final EOS included)."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    ids, attention_mask = pad_right(seqs, pad_token_id)
    loss_mask = torch.zeros_like(attention_mask)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        loss_mask[i, len(p): len(p) + len(c)] = True
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return ids, attention_mask, loss_mask, prompt_lengths


def collect_meta(examples: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Every key not starting with `_` becomes `meta[key]`, a list of length B, and the row index
    in the split `_row` becomes `meta["index"]` (errors name the dataset rows)."""
    if not examples:
        return {}
    keys = [k for k in examples[0] if not k.startswith("_")]
    meta = {k: [ex.get(k) for ex in examples] for k in keys}
    if "_row" in examples[0]:
        meta["index"] = [ex["_row"] for ex in examples]
    return meta


class Collator:
    """Pads with `pad_token_id`; `batch_type` is what it yields (start-up checks match it against
    the module)."""

    batch_type: type

    def __init__(self, pad_token_id: int):
        self.pad_token_id = int(pad_token_id)

    def completions(self, examples: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, ...]:
        """`prompt_completion_tensors` of the examples' `_prompt_ids` and `_completion_ids`."""
        return prompt_completion_tensors([ex["_prompt_ids"] for ex in examples],
                                         [ex["_completion_ids"] for ex in examples], self.pad_token_id)


class SFTCollator(Collator):
    """Examples with `_prompt_ids`, `_completion_ids` -> `SFTBatch` (right padded)."""

    batch_type = SFTBatch

    def __call__(self, examples: Sequence[dict[str, Any]]) -> SFTBatch:
        ids, attn, loss_mask, _ = self.completions(examples)
        return SFTBatch(ids, attn, loss_mask, collect_meta(examples))


class PreferenceCollator(Collator):
    """Examples with `_prompt_ids`, `_chosen_ids`, `_rejected_ids` (and `_margin`) ->
    `PreferenceBatch`: rows [:B] chosen, rows [B:] rejected, all padded to one T."""

    batch_type = PreferenceBatch

    def __init__(self, pad_token_id: int, with_margin: bool = False):
        super().__init__(pad_token_id)
        self.with_margin = with_margin

    def __call__(self, examples: Sequence[dict[str, Any]]) -> PreferenceBatch:
        prompts = [ex["_prompt_ids"] for ex in examples]
        completions = [ex["_chosen_ids"] for ex in examples] + [ex["_rejected_ids"] for ex in examples]
        ids, attn, loss_mask, prompt_lengths = prompt_completion_tensors(prompts + prompts, completions, self.pad_token_id)
        margin = None
        if self.with_margin:
            margin = torch.tensor([float(ex["_margin"]) for ex in examples], dtype=torch.float32)
        return PreferenceBatch(ids, attn, loss_mask, prompt_lengths, margin, collect_meta(examples))


def prompt_groups(prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B,) long: one id per distinct prompt (by its tokens), numbered in order of first
    appearance, so rows with equal ids share their prompt (`SingleBatch.sharing`)."""
    ids: dict[tuple[int, ...], int] = {}
    return torch.tensor([ids.setdefault(tuple(p), len(ids)) for p in prompts], dtype=torch.long)


class SingleCollator(Collator):
    """Examples with `_prompt_ids`, `_completion_ids`, `_reward` and/or `_label` -> `SingleBatch`.
    Raw rewards are normalised here, `(r - mean) / std`, so statistics restored from a checkpoint
    apply unchanged; labels are `_label`, or `raw reward > label_threshold` when one is given."""

    batch_type = SingleBatch

    def __init__(self, pad_token_id: int, reward_mean: float | None = None, reward_std: float | None = None,
                 with_labels: bool = False, label_threshold: float | None = None):
        super().__init__(pad_token_id)
        self.reward_mean = reward_mean
        self.reward_std = reward_std
        self.with_labels = with_labels
        self.label_threshold = label_threshold

    def __call__(self, examples: Sequence[dict[str, Any]]) -> SingleBatch:
        ids, attn, loss_mask, prompt_lengths = self.completions(examples)
        rewards = labels = None
        if self.reward_mean is not None or self.label_threshold is not None:
            raw = torch.tensor([float(ex["_reward"]) for ex in examples], dtype=torch.float64)
        if self.reward_mean is not None:
            rewards = ((raw - self.reward_mean) / self.reward_std).to(torch.float32)
        if self.with_labels:
            if self.label_threshold is not None:
                labels = raw > self.label_threshold
            else:
                labels = torch.tensor([bool(ex["_label"]) for ex in examples], dtype=torch.bool)
        groups = prompt_groups([ex["_prompt_ids"] for ex in examples])
        return SingleBatch(ids, attn, loss_mask, prompt_lengths, rewards, labels, collect_meta(examples), groups)


class ListCollator(Collator):
    """Examples with `_prompt_ids`, `_completion_ids` (K id lists) and `_scores` (K floats) ->
    `ListBatch`, each example one list; `ranking` is `rank_by_scores` (ties: earlier first)."""

    batch_type = ListBatch

    def __call__(self, examples: Sequence[dict[str, Any]]) -> ListBatch:
        sizes = sorted({len(ex["_completion_ids"]) for ex in examples})
        if len(sizes) != 1:
            raise ValueError(f"lists of {sizes} completions in one batch: a ListBatch has one K")
        prompts = [ex["_prompt_ids"] for ex in examples for _ in ex["_completion_ids"]]
        completions = [c for ex in examples for c in ex["_completion_ids"]]
        ids, attn, loss_mask, prompt_lengths = prompt_completion_tensors(prompts, completions, self.pad_token_id)
        scores = torch.tensor([list(ex["_scores"]) for ex in examples], dtype=torch.float32)  # (B, K)
        return ListBatch(ids, attn, loss_mask, prompt_lengths, scores, rank_by_scores(scores), collect_meta(examples))


class PromptCollator(Collator):
    """Examples with `_prompt_ids` -> left-padded `PromptBatch` (meta: "prompt", "reference", ...)."""

    batch_type = PromptBatch

    def __call__(self, examples: Sequence[dict[str, Any]]) -> PromptBatch:
        ids, mask = pad_left([ex["_prompt_ids"] for ex in examples], self.pad_token_id)
        return PromptBatch(ids, mask, collect_meta(examples))
