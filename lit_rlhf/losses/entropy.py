"""`EntropyControl`: how a clipped per-token policy loss (GRPO's) keeps the policy's entropy from
collapsing, as one setting of two optional parts.

- `covariance`: Clip-Cov or KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
  Learning for Reasoning Language Models"; `lit_rlhf.losses.entropy_cov.CovarianceControl`): acts
  on the few tokens whose log-prob and advantage covary most, the ones that drive the collapse;
- `bonus`: an entropy bonus from the sampled tokens, its coefficient fixed or moved toward a
  target entropy after each rollout (Skywork-OR1's adaptive entropy control;
  `lit_rlhf.losses.entropy_bonus.EntropyBonus`).

Either, both or neither; in YAML `entropy: {covariance: {method: clip_cov}, bonus: {coef: 0.001}}`.
"""

from __future__ import annotations

import dataclasses

from lit_rlhf.losses.entropy_bonus import EntropyBonus
from lit_rlhf.losses.entropy_cov import CovarianceControl


@dataclasses.dataclass(frozen=True)
class EntropyControl:
    """The entropy control of a per-token policy loss (see the module docstring).

    Args:
        covariance: Clip-Cov or KL-Cov (`CovarianceControl`: `{method, ratio, lower, upper,
            kl_coef}`) on each micro-batch's tokens; None = off.
        bonus: an entropy bonus (`EntropyBonus`: `{coef, target, step, min_coef, max_coef}`), its
            coefficient the module's state (checkpointed); None = off.
    """

    covariance: CovarianceControl | None = None
    bonus: EntropyBonus | None = None

    def __post_init__(self) -> None:
        if isinstance(self.covariance, dict):
            object.__setattr__(self, "covariance", CovarianceControl(**self.covariance))
        if isinstance(self.bonus, dict):
            object.__setattr__(self, "bonus", EntropyBonus(**self.bonus))
