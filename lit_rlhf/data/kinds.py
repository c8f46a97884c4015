"""The kinds of DataModule the datasets share: prompts, rows with capped completions, SFT rows
(padded or packed), and preference pairs."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from lit_rlhf.data.base import MarginFrom, RLHFDataModule
from lit_rlhf.data.collate import PreferenceCollator, PromptCollator
from lit_rlhf.data.packing import sft_collator


class _ReferenceTexts:
    def reference_texts(self, split: str = "val") -> tuple[list[str], list[str]]:
        """(prompt texts, reference completion texts) of a split ("train", "val" or "test"), rows
        without a reference left out. Completions carry no EOS text (the collators append
        `eos_token_id`). Used for D15 reward normalisation."""
        pairs = [(p, r) for p, r in zip(self.dataset(split)["prompt"], self.dataset(split)["reference"]) if r is not None]
        if not pairs:
            raise ValueError(f"split {split!r} has no reference completions")
        prompts, references = zip(*pairs)
        return list(prompts), list(references)


class PromptDataModule(RLHFDataModule):
    """A DataModule of prompts for online methods: left-padded `PromptBatch`es (D5)."""

    def _collator(self, role: str) -> Callable:
        return PromptCollator(self.tokenizer.pad_token_id)


class CompletionDataModule(RLHFDataModule):
    """A DataModule whose rows carry completions, capped in length.

    Args:
        max_completion_length: the longest completion in tokens, EOS included.
        truncate_completions: cut a longer completion to `max_completion_length - 1` tokens + EOS
            (counted in `truncated_completions` and logged); False: it is a bad row.
    """

    def __init__(self, *, max_completion_length: int = 1024, truncate_completions: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_completion_length = max_completion_length
        self.truncate_completions = truncate_completions


class SFTDataModule(CompletionDataModule):
    """A DataModule of (prompt, completion) rows for supervised fine-tuning, padded or packed.

    Args:
        packing: collate `PackedSFTBatch` (each batch's examples laid end to end without padding,
            `lit_rlhf.data.packing`) instead of the right-padded `SFTBatch`; the loss is the same.
        pack_length: the longest packed row, in tokens; null: one row per batch.
    """

    def __init__(self, *, packing: bool = False, pack_length: int | None = None, **kwargs: Any):
        if pack_length is not None and pack_length < 1:
            raise ValueError(f"pack_length must be >= 1 or null (one row per batch), got {pack_length}")
        super().__init__(**kwargs)
        self.packing = packing
        self.pack_length = pack_length

    def _collator(self, role: str) -> Callable:
        return sft_collator(self.tokenizer.pad_token_id, self.packing, self.pack_length)


class PreferenceDataModule(CompletionDataModule):
    """A DataModule of (prompt, chosen, rejected) rows: `PreferenceBatch` (rows [:B] chosen, [B:] rejected).

    Args:
        margin_from: where `batch.margin` comes from (`margin_sources`: the labeller's confidence
            for TL;DR, the score difference for UltraFeedback); null: no margin.
    """

    margin_sources: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, margin_from: MarginFrom | None = None, **kwargs: Any):
        if margin_from not in (None, *self.margin_sources):
            raise ValueError(f"{type(self).__name__} supports margin_from None or {self.margin_sources}, "
                             f"got {margin_from!r}")
        super().__init__(**kwargs)
        self.margin_from = margin_from

    def _collator(self, role: str) -> Callable:
        return PreferenceCollator(self.tokenizer.pad_token_id, with_margin=self.margin_from is not None)

