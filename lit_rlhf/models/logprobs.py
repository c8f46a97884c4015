"""Per-token log-probs of a causal LM, right under left and right padding (D5): where a method or
a generation backend gets them. Padded rows: `per_token_logps` (`lit_rlhf.models.output_layer`),
dense logits or, with `chunk_size`, the output layer a chunk of scored tokens at a time. Rows that
may share a prompt (each shared prompt run once where the model takes the layout) and sampled
responses after their prompts: `grouped_token_logps`, `token_logps_with_grad`
(`lit_rlhf.models.shared_prompt`). The same values every way. `top_k` / `top_p` replay the
sampler's filter (`lit_rlhf.ops.sampling`); a reference is scored without them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_rlhf.models.output_layer import per_token_logps
from lit_rlhf.models.shared_prompt import grouped_token_logps, token_logps_with_grad

__all__ = ["grouped_token_logps", "per_token_logps", "response_logps", "sequence_token_logps", "token_logps_with_grad"]


def response_logps(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                   temperature: float = 1.0, chunk_size: int | None = None, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probs (B, R) of the last R = `response_length` tokens of prompt+response rows, 0 where
    `attention_mask` is False (`token_logps_with_grad` with the rows split there)."""
    cut = input_ids.shape[1] - response_length
    return token_logps_with_grad(model, input_ids[:, :cut], attention_mask[:, :cut], input_ids[:, cut:], attention_mask[:, cut:],
                                 temperature, None, chunk_size, top_k, top_p)


sequence_token_logps = torch.no_grad()(token_logps_with_grad)
sequence_token_logps.__doc__ = "`token_logps_with_grad` without grad (scoring)."
