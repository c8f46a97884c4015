"""PPO-ptx's language-modelling term (Ouyang et al. 2022, "Training language models to follow
instructions with human feedback", eq. 2): the PPO objective plus gamma * E_{x ~ D_pretrain}[log
pi_RL(x)], i.e. every update adds gamma * NLL of language-modelling tokens to PPO's loss.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from lit_rlhf.losses.nll import nll_loss


class PtxLossOutput(NamedTuple):
    loss: Tensor  # () ptx_coef * nll, with gradient
    nll: Tensor  # () -sum log pi over the given tokens / num_tokens, detached


def ptx_loss(logps: Tensor, mask: Tensor, ptx_coef: float, num_tokens: Tensor | float | None = None) -> PtxLossOutput:
    """gamma * E_x[-log pi(x)] of eq. 2 on the tokens of `mask`, as a token mean: ptx_coef * NLL.

    The gradient on each kept token's log-prob is -ptx_coef / num_tokens.

    Args:
        logps: (n, T) the policy's per-token log-probs of the language-modelling rows (with grad).
        mask: (n, T) bool, the tokens in the term.
        ptx_coef: eq. 2's gamma, >= 0 (0 is plain PPO).
        num_tokens: divides the summed NLL (default `mask.sum()`): the whole batch's token count when `logps`
            holds one micro-batch of it.
    """
    if not ptx_coef >= 0:
        raise ValueError(f"ptx_coef must be >= 0, got {ptx_coef}")
    nll = nll_loss(logps, mask, num_tokens)
    return PtxLossOutput(loss=ptx_coef * nll, nll=nll.detach())
