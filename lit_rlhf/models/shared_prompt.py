"""Log-probs and scalar scores of rows that may share a prompt, and every response log-prob
(`token_logps_with_grad`): on the shared-prompt layout (`lit_rlhf.ops.shared_prompt`) each prompt
runs once for all its completions, with the padded rows' values. Its 4D mask is an additive float
mask, which only `sdpa` and `eager` attention take: other models, and rows longer than a sliding
window the mask does not carry, use the padded rows (`use_layout`).
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import Tensor, nn

from lit_rlhf.models.attention import SDPA_VARLEN
from lit_rlhf.models.output_layer import as_root_forward, chunked_layers, output_layer_logps, per_token_logps
from lit_rlhf.ops.logprobs import filtered_token_logps
from lit_rlhf.ops.rl import last_true_index
from lit_rlhf.ops.shared_prompt import build_layout, longest, shares_anything
from lit_rlhf.types import PromptSharing, SharedPromptLayout

log = logging.getLogger(__name__)

SUPPORTED_ATTENTION = ("sdpa", "eager", SDPA_VARLEN)  # sdpa_varlen is sdpa for a 4D mask
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> sliding window (0: none) or why not
_long_rows_warned: weakref.WeakSet = weakref.WeakSet()


def decide_layout(model: nn.Module) -> int | str:
    """`model`'s sliding attention window (0: none) when it takes the layout's 4D mask, else the
    reason it does not (its attention implementation; warned). Cached for `use_layout`."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) if config is not None else None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) is not False else None
    found = window if isinstance(window, int) else 0
    if impl not in SUPPORTED_ATTENTION:
        found = (f"attention implementation {impl!r} takes no custom 4D attention mask (shared prompts need "
                 f"one of {SUPPORTED_ATTENTION}); using the padded layout")
        log.warning("shared prompts are off for %s: %s", type(model).__name__, found)
    _windows[model] = found
    return found


def use_layout(model: nn.Module, attention_mask: Tensor, sharing: PromptSharing) -> bool:
    """True when some rows share a prompt and `model` takes the layout's mask (`decide_layout`,
    once per model) for rows this long: none past its sliding window."""
    if not shares_anything(sharing):
        return False
    window = _windows[model] if model in _windows else decide_layout(model)
    if isinstance(window, str):
        return False
    rows = longest(attention_mask) if window else 0  # a host sync only for a model with a window
    if rows > window:
        _warn_long_rows(model, rows, window)
        return False
    return True


def _warn_long_rows(model: nn.Module, longest_row: int, window: int) -> None:
    if model not in _long_rows_warned:  # once per model
        _long_rows_warned.add(model)
        log.warning("shared prompts are off for %s: rows of %d tokens exceed its sliding attention window (%d), which "
                    "the shared layout's mask does not apply; using the padded layout", type(model).__name__, longest_row, window)


def _input_dtype(model: nn.Module) -> torch.dtype:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    return weight.dtype if weight is not None and weight.is_floating_point() else torch.float32


def _run(model: nn.Module, layout: SharedPromptLayout, **kwargs):
    return model(input_ids=layout.input_ids, attention_mask=layout.attention_bias(_input_dtype(model)),
                 position_ids=layout.position_ids, use_cache=False, **kwargs)


def layout_hidden(decoder: nn.Module, layout: SharedPromptLayout) -> Tensor:
    """Last hidden states of the packed rows, flattened: (M * L, H)."""
    out = _run(decoder, layout)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden.reshape(-1, hidden.shape[-1])


def shared_per_token_logps(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, sharing: PromptSharing,
                           temperature: float = 1.0, chunk_size: int | None = None, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """`per_token_logps` (same arguments, same (N, T) values) on the shared-prompt layout."""
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

        def chunked(where: Tensor, targets: Tensor) -> Tensor:  # as the FSDP2 root's forward, if sharded
            hidden = layout_hidden(decoder, layout)[where]  # (S, H)
            return output_layer_logps(head, hidden, targets, temperature, chunk_size, top_k, top_p)

        picked = as_root_forward(model, chunked, where, targets)
    else:  # the logits from the first context position of any packed row on (`logits_to_keep`)
        length = layout.input_ids.shape[1]
        first = int((where % length).min())
        logits = _run(model, layout, logits_to_keep=length - first).logits  # (M, L - first, V)
        rows, cols = where // length, where % length - first
        picked = filtered_token_logps(logits[rows, cols], targets, temperature, top_k, top_p)  # (S,)
    out = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
    out[:, 1:][scored] = picked
    return out


def grouped_token_logps(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                        sharing: PromptSharing | None, temperature: float = 1.0, chunk_size: int | None = None,
                        top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Per-token log-probs (N, T): on the shared-prompt layout when it applies (`use_layout`),
    else the padded path (`per_token_logps`). Same values either way."""
    if sharing is not None and use_layout(model, attention_mask, sharing):
        return shared_per_token_logps(model, input_ids, attention_mask, loss_mask, sharing, temperature, chunk_size, top_k, top_p)
    return per_token_logps(model, input_ids, attention_mask, loss_mask, temperature, chunk_size, top_k, top_p)


def token_logps_with_grad(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                          temperature: float = 1.0, micro_batch_size: int | None = None, chunk_size: int | None = None,
                          top_k: int = 0, top_p: float = 1.0, groups: Tensor | None = None) -> Tensor:
    """Log-probs (B, R) of sampled responses after left-padded prompts, 0 where `response_mask`
    is False, differentiable, `micro_batch_size` rows at a time. `groups` (B,): rows with equal ids
    have the same prompt (a GRPO group), computed once per micro-batch where the model takes the
    shared-prompt layout (`grouped_token_logps`; the same values)."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # (B, P+R)
    attention_mask = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)
    loss_mask = torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), response_mask.bool()], dim=1)
    width, size = prompt_ids.shape[1], micro_batch_size or input_ids.shape[0]
    ends = torch.full((input_ids.shape[0],), width, dtype=torch.long, device=input_ids.device)
    out = []
    for start in range(0, input_ids.shape[0], size):
        rows = slice(start, start + size)
        sharing = None if groups is None else PromptSharing(ends[rows], groups[rows])
        out.append(grouped_token_logps(model, input_ids[rows], attention_mask[rows], loss_mask[rows], sharing, temperature,
                                       chunk_size, top_k, top_p)[:, width:])
    return torch.cat(out)


def shared_scalar_scores(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, sharing: PromptSharing) -> Tensor:
    """A `ScalarHeadModel`'s score (N,) of each row at its last real token (D12), on the
    shared-prompt layout: the same values as `model.score(input_ids, attention_mask)`."""
    layout = build_layout(input_ids, attention_mask, sharing)
    last = layout.token_index.gather(1, last_true_index(attention_mask.bool())[:, None]).squeeze(1)  # (N,)

    def scores(last: Tensor) -> Tensor:  # as the FSDP2 root's forward, if sharded (`as_root_forward`)
        hidden = layout_hidden(model.backbone, layout)[last]  # (N, H)
        return model.head(hidden.to(model.head.weight.dtype)).squeeze(-1)

    return as_root_forward(model, scores, last)


def grouped_scalar_scores(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, sharing: PromptSharing | None) -> Tensor:
    """Scores (N,) of a `ScalarHeadModel` at each row's last real token, on the shared-prompt
    layout when it applies (`use_layout`), else `model.score`."""
    if sharing is not None and use_layout(model.backbone, attention_mask, sharing):
        return shared_scalar_scores(model, input_ids, attention_mask, sharing)
    return model.score(input_ids, attention_mask)
