"""One LightningModule per method. Shared plumbing is in `base.TrainingModule`, `policy.PolicyModule`,
`pairwise.OfflineModule` (the offline methods' steps) with `pairwise.PairwiseModule` (pairwise
preferences) and `online.OnlineModule`."""

from lit_rlhf.training.base import TrainingModule
from lit_rlhf.modules.policy import PolicyModule
from lit_rlhf.modules.pairwise import OfflineModule, PairLogps, PairwiseModule
from lit_rlhf.modules.dpo import DPOModule
from lit_rlhf.modules.drov import DROVModule
from lit_rlhf.modules.kto import KTOModule
from lit_rlhf.modules.orpo import ORPOModule
from lit_rlhf.modules.reward import RewardModule
from lit_rlhf.modules.listwise import ListwiseDPOModule, ListwiseRewardModule
from lit_rlhf.modules.grpo import DrGRPOModule, GRPOModule
from lit_rlhf.modules.dapo import DAPOModule
from lit_rlhf.modules.gspo import GSPOModule
from lit_rlhf.modules.reinforce_pp import ReinforcePPModule
from lit_rlhf.modules.ppo import PPOModule
from lit_rlhf.modules.ppo_ptx import PPOPtxModule
from lit_rlhf.modules.rloo import RLOOModule
from lit_rlhf.modules.sft import SFTModule
from lit_rlhf.modules.remax import ReMaxModule
from lit_rlhf.modules.rejection_sampling import RejectionSamplingModule
from lit_rlhf.modules.online_dpo import OnlineDPOModule
from lit_rlhf.modules.distillation import DistillationModule
from lit_rlhf.modules.xpo import XPOModule

__all__ = ["DAPOModule", "DistillationModule", "DrGRPOModule", "GRPOModule", "GSPOModule", "PPOModule", "DPOModule", "DROVModule", "KTOModule",
           "ListwiseDPOModule", "ListwiseRewardModule",
           "OfflineModule", "OnlineDPOModule", "ORPOModule", "PairLogps", "PairwiseModule", "PolicyModule", "PPOPtxModule",
           "ReinforcePPModule", "RejectionSamplingModule", "ReMaxModule", "RewardModule", "RLOOModule", "SFTModule",
           "TrainingModule", "XPOModule"]
