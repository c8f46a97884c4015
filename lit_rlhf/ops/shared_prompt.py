"""Shared-prompt layout: a prompt computed once for all the completions that follow it.

A DPO/IPO/hinge or reward pair, or a GRPO/RLOO group, is k completions of one prompt. The
padded layout runs the prompt k times; here the k rows become one packed row

    [prompt (p tokens), completion_1 (c_1 tokens), ..., completion_k (c_k tokens)]

with a block-structured attention mask (completion j attends to the prompt and causally to itself,
never to another completion) and position ids that restart at p for every completion, so each
token is computed from exactly the context it has in its own row: the same hidden states, the same
log-probs and the same gradients as the padded layout, up to float rounding, for p + sum(c_j)
tokens instead of k (p + max c_j). With TL;DR shapes (p ~ 450, c ~ 50) a pair is 550 tokens
instead of 1000 and a group of 4 is 650 instead of 2000.

Token t of a row is predicted from the hidden state of its previous token: for the first token of
every completion that is the shared prompt's last position (`SharedPromptLayout.token_index` maps
every real token, prompt tokens included, to its packed place, so the context of token t is
simply `token_index[:, t - 1]`). Scored positions go through the same output layer code as the
padded path (`lit_rlhf.ops.logprobs`: chunked, or dense logits), and a scalar head (reward model)
reads each completion at its own last token (D12).

The 4D mask goes to the model as an additive float mask, which transformers passes through to
its `sdpa` and `eager` attention unchanged. Other attention implementations
(`flash_attention_2/3` take no arbitrary mask; `flex_attention` wants a BlockMask) make the
callers fall back to the padded layout, with a warning naming the reason, once per model
(`layout_support`).
"""

from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_rlhf.ops.logprobs import _output_layer_logps, chunked_layers, per_token_logps, selective_log_softmax
from lit_rlhf.ops.rl import last_true_index
from lit_rlhf.ops.varlen_attention import SDPA_VARLEN
from lit_rlhf.types import PromptSharing, SharedPromptLayout

log = logging.getLogger(__name__)

SUPPORTED_ATTENTION = ("sdpa", "eager", SDPA_VARLEN)  # sdpa_varlen is sdpa for a 4D mask
_warned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> reason already logged


def layout_support(model: nn.Module, longest_row: int = 0) -> str | None:
    """None when `model` takes the shared-prompt layout's 4D mask, else the reason it does not
    (logged once per model as a warning: its callers use the padded layout).

    `longest_row`: the most real tokens of a batch row. A model with sliding-window attention
    limits each token to the last `sliding_window` ones, a pattern the 4D mask does not carry:
    rows longer than the window use the padded layout."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) if config is not None else None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) is not False else None
    reason = None
    if impl not in SUPPORTED_ATTENTION:
        reason = (f"attention implementation {impl!r} takes no custom 4D attention mask (shared prompts need "
                  f"one of {SUPPORTED_ATTENTION}); using the padded layout")
    elif isinstance(window, int) and longest_row > window:
        reason = (f"rows of {longest_row} tokens exceed its sliding attention window ({window}), which the shared "
                  "layout's mask does not apply; using the padded layout")
    if reason is not None and model not in _warned:
        log.warning("shared prompts are off for %s: %s", type(model).__name__, reason)
        _warned[model] = reason
    return reason


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
    ids_cpu, mask_cpu = input_ids.detach().cpu(), attention_mask.detach().cpu().bool()
    ends, groups = sharing.prompt_end.detach().cpu().tolist(), sharing.groups.detach().cpu().tolist()
    if len(ends) != ids_cpu.shape[0] or len(groups) != ids_cpu.shape[0]:
        raise ValueError(f"prompt sharing describes {len(groups)} rows, the batch has {ids_cpu.shape[0]}")
    members: dict[int, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    n, width = ids_cpu.shape
    token_index = torch.full((n, width), -1, dtype=torch.long)
    packed_ids, packed_pos, packed_seg = [], [], []
    for rows in members.values():
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
        packed_ids.append(torch.cat(pieces))
        packed_pos.append(torch.cat(positions))
        packed_seg.append(torch.cat(segments))
    length = max(row.shape[0] for row in packed_ids)
    pad_id = int(ids_cpu[~mask_cpu][0]) if bool((~mask_cpu).any()) else 0
    out_ids = torch.full((len(packed_ids), length), pad_id, dtype=torch.long)
    out_pos = torch.zeros((len(packed_ids), length), dtype=torch.long)
    out_seg = torch.full((len(packed_ids), length), -1, dtype=torch.long)
    for m, (ids, pos, seg) in enumerate(zip(packed_ids, packed_pos, packed_seg)):
        out_ids[m, : ids.shape[0]], out_pos[m, : ids.shape[0]], out_seg[m, : ids.shape[0]] = ids, pos, seg
    # flat index into (M * L): packed row m's token q is m * L + q
    row_of = torch.empty(n, dtype=torch.long)
    for m, rows in enumerate(members.values()):
        row_of[rows] = m
    token_index = torch.where(token_index >= 0, token_index + row_of[:, None] * length, token_index)
    layout = SharedPromptLayout(out_ids, out_pos, out_seg, token_index)
    return layout.to(input_ids.device)


def _input_dtype(model: nn.Module) -> torch.dtype:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    return weight.dtype if weight is not None and weight.is_floating_point() else torch.float32


def _run(model: nn.Module, layout: SharedPromptLayout, dtype: torch.dtype, **kwargs):
    return model(input_ids=layout.input_ids, attention_mask=layout.attention_bias(dtype),
                 position_ids=layout.position_ids, use_cache=False, **kwargs)


def layout_hidden(decoder: nn.Module, layout: SharedPromptLayout) -> Tensor:
    """Last hidden states of the packed rows, flattened: (M * L, H)."""
    out = _run(decoder, layout, _input_dtype(decoder))
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden.reshape(-1, hidden.shape[-1])


def shared_per_token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    sharing: PromptSharing,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """`lit_rlhf.ops.per_token_logps` computed on the shared-prompt layout: the same (N, T)
    log-probs (0 where `loss_mask` is False), each group's prompt run once.

    `chunk_size` as in `per_token_logps` (chunked output layer, or None: the dense logits).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    layout = build_layout(input_ids, attention_mask, sharing)
    scored = loss_mask.bool()[:, 1:]  # column t scores token t from the hidden state of token t - 1
    context = layout.token_index[:, :-1]  # (N, T-1) packed place of the previous token
    if bool((scored & (context < 0)).any()):
        raise ValueError("a scored token follows a padding position: the shared-prompt layout needs each "
                         "row's real tokens contiguous")
    if not bool(scored.any()):
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    where = context[scored]  # (S,)
    targets = input_ids[:, 1:][scored]  # (S,)
    layers = chunked_layers(model, input_ids) if chunk_size else None
    if layers is not None:
        decoder, head = layers
        hidden = layout_hidden(decoder, layout)[where]  # (S, H)
        ones = torch.ones((1, where.shape[0]), dtype=torch.bool, device=where.device)
        picked = _output_layer_logps(head, hidden[None], targets[None], ones, temperature, chunk_size)[0]  # (S,)
    else:  # the logits from the first context position of any packed row on (`logits_to_keep`)
        length = layout.input_ids.shape[1]
        first = int((where % length).min())
        out = _run(model, layout, _input_dtype(model), logits_to_keep=length - first)
        logits = out.logits  # (M, L - first, V)
        rows, cols = where // length, where % length - first
        picked_logits = logits[rows, cols]  # (S, V)
        if temperature != 1.0:
            picked_logits = picked_logits / temperature
        picked = selective_log_softmax(picked_logits[None], targets[None])[0]  # (S,)
    out = torch.zeros(scored.shape, dtype=picked.dtype, device=picked.device)  # (N, T-1)
    out[scored] = picked
    return F.pad(out, (1, 0), value=0.0)


def grouped_token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    sharing: PromptSharing | None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """Per-token log-probs (N, T): on the shared-prompt layout when `sharing` is given, some rows
    share a prompt and the model takes the layout's mask (`layout_support`), else the padded path
    (`per_token_logps`). Same values either way."""
    if sharing is not None and shares_anything(sharing) and layout_support(model, longest(attention_mask)) is None:
        return shared_per_token_logps(model, input_ids, attention_mask, loss_mask, sharing, temperature, chunk_size)
    return per_token_logps(model, input_ids, attention_mask, loss_mask, temperature, chunk_size=chunk_size)


def shared_scalar_scores(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, sharing: PromptSharing) -> Tensor:
    """A `ScalarHeadModel`'s score (N,) of each row at its last real token (D12), on the
    shared-prompt layout: the same values as `model.score(input_ids, attention_mask)`."""
    layout = build_layout(input_ids, attention_mask, sharing)
    last = layout.token_index.gather(1, last_true_index(attention_mask.bool())[:, None]).squeeze(1)  # (N,)
    hidden = layout_hidden(model.backbone, layout)[last]  # (N, H)
    return model.head(hidden.to(model.head.weight.dtype)).squeeze(-1)


def grouped_scalar_scores(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, sharing: PromptSharing | None) -> Tensor:
    """Scores (N,) of a `ScalarHeadModel` at each row's last real token, on the shared-prompt
    layout when `sharing` applies (see `grouped_token_logps`), else `model.score`."""
    if sharing is not None and shares_anything(sharing) and layout_support(model.backbone, longest(attention_mask)) is None:
        return shared_scalar_scores(model, input_ids, attention_mask, sharing)
    return model.score(input_ids, attention_mask)


def shared_response_logps(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    groups: Tensor,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Log-probs (N, R) of sampled responses (0 where `response_mask` is False), each
    micro-batch of `micro_batch_size` rows computing each of its prompts once.

    prompt_ids, prompt_mask (N, P) left padded; response_ids, response_mask (N, R); groups (N,):
    rows with equal ids have the same prompt (a GRPO group). A micro-batch holding a single row of
    a group computes that row as it is; the values never depend on the grouping.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # (N, P+R)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).bool()
    loss_mask = torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), response_mask.bool()], dim=1)
    width = prompt_ids.shape[1]
    size = micro_batch_size or input_ids.shape[0]
    chunks = []
    for start in range(0, input_ids.shape[0], size):
        sl = slice(start, start + size)
        ends = torch.full((groups[sl].shape[0],), width, dtype=torch.long, device=groups.device)
        logps = grouped_token_logps(model, input_ids[sl], attention_mask[sl], loss_mask[sl], PromptSharing(ends, groups[sl]),
                                    temperature, chunk_size)  # (n, P+R)
        chunks.append(logps[:, width:])
    return torch.cat(chunks)
