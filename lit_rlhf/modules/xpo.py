"""XPO: online DPO on pairs of a policy sample and a reference sample, plus an exploration term."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.losses import xpo_loss
from lit_rlhf.modules.online_dpo import OnlineDPOModule
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import Rollout


class XPOModule(OnlineDPOModule):
    """Exploratory preference optimisation (Xie et al. 2024, "Exploratory Preference Optimization:
    Harnessing Implicit Q*-Approximation for Sample-Efficient RLHF", Algorithm 1) with the loss
    `lit_rlhf.losses.xpo_loss`.

    Each training step takes B prompts and:

    1. samples one response per prompt from the policy and one from the frozen reference, both
       through the rollout source (`sampled_models`: the reference's from `rollout.for_model
       ("reference")`, so from vLLM or the asynchronous producer when the policy's are, seeded and
       resumed alike); a prompt's rows are its policy response, then its reference response;
    2. the annotator scores both as in `OnlineDPOModule` (reward sources or a pairwise judge); the
       better-scored one is chosen, the other rejected; a tie is left out of the loss;
    3. one on-policy step on `xpo_loss(beta, alpha, loss_type)`: DPO on the annotated pairs plus
       alpha times the policy's mean log-prob of the reference's responses, at temperature 1.

    Logs `OnlineDPOModule`'s stats plus `loss/xpo`, `loss/exploration` and `pairs/policy_wins`
    (the share of annotated pairs the policy's response won).

    Args:
        alpha: the exploration coefficient (Xie et al.'s alpha; 1e-5 as TRL's default: the term
            is a sum of log-probs over a response's tokens, unbounded below).
        **kwargs: `OnlineDPOModule` (beta, loss_type, reward sources, reference, sampling, ...).
    """

    sampled_models = ("policy", "reference")

    def __init__(self, alpha: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        scores, mask, attention = rollout.scores.float().view(-1, 2), rollout.loss_mask, rollout.response_attention_mask
        annotated = (scores[:, 0] != scores[:, 1]).float()  # (B,) ties are left out
        ref = masked_sum(rollout.ref_logps, mask, dim=1).view(-1, 2)  # (B, 2) at temperature 1

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            # `rows`: whole pairs (`whole_groups`): a policy row, then its prompt's reference row
            per_token = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], self.logprob_temperature, groups=rows // 2,
            )  # (2n, R)
            logps, pairs = masked_sum(per_token, mask[rows], dim=1).view(-1, 2), rows[0::2] // 2  # (n, 2), (n,)
            keep = annotated[pairs].bool()
            if not keep.any():
                return logps.sum() * 0.0, {}  # no annotated pair here: no gradient, no stats
            wins = (scores[pairs, 1] > scores[pairs, 0]).long()  # (n,) 1: the reference's response won
            order = torch.stack([wins, 1 - wins], dim=1)  # (n, 2): the columns of chosen, rejected
            policy, reference = logps.gather(1, order)[keep], ref[pairs].gather(1, order)[keep]  # (k, 2)
            out = xpo_loss(policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], logps[keep, 1], self.beta,
                           self.alpha, self.loss_type)
            dpo = out.dpo
            return out.loss, {"loss/xpo": out.loss.detach(), "loss/dpo": dpo.loss, "loss/exploration": out.exploration,
                              "rewards/chosen": dpo.chosen_rewards.mean(), "rewards/rejected": dpo.rejected_rewards.mean(),
                              "rewards/margins": dpo.margins.mean(), "rewards/accuracies": dpo.accuracies,
                              "pairs/policy_wins": 1.0 - wins[keep].float().mean()}

        # a mean over annotated pairs: each row weighs half its pair's 0/1 annotation
        stats = self.run_updates(mask.shape[0], 1, 1, loss_fn, row_weights=annotated.repeat_interleave(2) / 2)
        stats["pairs/tie_fraction"] = 1.0 - annotated.mean()
        return rollout, stats
