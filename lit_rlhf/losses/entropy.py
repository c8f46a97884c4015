"""`EntropyControl`: how a clipped per-token policy loss (GRPO's) keeps the policy's entropy from
collapsing: Clip-Cov or KL-Cov (`entropy_cov`), an entropy bonus (`entropy_bonus`), either, both
or neither; in YAML `entropy: {covariance: {method: clip_cov}, bonus: {coef: 0.001}}`.
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
