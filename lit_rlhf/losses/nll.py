"""The token-mean negative log-likelihood of given completions: supervised fine-tuning's loss, the
fine-tuning step of rejection sampling (`losses.best_of_n`) and PPO-ptx's language-modelling
term (`losses.ptx`)."""

from __future__ import annotations

from torch import Tensor

from lit_rlhf.ops import masked_sum


def nll_loss(logps: Tensor, mask: Tensor, num_tokens: Tensor | float | None = None) -> Tensor:
    """-sum_{i,t} log pi(y_i,t | x_i, y_i,<t) / (number of tokens): the token-mean NLL.

    A micro-batch's share of a larger batch's token mean passes that batch's token count, so the
    shares of its micro-batches add up to the batch's token mean.

    Args:
        logps: (n, T) per-token log-probs, with gradient.
        mask: (n, T) bool, True on the scored tokens.
        num_tokens: what the sum is divided by; None = `mask.sum()`, the token mean of these rows.
    """
    tokens = mask.sum() if num_tokens is None else num_tokens
    if isinstance(tokens, Tensor):
        tokens = tokens.clamp(min=1)
    elif tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    return -masked_sum(logps, mask) / tokens
