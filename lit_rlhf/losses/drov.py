"""DRO-V: Direct Reward Optimisation with a value network (Richemond et al. 2024)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class DROVLossOutput(NamedTuple):
    loss: Tensor  # () policy_loss + value_loss (what the optimiser steps on)
    policy_loss: Tensor  # () surrogate whose policy gradient is Eq. 8 / tau
    value_loss: Tensor  # () 1/2 mean (r - V - tau * logratio.detach())^2; its V-gradient is Eq. 7
    objective: Tensor  # () the DRO loss L = 1/2 mean (r - V - tau * logratio)^2, detached
    logratio: Tensor  # () mean log pi/pi_ref of the batch, detached
    values: Tensor  # () mean V(x), detached
    advantages: Tensor  # () mean r - V(x), detached
    residuals: Tensor  # () mean r - V - tau * logratio (0 at the optimum), detached


def drov_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    values: Tensor,
    rewards: Tensor,
    tau: float = 1.0,
) -> DROVLossOutput:
    """The DRO-V losses on single-trajectory data (x, y, scalar r): the DRO objective (Richemond et
    al. 2024, Sec. 4) L = 1/2 mean_b (r - V(x) - tau * log(pi(y|x) / pi_ref(y|x)))^2, as two
    surrogates whose gradients are the paper's updates (sg = stop-gradient):

    - policy_loss = mean_b[-(r - sg(V)) * log pi + (tau/2) * (log pi - log pi_ref)^2], whose
      gradient is Eq. 8 divided by tau (`docs/ARCHITECTURE.md` section 2); its value is not L.
    - value_loss = 1/2 mean_b (r - V - tau * sg(log pi/pi_ref))^2, whose V-gradient is Eq. 7.

    Neither moves the other's network: one optimiser steps `loss = policy_loss + value_loss`.

    Args:
        policy_logps: (B,) sequence log-probs log pi(y|x).
        ref_logps: (B,) log pi_ref(y|x).
        values: (B,) V(x) from the value network (one value per prompt).
        rewards: (B,) r(x, y), normalised to mean 0, variance 1 upstream (`docs/ARCHITECTURE.md` section 2).
        tau: the KL strength, > 0.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    logratio = policy_logps - ref_logps  # (B,)
    advantages = rewards - values.detach()  # (B,)
    policy_loss = (-advantages * policy_logps + 0.5 * tau * logratio**2).mean()
    residual_for_value = rewards - values - tau * logratio.detach()  # (B,)
    value_loss = 0.5 * (residual_for_value**2).mean()
    residual = residual_for_value.detach()  # = r - V - tau * logratio, all detached
    return DROVLossOutput(
        loss=policy_loss + value_loss,
        policy_loss=policy_loss,
        value_loss=value_loss,
        objective=0.5 * (residual**2).mean(),
        logratio=logratio.detach().mean(),
        values=values.detach().mean(),
        advantages=advantages.detach().mean(),
        residuals=residual.mean(),
    )


def batch_value_estimate(policy_logps: Tensor, ref_logps: Tensor, rewards: Tensor, tau: float = 1.0) -> Tensor:
    """The DRO paper's single-value ablation: one value for every prompt, E_x[V(x)] estimated
    from the batch (Richemond et al. 2024, Sec. 3.2), detached, expanded to (B,).

    For a fixed policy the V(x) minimising L is V(x) = E_{y|x}[r(x,y) - tau log(pi(y|x)/pi_ref(y|x))]
    (set dL/dV(x) = 0), so E_x[V(x)] = E_{x,y}[r - tau log pi/pi_ref], whose batch estimate is

        V = mean_b (r_b - tau * (log pi(y_b|x_b) - log pi_ref(y_b|x_b))),

    also the constant that minimises the batch's L. It has no parameters (nothing to learn, no
    value learning rate) and is held fixed in the policy's gradient (the stop-gradient of Eq. 8).

    Args:
        policy_logps: (B,) log pi(y|x).
        ref_logps: (B,) log pi_ref(y|x).
        rewards: (B,) r(x, y).
        tau: the KL strength.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    estimate = (rewards - tau * (policy_logps - ref_logps)).detach().mean()
    return estimate.expand(rewards.shape[0])
