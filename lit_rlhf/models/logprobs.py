"""Per-token log-probs of a causal LM on a padded batch, right under left and right padding (D5).

Dense path: the model's logits and a log-softmax (`lit_rlhf.ops.logprobs`). Chunked path
(`chunk_size` set, for the models `chunked_layers` accepts): the decoder's last hidden states and
the output layer a chunk of scored tokens at a time (`lit_rlhf.models.output_layer`). `top_k` /
`top_p` replay the sampler's filter (`lit_rlhf.ops.sampling`); a reference is scored without them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_rlhf.models.output_layer import (as_root_forward, chunked_layers, forward_hidden, forward_logits,
                                          output_layer_logps)
from lit_rlhf.ops.logprobs import token_logps_from_logits


def per_token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """Per-token log-probs (B, T) of a (left- or right-padded) batch, 0 where `loss_mask` is False.

    `chunk_size`: the chunked path; None: dense logits, from the position before the batch's
    first scored token on (`logits_to_keep`). `top_k` / `top_p`: the sampler's filter, replayed.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    layers = chunked_layers(model, input_ids) if chunk_size else None
    if layers is not None:
        decoder, head = layers
        scored = loss_mask.bool()[:, 1:]  # column t scores token t from position t - 1; column 0 never
        if not bool(scored.any()):
            return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)

        def chunked(input_ids: Tensor, attention_mask: Tensor, scored: Tensor) -> Tensor:
            hidden = forward_hidden(decoder, input_ids, attention_mask)  # (B, T, H)
            return output_layer_logps(head, hidden[:, :-1], input_ids[:, 1:], scored, temperature, chunk_size, top_k, top_p)

        logps = as_root_forward(model, chunked, input_ids, attention_mask, scored)  # (B, T - 1)
        return F.pad(logps, (1, 0), value=0.0)
    scored_columns = loss_mask.any(dim=0).nonzero()
    if scored_columns.numel() == 0:
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    first = max(1, int(scored_columns[0]))  # column 0 has no context and is never scored
    keep = input_ids.shape[1] - first + 1  # logits of positions first-1 .. T-1
    logits = forward_logits(model, input_ids, attention_mask, logits_to_keep=keep if first > 1 else 0)
    logps = token_logps_from_logits(logits, input_ids[:, first - 1:], temperature, top_k, top_p)[:, 1:]  # (B, T - first)
    logps = F.pad(logps, (first, 0), value=0.0)  # (B, T)
    return torch.where(loss_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))


def response_logps(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                   temperature: float = 1.0, chunk_size: int | None = None, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probs (B, R) of the last R = `response_length` tokens of prompt+response rows, 0 where
    `attention_mask` is False (`per_token_logps`: only the response's R+1 positions of logits)."""
    loss_mask = attention_mask.bool().clone()
    loss_mask[:, :-response_length] = False
    return per_token_logps(model, input_ids, attention_mask, loss_mask, temperature, chunk_size, top_k, top_p)[:, -response_length:]


def token_logps_with_grad(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    chunk_size: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """Log-probs (B, R) of sampled responses after left-padded prompts, 0 where `response_mask`
    is False, differentiable, `micro_batch_size` rows at a time (`response_logps`)."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)
    size, length = micro_batch_size or input_ids.shape[0], response_ids.shape[1]
    return torch.cat([response_logps(model, input_ids[start:start + size], attention_mask[start:start + size], length,
                                     temperature, chunk_size, top_k, top_p)
                      for start in range(0, input_ids.shape[0], size)])


sequence_token_logps = torch.no_grad()(token_logps_with_grad)
sequence_token_logps.__doc__ = "`token_logps_with_grad` without grad (scoring)."
