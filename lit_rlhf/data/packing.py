"""Padding-free packing of SFT batches: `PackedSFTCollator` collates the examples the padded
`SFTCollator` gets (the same optimizer steps, loss and resume) into a `PackedSFTBatch`, laid end
to end in rows of at most `pack_length` tokens (first-fit decreasing), position ids restarting at
every example (`lit_rlhf.types.unpack` turns it back into an `SFTBatch`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from lit_rlhf.data.collate import Collator, SFTCollator, collect_meta
from lit_rlhf.types import PackedSFTBatch


def first_fit_decreasing(lengths: Sequence[int], capacity: int | None) -> list[list[int]]:
    """Bins of example indices, each bin's total length <= `capacity` (an example longer than
    `capacity` gets a bin of its own); `capacity=None`: one bin with every example.

    First-fit decreasing: examples from longest to shortest, each into the first bin it fits
    (ties keep the input order). Within a bin the indices are in increasing order, so the
    packed layout does not depend on how equal lengths were sorted.
    """
    if capacity is not None and capacity < 1:
        raise ValueError(f"pack_length must be >= 1 or None, got {capacity}")
    if not lengths:
        return []
    if capacity is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def pack_sequences(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_token_id: int,
    pack_length: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Prompt+completion examples packed into rows: (input_ids, position_ids, attention_mask,
    loss_mask, example_rows, example_starts, example_lengths), as in `PackedSFTBatch`.

    Rows hold at most `pack_length` tokens (None: one row with every example); the width is the
    longest row. `loss_mask` is True on the completion tokens, as `prompt_completion_tensors` has it.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    lengths = [len(s) for s in seqs]
    if any(n == 0 for n in lengths):
        raise ValueError(f"cannot pack an empty example (examples {[i for i, n in enumerate(lengths) if n == 0]})")
    bins = first_fit_decreasing(lengths, pack_length)
    width = max((sum(lengths[i] for i in b) for b in bins), default=0)
    rows = len(bins)
    ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    positions = torch.zeros((rows, width), dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.bool)
    loss = torch.zeros((rows, width), dtype=torch.bool)
    ex_rows = torch.zeros(len(seqs), dtype=torch.long)
    ex_starts = torch.zeros(len(seqs), dtype=torch.long)
    for r, members in enumerate(bins):
        at = 0
        for i in members:
            n, p = lengths[i], len(prompts[i])
            ids[r, at: at + n] = torch.as_tensor(seqs[i], dtype=torch.long)
            positions[r, at: at + n] = torch.arange(n)
            attention[r, at: at + n] = True
            loss[r, at + p: at + n] = True  # the completion tokens, as in the padded layout
            ex_rows[i], ex_starts[i] = r, at
            at += n
        positions[r, at:] = torch.arange(width - at)  # the PAD tail: one more segment, never attended to
    return ids, positions, attention, loss, ex_rows, ex_starts, torch.tensor(lengths, dtype=torch.long)


class PackedSFTCollator(Collator):
    """Examples with `_prompt_ids`, `_completion_ids` -> `PackedSFTBatch` (padding-free rows of at
    most `pack_length` tokens; None: one row per batch). `meta` lists the examples in input order."""

    batch_type = PackedSFTBatch

    def __init__(self, pad_token_id: int, pack_length: int | None = None):
        if pack_length is not None and pack_length < 1:
            raise ValueError(f"pack_length must be >= 1 or None (one row per batch), got {pack_length}")
        super().__init__(pad_token_id)
        self.pack_length = pack_length

    def __call__(self, examples: Sequence[dict[str, Any]]) -> PackedSFTBatch:
        packed = pack_sequences([ex["_prompt_ids"] for ex in examples], [ex["_completion_ids"] for ex in examples],
                                self.pad_token_id, self.pack_length)
        return PackedSFTBatch(*packed, collect_meta(examples))


def sft_collator(pad_token_id: int, packing: bool, pack_length: int | None = None):
    """The SFT collator a DataModule's `packing` / `pack_length` options ask for."""
    return PackedSFTCollator(pad_token_id, pack_length) if packing else SFTCollator(pad_token_id)
