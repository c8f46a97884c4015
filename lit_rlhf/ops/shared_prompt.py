"""Shared-prompt layout (`docs/guides/memory.md`, shared prompts): the k completions of one prompt
(a preference pair, a GRPO group) packed into one row

    [prompt (p tokens), completion_1 (c_1 tokens), ..., completion_k (c_k tokens)]

with a block mask (completion j attends to the prompt and causally to itself) and positions that
restart at p for each completion: the padded layout's values for p + sum(c_j) tokens instead of
k (p + max c_j). `SharedPromptLayout.token_index` maps each real token to its packed place, so
token t is predicted from `token_index[:, t - 1]`. Running a model on it: `lit_rlhf.models.shared_prompt`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from lit_rlhf.types import PromptSharing, SharedPromptLayout


def longest(attention_mask: Tensor) -> int:
    """The most real tokens in a row of the batch."""
    return int(attention_mask.sum(dim=1).max()) if attention_mask.numel() else 0


def shares_anything(sharing: PromptSharing) -> bool:
    """True when at least two rows share a prompt (otherwise the layout saves nothing)."""
    return bool(torch.unique(sharing.groups).numel() < sharing.groups.numel())


def build_layout(input_ids: Tensor, attention_mask: Tensor, sharing: PromptSharing) -> SharedPromptLayout:
    """Pack rows that share a prompt into one row each (`SharedPromptLayout`).

    input_ids, attention_mask (N, T): the rows, with any padding (real tokens contiguous within the
    prompt columns and within the completion columns: right- or left-padded prompts, right-padded
    completions). Groups are packed in the order of their first row. Raises ValueError when rows
    of one group have different prompt tokens.
    """
    ids_cpu, mask_cpu = input_ids.cpu(), attention_mask.cpu().bool()
    ends, groups = sharing.prompt_end.tolist(), sharing.groups.tolist()
    n = ids_cpu.shape[0]
    if len(ends) != n or len(groups) != n:
        raise ValueError(f"prompt sharing describes {len(groups)} rows, the batch has {n}")
    members: dict[int, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    token_index = torch.full(ids_cpu.shape, -1, dtype=torch.long)  # packed place within its packed row
    row_of = torch.empty(n, dtype=torch.long)  # the packed row of each row
    packed_ids, packed_pos, packed_seg = [], [], []
    for m, rows in enumerate(members.values()):
        first = rows[0]
        prompt_cols = mask_cpu[first, : ends[first]].nonzero().flatten()
        prompt = ids_cpu[first, prompt_cols]
        p = prompt.shape[0]
        pieces, positions, segments = [prompt], [torch.arange(p)], [torch.zeros(p, dtype=torch.long)]
        offset = p
        for j, row in enumerate(rows, start=1):
            cols = mask_cpu[row, : ends[row]].nonzero().flatten()
            if not torch.equal(ids_cpu[row, cols], prompt):
                raise ValueError(f"rows {first} and {row} are in one prompt group but their prompts differ")
            token_index[row, cols] = torch.arange(p)
            completion_cols = ends[row] + mask_cpu[row, ends[row]:].nonzero().flatten()
            c = completion_cols.shape[0]
            token_index[row, completion_cols] = offset + torch.arange(c)
            pieces.append(ids_cpu[row, completion_cols])
            positions.append(p + torch.arange(c))
            segments.append(torch.full((c,), j, dtype=torch.long))
            offset += c
        row_of[rows] = m
        packed_ids.append(torch.cat(pieces))
        packed_pos.append(torch.cat(positions))
        packed_seg.append(torch.cat(segments))
    pad_id = int(ids_cpu[~mask_cpu][0]) if bool((~mask_cpu).any()) else 0
    out_ids = pad_sequence(packed_ids, batch_first=True, padding_value=pad_id)  # (M, L)
    out_pos = pad_sequence(packed_pos, batch_first=True)
    out_seg = pad_sequence(packed_seg, batch_first=True, padding_value=-1)
    # flat index into (M * L): packed row m's token q is m * L + q
    token_index = torch.where(token_index >= 0, token_index + row_of[:, None] * out_ids.shape[1], token_index)
    return SharedPromptLayout(out_ids, out_pos, out_seg, token_index).to(input_ids.device)
