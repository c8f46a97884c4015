"""Methods on ranked lists (`ListBatch`): listwise DPO and a reward model trained on rankings, both
with the Plackett-Luce likelihood (`lit_rlhf.losses.listwise`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import ListwiseLossOutput, listwise_dpo_loss, plackett_luce_loss
from lit_rlhf.modules.dpo import DPOModule
from lit_rlhf.modules.reward import RewardModule
from lit_rlhf.types import ListBatch


def _require_lists(module: Any, batch: Any) -> ListBatch:
    if not isinstance(batch, ListBatch):
        raise TypeError(f"{type(module).__name__} needs a ListBatch (ranked lists), got {type(batch).__name__}")
    return batch


def _ranking_stats(out: ListwiseLossOutput, ranking: Tensor) -> dict[str, Tensor]:
    """The mean utility of the top- and bottom-ranked completions, their gap, and the accuracies."""
    ordered = out.utilities.gather(-1, ranking)  # (B, K) best first
    best, worst = ordered[:, 0].mean(), ordered[:, -1].mean()
    return {"rewards/best": best, "rewards/worst": worst, "rewards/margins": best - worst,
            "rewards/accuracies": out.accuracy, "rewards/top1": out.top1}


class ListwiseDPOModule(DPOModule):
    """Listwise DPO (Rafailov et al. 2023, App. A.3) on a `ListBatch` of B lists of K completions.

    The B*K rows go through the reference and the policy in one forward pass each; the implicit
    rewards `beta * (log pi - log pi_ref)` of a list are ranked by Plackett-Luce
    (`listwise_dpo_loss`; DPO for K = 2). Arguments: `DPOModule`'s but `loss_type` and `nll_coef`.
    """

    batch_types = (ListBatch,)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(loss_type="sigmoid", nll_coef=0.0, **kwargs)

    def compute_loss(self, batch: ListBatch) -> tuple[Tensor, dict[str, Tensor]]:
        shape = _require_lists(self, batch).scores.shape  # (B, K)
        ref = self.reference_logps(batch).view(shape)  # first: its temporaries go before the policy's graph
        per_token = self.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask,
                                      sharing=batch.sharing)  # (B*K, T)
        policy = self.sequence_logps(per_token, batch.loss_mask).view(shape)  # (B, K)
        out = listwise_dpo_loss(policy, ref, batch.ranking, self.beta)
        stats = _ranking_stats(out, batch.ranking)
        stats.update({"logps/mean": policy.detach().mean(), "loss/preference": out.loss.detach()})
        return out.loss, stats


class ListwiseRewardModule(RewardModule):
    """A reward model trained on rankings of K completions: the Plackett-Luce negative
    log-likelihood of each list's order under its rewards (`plackett_luce_loss`; Bradley-Terry for
    K = 2), logging `{stage}/loss` and `{stage}/rewards/{accuracies,top1,best,worst,margins}`.
    Arguments: `RewardModule`'s but the pairwise ones (`use_margin`, `center_coef`,
    `group_columns`, `calibration_bins`).
    """

    batch_types = (ListBatch,)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(use_margin=False, center_coef=0.0, group_columns=(), calibration_bins=1, **kwargs)

    def list_rewards(self, batch: ListBatch) -> Tensor:
        """(B, K) float32 rewards of every list's completions, from one forward over the B*K rows."""
        return self.row_rewards(_require_lists(self, batch)).view(batch.scores.shape)

    def _step(self, batch: ListBatch, stage: str) -> Tensor | None:
        out = plackett_luce_loss(self.list_rewards(batch), batch.ranking)
        if stage == "train" and not self.check_finite(batch, loss=out.loss):
            return None  # on_nonfinite=skip: Lightning skips backward and the step
        stats = {"loss": out.loss.detach(), **_ranking_stats(out, batch.ranking)}
        self.log_stats(stage, stats, prog_bar=("loss", "rewards/accuracies"), batch_size=batch.num_lists)
        return out.loss

    def training_step(self, batch: ListBatch, batch_idx: int) -> Tensor | None:
        return self._step(batch, "train")

    def validation_step(self, batch: ListBatch, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: ListBatch, batch_idx: int) -> None:
        self._step(batch, "test")
