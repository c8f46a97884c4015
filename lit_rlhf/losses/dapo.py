"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"):
the dynamic-sampling constraint on groups. DAPO's loss is GRPO's (`losses.grpo.grpo_policy_loss`)
with clip-higher (eps_high > eps_low) and the token mean; its overlong filtering is a loss mask.
"""

from __future__ import annotations

from torch import Tensor

from lit_rlhf.ops import groups_of


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """DAPO's dynamic-sampling constraint (Yu et al. 2025, Eq. 11: 0 < |{o_i correct}| < G),
    generalised to any reward: True for each group whose G scores are not all equal.

    Args:
        scores: (B*G,), each prompt's G completions contiguous; returns (B,) bool.
        group_size: G, the completions per prompt.
    """
    grouped = groups_of(scores, group_size)  # (B, G)
    return ~(grouped == grouped[:, :1]).all(dim=1)
