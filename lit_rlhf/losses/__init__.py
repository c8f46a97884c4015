"""Pure loss functions on tensors (no Lightning, no transformers).

Each returns a NamedTuple whose first field is the loss, followed by detached statistics.
"""

from lit_rlhf.losses.best_of_n import Selection, best_of_n_kl, rejection_sampling_mask
from lit_rlhf.losses.dpo import DPO_LOSS_TYPES, DPOLossOutput, DPOLossType, XPOLossOutput, dpo_loss, xpo_loss
from lit_rlhf.losses.drov import DROVLossOutput, batch_value_estimate, drov_loss
from lit_rlhf.losses.dapo import informative_groups
from lit_rlhf.losses.distillation import (
    ChunkedGKDOutput,
    DistillationPGOutput,
    GKDLossOutput,
    chunked_gkd_loss,
    distillation_pg_loss,
    generalized_jsd,
    gkd_loss,
    reverse_kl_advantages,
    topk_buckets,
)
from lit_rlhf.losses.entropy import EntropyControl
from lit_rlhf.losses.entropy_bonus import EntropyBonus, adaptive_entropy_coef, entropy_bonus_penalty, sampled_entropy
from lit_rlhf.losses.entropy_cov import CovarianceControl, clip_cov_keep, kl_cov_penalty, kl_cov_selected, token_covariance
from lit_rlhf.losses.grpo import Aggregation, AdvantageScale, GRPOLossOutput, grpo_advantages, grpo_policy_loss
from lit_rlhf.losses.gspo import gspo_policy_loss
from lit_rlhf.losses.kto import (
    KTO_WEIGHT_RATIO_RANGE,
    KTOLossOutput,
    RewardLabels,
    kto_kl_estimate,
    kto_loss,
    kto_weight_ratio,
    labels_from_rewards,
)
from lit_rlhf.losses.listwise import ListwiseLossOutput, listwise_dpo_loss, plackett_luce_loss, rank_by_scores
from lit_rlhf.losses.nll import nll_loss
from lit_rlhf.losses.orpo import ORPOLossOutput, log_odds, orpo_loss
from lit_rlhf.losses.ppo import (
    PPOPolicyLossOutput,
    PPORewardsOutput,
    PPOValueLossOutput,
    ppo_policy_loss,
    ppo_rewards,
    ppo_value_loss,
)
from lit_rlhf.losses.ptx import PtxLossOutput, ptx_loss
from lit_rlhf.losses.reinforce_pp import clipped_token_loss, normalize_token_advantages, reinforce_pp_advantages
from lit_rlhf.losses.remax import remax_advantages
from lit_rlhf.losses.reward import RewardLossOutput, bradley_terry_loss
from lit_rlhf.losses.rloo import rloo_advantages, rloo_loss
from lit_rlhf.losses.rollout_correction import (
    CorrectionOutput,
    MismatchStats,
    mismatch_stats,
    rollout_correction,
    truncated_importance_weights,
)

__all__ = [
    "truncated_importance_weights",
    "CorrectionOutput",
    "MismatchStats",
    "mismatch_stats",
    "rollout_correction",
    "CovarianceControl",
    "EntropyBonus",
    "EntropyControl",
    "adaptive_entropy_coef",
    "entropy_bonus_penalty",
    "sampled_entropy",
    "clip_cov_keep",
    "kl_cov_penalty",
    "kl_cov_selected",
    "token_covariance",
    "KTO_WEIGHT_RATIO_RANGE",
    "AdvantageScale",
    "Aggregation",
    "DPO_LOSS_TYPES",
    "DPOLossOutput",
    "DPOLossType",
    "DROVLossOutput",
    "DistillationPGOutput",
    "GKDLossOutput",
    "GRPOLossOutput",
    "KTOLossOutput",
    "ORPOLossOutput",
    "PPOPolicyLossOutput",
    "PPORewardsOutput",
    "PPOValueLossOutput",
    "PtxLossOutput",
    "RewardLabels",
    "RewardLossOutput",
    "Selection",
    "batch_value_estimate",
    "best_of_n_kl",
    "bradley_terry_loss",
    "distillation_pg_loss",
    "chunked_gkd_loss",
    "ChunkedGKDOutput",
    "clipped_token_loss",
    "dpo_loss",
    "xpo_loss",
    "XPOLossOutput",
    "drov_loss",
    "generalized_jsd",
    "gkd_loss",
    "grpo_advantages",
    "grpo_policy_loss",
    "gspo_policy_loss",
    "informative_groups",
    "kto_kl_estimate",
    "kto_loss",
    "kto_weight_ratio",
    "labels_from_rewards",
    "ListwiseLossOutput",
    "listwise_dpo_loss",
    "plackett_luce_loss",
    "rank_by_scores",
    "log_odds",
    "nll_loss",
    "normalize_token_advantages",
    "orpo_loss",
    "ppo_policy_loss",
    "ppo_rewards",
    "ppo_value_loss",
    "ptx_loss",
    "reinforce_pp_advantages",
    "rejection_sampling_mask",
    "remax_advantages",
    "reverse_kl_advantages",
    "rloo_advantages",
    "rloo_loss",
    "topk_buckets",
]
