"""Per-token log-probs from logits: the pure tensor half (no model is run here).

`apply_temperature` is the one place logits are divided by the sampling temperature;
`token_logps_from_logits` shifts the logits by one position and picks the log-prob of every next
token; `selective_log_softmax` picks log-probs without a full-vocabulary log-softmax copy;
`position_ids_from_mask` gives position ids that are right under left padding (D5). Running a
model to get its log-probs (dense logits or the chunked output layer) is
`lit_rlhf.models.logprobs`; the chunked output layer itself is `lit_rlhf.ops.linear_logprobs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_CHUNK_SIZE = 256
"""Rows of logits per chunk: 256 x 49k float32 = 48 MiB (x3 with softmax and gradient in backward)."""


def apply_temperature(logits: Tensor, temperature: float, inplace: bool = False) -> Tensor:
    """`logits / temperature`: the sampling temperature applied to logits (the identity at 1).

    The one function that applies it, wherever logits meet the temperature: the sampler
    (`lit_rlhf.generation.hf.filter_logits`), the dense log-probs (`token_logps_from_logits`), the
    chunked output layer (`lit_rlhf.ops.linear_logprobs`, whose backward scales the gradient by the
    same map, the derivative of this linear one) and the shared-prompt layout's dense path. So the
    log-probs of the ratios and of the KL are those of the distribution that was sampled (N+
    details, `docs/ARCHITECTURE.md`: one temperature, applied in one place). `inplace` divides
    `logits` itself (a buffer the caller owns).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if temperature == 1.0:
        return logits
    return logits.div_(temperature) if inplace else logits / temperature


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
    column 0 (no context) is 0. The logits are divided by `temperature` (`apply_temperature`), so
    the log-probs used for ratios and KL match the distribution that was sampled.
    """
    shifted = apply_temperature(logits[:, :-1], temperature)
    logps = selective_log_softmax(shifted, input_ids[:, 1:])
    return F.pad(logps, (1, 0), value=0.0)
