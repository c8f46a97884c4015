"""Pure loss functions on tensors (no Lightning, no transformers).

Each returns a NamedTuple whose first field is the loss, followed by detached statistics.
"""

from lit_rlhf.losses.best_of_n import Selection, best_of_n_kl, rejection_sampling_mask
from lit_rlhf.losses.dpo import DPO_LOSS_TYPES, DPOLossOutput, DPOLossType, XPOLossOutput, dpo_loss, xpo_loss
from lit_rlhf.losses.drov import DROVLossOutput, batch_value_estimate, drov_loss
from lit_rlhf.losses.dapo import informative_groups
from lit_rlhf.losses.distillation import (
    ChunkedGKDOutput, DistillationPGOutput, GKDLossOutput, chunked_gkd_loss, distillation_pg_loss, generalized_jsd,
    gkd_loss, reverse_kl_advantages, topk_buckets
)
from lit_rlhf.losses.entropy import EntropyControl
from lit_rlhf.losses.entropy_bonus import EntropyBonus, adaptive_entropy_coef, entropy_bonus_penalty, sampled_entropy
from lit_rlhf.losses.entropy_cov import CovarianceControl, clip_cov_keep, kl_cov_penalty, kl_cov_selected, token_covariance
from lit_rlhf.losses.grpo import Aggregation, AdvantageScale, GRPOLossOutput, grpo_advantages, grpo_policy_loss
from lit_rlhf.losses.gspo import gspo_policy_loss
from lit_rlhf.losses.kto import (
    KTO_WEIGHT_RATIO_RANGE, KTOLossOutput, RewardLabels, kto_kl_estimate, kto_loss, kto_weight_ratio,
    labels_from_rewards
)
from lit_rlhf.losses.listwise import ListwiseLossOutput, listwise_dpo_loss, plackett_luce_loss, rank_by_scores
from lit_rlhf.losses.nll import nll_loss
from lit_rlhf.losses.orpo import ORPOLossOutput, log_odds, orpo_loss
from lit_rlhf.losses.ppo import (
    PPOPolicyLossOutput, PPORewardsOutput, PPOValueLossOutput, ppo_policy_loss, ppo_rewards, ppo_value_loss
)
from lit_rlhf.losses.ptx import PtxLossOutput, ptx_loss
from lit_rlhf.losses.reinforce_pp import clipped_token_loss, normalize_token_advantages, reinforce_pp_advantages
from lit_rlhf.losses.remax import remax_advantages
from lit_rlhf.losses.reward import RewardLossOutput, bradley_terry_loss
from lit_rlhf.losses.rloo import rloo_advantages, rloo_loss
from lit_rlhf.losses.rollout_correction import (
    CorrectionOutput, MismatchStats, mismatch_stats, rollout_correction, truncated_importance_weights
)

__all__ = [
    "adaptive_entropy_coef", "AdvantageScale", "Aggregation", "batch_value_estimate", "best_of_n_kl",
    "bradley_terry_loss", "chunked_gkd_loss", "ChunkedGKDOutput", "clip_cov_keep", "clipped_token_loss",
    "CorrectionOutput", "CovarianceControl", "distillation_pg_loss", "DistillationPGOutput", "dpo_loss",
    "DPO_LOSS_TYPES", "DPOLossOutput", "DPOLossType", "drov_loss", "DROVLossOutput", "entropy_bonus_penalty",
    "EntropyBonus", "EntropyControl", "generalized_jsd", "gkd_loss", "GKDLossOutput", "grpo_advantages",
    "grpo_policy_loss", "GRPOLossOutput", "gspo_policy_loss", "informative_groups", "kl_cov_penalty",
    "kl_cov_selected", "kto_kl_estimate", "kto_loss", "kto_weight_ratio", "KTO_WEIGHT_RATIO_RANGE", "KTOLossOutput",
    "labels_from_rewards", "listwise_dpo_loss", "ListwiseLossOutput", "log_odds", "mismatch_stats", "MismatchStats",
    "nll_loss", "normalize_token_advantages", "orpo_loss", "ORPOLossOutput", "plackett_luce_loss",
    "ppo_policy_loss", "ppo_rewards", "ppo_value_loss", "PPOPolicyLossOutput", "PPORewardsOutput",
    "PPOValueLossOutput", "ptx_loss", "PtxLossOutput", "rank_by_scores", "reinforce_pp_advantages",
    "rejection_sampling_mask", "remax_advantages", "reverse_kl_advantages", "RewardLabels", "RewardLossOutput",
    "rloo_advantages", "rloo_loss", "rollout_correction", "sampled_entropy", "Selection", "token_covariance",
    "topk_buckets", "truncated_importance_weights", "xpo_loss", "XPOLossOutput"
]
