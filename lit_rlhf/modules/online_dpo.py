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

    supports_environment = False  # a pairwise loss over two responses of a prompt, judged as texts: one turn

    def __init__(self, beta: float = 0.1, loss_type: DPOLossType = "sigmoid", temperature: float = 1.0,
                 **kwargs: Any) -> None:
        # DPO's objective is on the policy's own distribution: log-probs at 1 whatever the sampling
        # temperature (pinned: `lit_rlhf.modules.settings`)
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

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        scores, mask = rollout.scores.float().view(-1, 2), rollout.response_mask  # (B, 2), (2B, R)
        first_wins = (scores[:, 0] > scores[:, 1]).long()  # (B,)
        base = torch.arange(0, mask.shape[0], 2, device=mask.device)
        chosen, rejected = base + 1 - first_wins, base + first_wins  # (B,) rows
        annotated = (scores[:, 0] != scores[:, 1]).float()  # (B,) ties are left out
        ref = masked_sum(rollout.ref_logps, mask, dim=1)  # (2B,) at temperature 1

        def loss_fn(pairs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            rows = torch.cat([chosen[pairs], rejected[pairs]])  # (2n,) a pair's rows share their prompt
            per_token = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                mask[rows], self.logprob_temperature, groups=rows // 2,
            )  # (2n, R)
            logps, keep = masked_sum(per_token, mask[rows], dim=1), annotated[pairs].bool().repeat(2)  # (2n,)
            if not keep.any():
                return logps.sum() * 0.0, {}  # no annotated pair here: no gradient, no stats
            n = len(pairs)
            out = dpo_loss(logps[:n][keep[:n]], logps[n:][keep[n:]], ref[rows][:n][keep[:n]], ref[rows][n:][keep[n:]],
                           self.beta, self.loss_type)
            return out.loss, {"loss/dpo": out.loss.detach(), "rewards/chosen": out.chosen_rewards.mean(),
                              "rewards/rejected": out.rejected_rewards.mean(), "rewards/margins": out.margins.mean(),
                              "rewards/accuracies": out.accuracies}

        stats = self.run_updates(base.numel(), 1, 1, loss_fn, row_weights=annotated)  # a mean over annotated pairs
        stats["pairs/tie_fraction"] = 1.0 - annotated.mean()
        return rollout, stats
