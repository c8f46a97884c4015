"""ORPO (Hong et al. 2024): supervised fine-tuning on the chosen completions with a log odds-ratio
penalty on the rejected ones, in one stage and without a reference model (`lit_rlhf.losses.orpo_loss`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import orpo_loss
from lit_rlhf.modules.pairwise import PairwiseModule
from lit_rlhf.types import PreferenceBatch


class ORPOModule(PairwiseModule):
    """ORPO on a `PreferenceBatch` (rows `[:B]` chosen, `[B:]` rejected).

    Both completions go through the policy in one forward pass (`pair_logps`); P(y|x) of ORPO's
    odds (eq. 4) is the exponential of the completion's token-mean log-prob (EOS included, D3),
    and the NLL term (eq. 2) its negative on the chosen one: ORPO starts from a base model.

    Args:
        odds_ratio_coef: lambda of eq. 6, the weight of the odds-ratio term against the NLL
            (0.1 in the paper's experiments).
        **kwargs: `PolicyModule` arguments (model, tokenizer, dtype, optimiser, schedule, LoRA, export).
    """

    def __init__(self, odds_ratio_coef: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if odds_ratio_coef < 0:
            raise ValueError(f"odds_ratio_coef must be >= 0, got {odds_ratio_coef}")
        self.odds_ratio_coef = odds_ratio_coef

    def compute_loss(self, batch: PreferenceBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one batch and the detached statistics to log (names `{group}/{name}`)."""
        logps = self.pair_logps(batch)
        chosen, rejected = logps.chosen_mean, logps.rejected_mean  # (B,), (B,) per-token means
        out = orpo_loss(chosen, rejected, self.odds_ratio_coef)
        stats = {
            "rewards/log_odds_ratio": out.log_odds_ratios.mean(),
            "rewards/accuracies": out.accuracies,
            "logps/chosen": chosen.detach().mean(),
            "logps/rejected": rejected.detach().mean(),
            "loss/nll": out.nll,
            "loss/odds_ratio": out.odds_ratio_loss,
        }
        return out.loss, stats
