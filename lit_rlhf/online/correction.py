"""A rollout source's correction for the gap between its sampler and the trainer.

`RolloutCorrection` holds the settings of `lit_rlhf.losses.rollout_correction` (mode, level,
bounds, DeepSeek-V3.2's off-policy sequence mask); a source that samples with another engine or
an older policy carries one (`VLLMSampler(correction=...)`, `AsyncRollouts(correction=...)`, in
YAML `correction: {mode: mask, level: token, lower: 0.5, upper: 2.0}`), and `tis_cap: C` is the
shorthand for `correction: {mode: truncate, level: token, upper: C}`. The online module applies
it in one place (`OnlineModule.tis_weights`) for every method with `supports_tis`, and logs
`correction_stats` whenever the rollout has the sampler's log-probs, correction on or off.
"""

from __future__ import annotations

import dataclasses
from torch import Tensor

from lit_rlhf.losses.rollout_correction import (
    CorrectionOutput, Level, Mode, check_bounds, mismatch_stats, rollout_correction
)
from lit_rlhf.types import Rollout


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """How the update corrects for the sampler (`lit_rlhf.losses.rollout_correction`).

    Args:
        mode: `truncate` (weights min(w, upper), every token kept: truncated importance sampling)
            or `mask` (weights w; tokens or sequences with w outside [lower, upper] dropped:
            IcePop's two-sided mask at the token level, TRL's sequence mask at the sequence level).
        level: the ratio w: per `token`, of the whole `sequence` (exp of the summed log-ratio), or
            its `geometric` mean (exp of the mean log-ratio).
        upper: the truncation, or the mask's upper bound (2.0: Yao et al. 2025's C = 2).
        lower: the mask's lower bound; None = 1 / upper (`mask` only).
        offpolicy_kl: DeepSeek-V3.2's off-policy sequence mask: a sequence with a negative
            advantage whose sampler/learner KL (the mean over its tokens of log pi_sampler -
            log pi_train) exceeds this is dropped; None = off.
    """

    mode: Mode = "truncate"
    level: Level = "token"
    upper: float = 2.0
    lower: float | None = None
    offpolicy_kl: float | None = None

    def __post_init__(self) -> None:
        check_bounds(self.mode, self.level, self.lower, self.upper, self.offpolicy_kl)

    def apply(self, train_logps: Tensor, sampler_logps: Tensor, mask: Tensor,
              advantages: Tensor | None = None) -> CorrectionOutput:
        """Weights and keep-mask (N, T) of the rows; `advantages` (N,) or (N, T) are needed by
        the off-policy sequence mask (without them it is not applied)."""
        offpolicy = self.offpolicy_kl if advantages is not None else None
        return rollout_correction(train_logps, sampler_logps, mask, self.mode, self.level, self.upper, self.lower,
                                  advantages, offpolicy)

    @property
    def tis_cap(self) -> float | None:
        """The shorthand this correction is (token-level truncation at `upper`), else None."""
        plain = self.mode == "truncate" and self.level == "token" and self.offpolicy_kl is None
        return self.upper if plain else None


def source_correction(tis_cap: float | None, correction: RolloutCorrection | dict | None,
                      default_cap: float | None = None) -> RolloutCorrection | None:
    """A source's correction from its two arguments: `correction`, or `tis_cap` as the token-level
    truncation (0 = off), or `default_cap` when neither is given; both given is an error."""
    if isinstance(correction, dict):
        correction = RolloutCorrection(**correction)
    if correction is not None and not isinstance(correction, RolloutCorrection):
        raise TypeError(f"correction must be a lit_rlhf.online.RolloutCorrection, got {type(correction).__name__}")
    if tis_cap is not None and tis_cap < 0:
        raise ValueError(f"tis_cap must be > 0 (0 or null = off), got {tis_cap}")
    if correction is not None:
        if tis_cap is not None:
            raise ValueError("give the rollout source a correction or a tis_cap (its token-truncate shorthand), "
                             "not both")
        return correction
    cap = default_cap if tis_cap is None else tis_cap
    return RolloutCorrection("truncate", "token", float(cap)) if cap else None


def correction_stats(rollout: Rollout, correction: RolloutCorrection | None) -> dict[str, Tensor]:
    """`rollout/sampler_logprob_diff` (mean and max of |learner - sampler| per token) and
    `rollout_correction/{kl_k1, kl_k3, ratio_mean, ratio_min, ratio_max, ratio_p05, ratio_p50,
    ratio_p95, masked_fraction, weight_mean}` of the rollout's learner log-probs (`logps`: the
    ones the correction weighs with) against its sampler's; {} without either. The masked
    fraction and the weights' mean are the ratio's (the off-policy sequence mask reads the
    advantages, which the update computes: not counted here); 0 and 1 with no correction."""
    if rollout.sampler_logps is None or rollout.logps is None or not rollout.loss_mask.any():
        return {}
    train, sampler, mask = rollout.logps, rollout.sampler_logps, rollout.loss_mask
    applied = None if correction is None else correction.apply(train, sampler, mask)
    stats = mismatch_stats(train, sampler, mask, applied)._asdict()
    diff = (train.float() - sampler.float()).abs()[mask]  # the trainer's log-probs against the sampler's
    return {"rollout/sampler_logprob_diff": diff.mean(), "rollout/sampler_logprob_diff_max": diff.max(),
            **{f"rollout_correction/{name}": value for name, value in stats.items()}}



def tis_weights(correction: RolloutCorrection | None, rollout: Rollout, rows: Tensor, train_logps: Tensor,
                advantages: Tensor | None = None) -> Tensor | None:
    """`correction` of `rows` as one factor (n, R), weights * keep (a dropped token weighs 0 and
    still counts in a token mean's denominator); None when off or without the sampler's log-probs.
    `train_logps`: the trainer's log-probs of the rows at sampling time; `advantages` (n,) or
    (n, R): theirs, read by DeepSeek-V3.2's off-policy sequence mask."""
    if correction is None or rollout.sampler_logps is None:
        return None
    return correction.apply(train_logps, rollout.sampler_logps[rows], rollout.loss_mask[rows], advantages).factor()
