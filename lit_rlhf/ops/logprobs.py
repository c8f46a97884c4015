"""Per-token log-probs from logits, the pure tensor half: running a model for them is
`lit_rlhf.models.logprobs`, the chunked output layer `lit_rlhf.ops.linear_logprobs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_rlhf.ops.sampling import apply_temperature, filters, keep_targets

DEFAULT_CHUNK_SIZE = 256
"""Rows of logits per chunk: 256 x 49k float32 = 48 MiB (x3 with softmax and gradient in backward)."""


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, T) -> (B, T) position ids from 0 at each row's first real token (D5), 0 on padding."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp(min=0) * mask


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    """`log_softmax(logits)[..., index]`, (..., V) and (...) -> (...) in float32 or better,
    without the full log-softmax: `gather - logsumexp`, half precision upcast a row at a time."""
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    rows = []
    for row_logits, row_index in zip(logits, index):
        row_logps = F.log_softmax(row_logits.float(), dim=-1)
        rows.append(row_logps.gather(-1, row_index.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def token_logps_from_logits(logits: Tensor, input_ids: Tensor, temperature: float = 1.0, top_k: int = 0,
                            top_p: float = 1.0) -> Tensor:
    """(B, T): column t the log-prob of token t under `logits[:, t - 1]` (B, T, V), column 0 is 0;
    at `temperature`, with the sampler's `top_k` / `top_p` filter replayed (`lit_rlhf.ops.sampling`)."""
    if filters(top_k, top_p):  # the filtered rows a chunk at a time; the last column's target is a dummy
        targets = F.pad(input_ids[:, 1:], (0, 1)).reshape(-1)  # (B * T,)
        logps = filtered_token_logps(logits.reshape(-1, logits.shape[-1]), targets, temperature, top_k, top_p)
        return F.pad(logps.view(input_ids.shape)[:, :-1], (1, 0), value=0.0)
    shifted = apply_temperature(logits[:, :-1], temperature)
    logps = selective_log_softmax(shifted, input_ids[:, 1:])
    return F.pad(logps, (1, 0), value=0.0)


def filtered_token_logps(logits: Tensor, targets: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                         chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """Log-probs (N,) of `targets` (N,) under the sampled distribution of `logits` (N, V):
    temperature, top-k and top-p (`filter_logits`, the target kept), `chunk_size` rows at a time
    in float32 (float64 stays float64). Gradients flow through the kept tokens; the mask is a
    constant of the logits. Without a filter: `selective_log_softmax` of the tempered logits."""
    if not filters(top_k, top_p):
        return selective_log_softmax(apply_temperature(logits, temperature), targets)
    acc = torch.promote_types(logits.dtype, torch.float32)
    out = []
    for start in range(0, logits.shape[0], chunk_size):
        z = apply_temperature(logits[start:start + chunk_size].to(acc), temperature)  # (c, V)
        t = targets[start:start + chunk_size]
        out.append(selective_log_softmax(keep_targets(z, top_k, top_p, t), t))
    return torch.cat(out) if out else logits.new_zeros(0, dtype=acc)
