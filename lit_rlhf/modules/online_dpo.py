"""Online DPO / RLAIF: two samples per prompt, annotated online, the DPO loss against the reference."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.losses import DPOLossType, dpo_loss
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import Rollout


class OnlineDPOModule(OnlineModule):
    """Online AI feedback (OAIF, Guo et al. 2024, "Direct Language Model Alignment from Online AI
    Feedback", Algorithm 1) with DPO's loss (`lit_rlhf.losses.dpo_loss`).

    Each training step takes B prompts and:

    1. samples 2 responses per prompt from the current policy (N = 2B rows) and the reference's
       log-probs of them; the annotator scores both: any reward source (a reward model, reward
       functions) or a pairwise judge of `lit_rlhf.judges` (a local LM, a chat API) through
       `lit_rlhf.rewards.PairwiseJudgeReward` (the winner gets 1, the loser 0, a tie 0.5 each);
    2. the better-scored response of each pair is `chosen`, the other `rejected`; a pair whose
       two scores are equal (a tie, or a judge that failed) is left out of the loss;
    3. one on-policy step on `dpo_loss(beta, loss_type)` over the annotated pairs, the sequence
       log-probs of policy and reference at temperature 1 (`logprob_temperature`): DPO's
       implicit reward is beta * log(pi/pi_ref) of the policy's own distribution, whatever the
       sampling temperature.

    Logs the `OnlineModule` stats plus `loss/dpo`, `rewards/{chosen,rejected,margins,accuracies}`
    (DPO's implicit rewards) and `pairs/tie_fraction`.

    Args:
        beta: DPO's beta, the strength of the KL regularisation (0.1, as Guo et al.).
        loss_type: `sigmoid` (DPO), `ipo` or `hinge` (`losses.dpo_loss`).
        temperature: sampling temperature (1.0: samples from the policy itself).
        **kwargs: `OnlineModule` (reward sources, reference, sampling, ...) and `PolicyModule`.
    """

    whole_groups = True  # a pair loss: every micro-batch holds whole pairs (its two rows)

    def __init__(self, beta: float = 0.1, loss_type: DPOLossType = "sigmoid", temperature: float = 1.0,
                 **kwargs: Any) -> None:
        # DPO's objective is on the policy's own distribution: log-probs at 1 whatever the sampling
        # temperature (pinned: `lit_rlhf.training.settings`)
        super().__init__(temperature=temperature, logprob_temperature=1.0, **kwargs)
        if beta <= 0 or loss_type not in ("sigmoid", "ipo", "hinge"):
            raise ValueError(f"beta must be > 0 and loss_type sigmoid, ipo or hinge; got {beta}, {loss_type!r}")
        self.beta, self.loss_type = beta, loss_type
        self.load_reference(self.ref_model_name, self.model_dtype)

    @property
    def repeats(self) -> int:
        return 2  # a pair per prompt

    @property
    def needs_rollout_logps(self) -> bool:
        return False  # the update's own forward pass gives the policy's log-probs

    def pair_loss(self, policy: Tensor, reference: Tensor, logps: Tensor,
                  first_wins: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of k annotated pairs: `policy` and `reference` (k, 2) sequence log-probs of
        (chosen, rejected); `logps` (k, 2) the policy's of each pair's (first, second) rows;
        `first_wins` (k,) bool. Online DPO: `dpo_loss`."""
        out = dpo_loss(policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], self.beta, self.loss_type)
        return out.loss, {"loss/dpo": out.loss.detach(), "rewards/chosen": out.chosen_rewards.mean(),
                          "rewards/rejected": out.rejected_rewards.mean(), "rewards/margins": out.margins.mean(),
                          "rewards/accuracies": out.accuracies}

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        scores, mask, attention = rollout.scores.float().view(-1, 2), rollout.loss_mask, rollout.response_attention_mask
        annotated = (scores[:, 0] != scores[:, 1]).float()  # (B,) ties are left out
        ref = masked_sum(rollout.ref_logps, mask, dim=1)  # (2B,) at temperature 1

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            # `rows`: whole pairs (`whole_groups`), a pair's two rows side by side and sharing their prompt
            per_token = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], self.logprob_temperature, groups=rows // 2,
            )  # (2n, R)
            logps, pairs = masked_sum(per_token, mask[rows], dim=1).view(-1, 2), rows[0::2] // 2  # (n, 2), (n,)
            first_wins = scores[pairs, 0] > scores[pairs, 1]  # (n,)
            keep = annotated[pairs].bool()
            if not keep.any():
                return logps.sum() * 0.0, {}  # no annotated pair here: no gradient, no stats
            wins = first_wins.long()
            order = torch.stack([1 - wins, wins], dim=1)  # (n, 2): the columns of chosen, rejected
            policy = logps.gather(1, order)[keep]  # (k, 2)
            reference = ref.view(-1, 2)[pairs].gather(1, order)[keep]
            return self.pair_loss(policy, reference, logps[keep], first_wins[keep])

        # a mean over annotated pairs: each row weighs half its pair's 0/1 annotation
        stats = self.run_updates(mask.shape[0], 1, 1, loss_fn, row_weights=annotated.repeat_interleave(2) / 2)
        stats["pairs/tie_fraction"] = 1.0 - annotated.mean()
        return rollout, stats
