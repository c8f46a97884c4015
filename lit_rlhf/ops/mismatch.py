"""Mismatched prompt/completion pairs of a batch: KTO's KL reference point z0 is estimated on
the completion of another row under each row's prompt (Ethayarajh et al. 2024; used by
`lit_rlhf.modules.KTOModule`). Pure torch: the batch's ids and masks in, new ids and masks out."""

from __future__ import annotations

import torch
from torch import Tensor


def mismatch_partners(input_ids: Tensor, prompt_lengths: Tensor) -> list[int] | None:
    """For each row i, the row whose completion its prompt is paired with in the KL estimate: the
    first row after i (cyclically) whose prompt differs from row i's. None when every row has the
    same prompt (no mismatched pair exists).

    A plain shift by one row is not enough: a batch may hold several completions of one prompt
    side by side (UltraFeedback's completions per instruction, TL;DR's comparisons per post), and
    a completion moved next to its own prompt is no mismatched pair.
    input_ids: (B, T) right padded; prompt_lengths: (B,).
    """
    rows, lengths = input_ids.tolist(), prompt_lengths.tolist()
    prompts = [tuple(row[: int(n)]) for row, n in zip(rows, lengths)]
    size = len(prompts)
    partners = []
    for i in range(size):
        j = next(((i + k) % size for k in range(1, size) if prompts[(i + k) % size] != prompts[i]), None)
        if j is None:
            return None
        partners.append(j)
    return partners


def mismatched_sequences(
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    prompt_lengths: Tensor,
    pad_token_id: int,
    partners: list[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pair the prompt of row i with the completion of row `partners[i]` (default
    `mismatch_partners`: the next row with another prompt), right padded.

    input_ids, attention_mask, loss_mask: (B, T) right padded (D5); prompt_lengths: (B,).
    A row's prompt is its first `prompt_lengths[i]` tokens and its completion the tokens where
    `loss_mask` is True. Returns (input_ids, attention_mask, loss_mask) of the B mismatched
    sequences, (B, T'), with T' the longest of them; the loss mask covers the moved completion.
    """
    batch_size = input_ids.shape[0]
    if batch_size < 2:
        raise ValueError(
            f"KTO's KL estimate pairs each prompt with another row's completion: it needs at least 2 rows "
            f"per batch, got {batch_size} (raise the batch size or drop the last incomplete batch)"
        )
    if partners is None:
        partners = mismatch_partners(input_ids, prompt_lengths)
    if partners is None:
        raise ValueError(f"KTO's KL estimate needs rows with different prompts: all {batch_size} rows share one prompt")
    prompts = [input_ids[i, : int(prompt_lengths[i])] for i in range(batch_size)]
    completions = [input_ids[i][loss_mask[i].bool()] for i in range(batch_size)]
    rows = [(prompts[i], completions[partners[i]]) for i in range(batch_size)]
    length = max(len(p) + len(c) for p, c in rows)
    ids = input_ids.new_full((batch_size, length), pad_token_id)
    keep = torch.zeros(batch_size, length, dtype=torch.bool, device=input_ids.device)
    scored = torch.zeros_like(keep)
    for i, (prompt, completion) in enumerate(rows):
        end = len(prompt) + len(completion)
        ids[i, :end] = torch.cat([prompt, completion])
        keep[i, :end] = True
        scored[i, len(prompt) : end] = True
    return ids, keep, scored
