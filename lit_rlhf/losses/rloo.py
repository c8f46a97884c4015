"""REINFORCE leave-one-out (RLOO, Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE
Style Optimization for Learning from Human Feedback in LLMs"; Lambert, "RLHF", RLOO section).

A whole response is one action: its reward is the reward model's score minus the KL penalty
`kl_coef * log(pi(y|x) / pi_ref(y|x))` of the whole sequence (`kl_coef` is the paper's beta), and
the gradient is REINFORCE on the SUMMED sequence log-prob with the mean reward of the prompt's
other k-1 responses as baseline.

`RLOOModule` composes the three steps: `rloo_sequence_rewards` and `rloo_advantages`
(`lit_rlhf.losses.grpo`) once over the whole rollout, then `rloo_loss` on each micro-batch of
rows (the leave-one-out baseline needs every response of a prompt; the loss does not).
"""

from __future__ import annotations

from torch import Tensor

from lit_rlhf.ops import masked_sum


def rloo_sequence_rewards(scores: Tensor, old_logps: Tensor, ref_logps: Tensor | None, mask: Tensor,
                          kl_coef: float) -> tuple[Tensor, Tensor]:
    """KL-penalised sequence rewards r_i = score_i - kl_coef * sum_t (log pi_old - log pi_ref)(y_i,t).

    scores: (N,); old_logps, ref_logps: (N, T) per-token log-probs of the sampled tokens under the
    sampling policy and the reference (ref_logps may be None when kl_coef == 0); mask: (N, T) bool.
    Returns (rewards (N,), kl (N,)), both without gradient.
    """
    if ref_logps is None:
        if kl_coef != 0.0:
            raise ValueError("ref_logps is required when kl_coef != 0")
        kl = scores.new_zeros(scores.shape)
    else:
        kl = masked_sum(old_logps.detach().float() - ref_logps.detach().float(), mask, dim=1)  # (N,)
    return (scores.detach().float() - kl_coef * kl), kl


def rloo_loss(logps: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """-1/n sum_i A_i * sum_t log pi(y_i,t | x, y_i,<t): REINFORCE on the summed sequence log-prob.

    logps: (n, T) per-token log-probs with gradient; advantages: (n,) (no gradient); mask: (n, T).
    The mean over rows is the mean over prompts of the 1/k sum of Ahmadian et al.'s RLOO
    estimator, as every prompt has k rows; over micro-batches it is exact when each micro-batch
    is weighted by its share of rows.
    """
    return -(advantages.detach() * masked_sum(logps, mask, dim=1)).mean()
