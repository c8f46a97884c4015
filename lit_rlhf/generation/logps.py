"""Log-probs of sampled responses under a model, whichever backend sampled them: the sampled
tokens scored with the sampler's temperature and, when given, its top-k / top-p filter replayed
(`lit_rlhf.models.logprobs.response_logps`, dense or a chunked output layer), position ids right
under left padding, in micro-batches.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_rlhf.models.logprobs import response_logps


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
    """Log-probs (B, R) of the response tokens under `model`, 0 where `response_mask` is False,
    differentiable (for the policy update). `chunk_size`: the output layer is applied that many
    tokens at a time; `top_k` / `top_p`: the sampler's filter, replayed on the model's logits
    (`lit_rlhf.ops.sampling`)."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    size = micro_batch_size or input_ids.shape[0]
    chunks = []
    for start in range(0, input_ids.shape[0], size):
        sl = slice(start, start + size)
        chunks.append(response_logps(model, input_ids[sl], attention_mask[sl], response_ids.shape[1], temperature, chunk_size,
                                     top_k, top_p))
    logps = torch.cat(chunks)
    return torch.where(response_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))


sequence_token_logps = torch.no_grad()(token_logps_with_grad)
sequence_token_logps.__doc__ = "`token_logps_with_grad` without grad (scoring)."
