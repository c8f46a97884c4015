"""Per-token log-probs from a causal LM, right under left and right padding (D5, issue 2 item 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that start at 0 on the first real token of each row (left padding safe).

    Padding positions get 0 (they are masked out of attention anyway). (B, T) -> (B, T) long.
    """
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp(min=0) * mask


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    """`log_softmax(logits)[..., index]` without materialising the full log-softmax.

    logits: (..., V), index: (...) long -> (...) in float32 or better.
    For float32/float64 this is `gather - logsumexp`. Half-precision logits are upcast one row at a
    time, so no full-vocabulary float32 copy of the whole batch exists at once.
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    rows = []
    for row_logits, row_index in zip(logits, index):
        row_logps = F.log_softmax(row_logits.float(), dim=-1)
        rows.append(row_logps.gather(-1, row_index.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def token_logps_from_logits(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probs of `input_ids[:, 1:]` under next-token `logits[:, :-1]`.

    logits: (B, T, V), input_ids: (B, T) -> (B, T) where column t scores token t given tokens < t;
    column 0 (no context) is 0. The temperature divides the logits here and nowhere else, so the
    log-probs used for ratios and KL match the distribution that was sampled.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    shifted = logits[:, :-1]
    if temperature != 1.0:
        shifted = shifted / temperature
    logps = selective_log_softmax(shifted, input_ids[:, 1:])
    return F.pad(logps, (1, 0), value=0.0)


def forward_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int = 0) -> Tensor:
    """Run a causal LM with position ids derived from the mask; (B, T) -> (B, T', V).

    `logits_to_keep > 0` asks the model for the logits of the last that many positions only.
    """
    kwargs = {}
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **kwargs,
    )
    return out.logits


def per_token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    temperature: float = 1.0,
) -> Tensor:
    """Per-token log-probs (B, T) of a (left- or right-padded) batch, 0 where `loss_mask` is False.

    Logits are computed only from the position before the batch's first scored token onwards
    (`logits_to_keep`): prompt positions that score nothing never reach the output layer.
    """
    scored_columns = loss_mask.any(dim=0).nonzero()
    if scored_columns.numel() == 0:
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    first = max(1, int(scored_columns[0]))  # column 0 has no context and is never scored
    keep = input_ids.shape[1] - first + 1  # logits of positions first-1 .. T-1
    logits = forward_logits(model, input_ids, attention_mask, logits_to_keep=keep if first > 1 else 0)
    logps = token_logps_from_logits(logits, input_ids[:, first - 1:], temperature)[:, 1:]  # (B, T - first)
    logps = F.pad(logps, (first, 0), value=0.0)  # (B, T)
    return torch.where(loss_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))


def response_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_length: int,
    temperature: float = 1.0,
) -> Tensor:
    """Log-probs (B, R) of the last `response_length` tokens of left-padded prompt+response rows.

    Only R+1 positions of logits are computed (the prompt's logits are never materialised).
    Positions past the response mask are left to the caller to mask.
    """
    logits = forward_logits(model, input_ids, attention_mask, logits_to_keep=response_length + 1)
    logps = token_logps_from_logits(logits, input_ids[:, -(response_length + 1):], temperature)
    return logps[:, 1:]
