"""KTO: unpaired desirable / undesirable completions (`lit_rlhf.losses.kto_loss`). z0 (`objective/kl`)
is the raw estimate (`objective/kl_raw`, `kl_estimate`) from mismatched prompt/completion pairs of
the batch clamped at 0 (Ethayarajh et al. 2024, Sec. 4); a negative raw estimate is expected: the
completions are the dataset's, not samples of pi, so their mean log-ratio is no KL.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from torch import Tensor

from lit_rlhf import checks, distributed
from lit_rlhf.distributed import gather_rows
from lit_rlhf.losses import (
    KTO_WEIGHT_RATIO_RANGE, RewardLabels, kto_kl_estimate, kto_loss, kto_weight_ratio, labels_from_rewards
)
from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.modules.pairwise import OfflineModule
from lit_rlhf.ops.mismatch import mismatch_partners, mismatched_sequences
from lit_rlhf.types import PreferenceBatch, PromptSharing, SingleBatch

log = logging.getLogger(__name__)

LabelsFrom = Literal["labels", "rewards"]


class KTOModule(OfflineModule):
    """KTO (Ethayarajh et al. 2024) on unpaired completions with a desirable / undesirable flag.

    Batches: a `SingleBatch` with `labels` (True = desirable) or scalar `rewards` (`labels_from`:
    desirable above the global batch mean, the DRO paper's KTO baseline; a tie gets no label and
    is counted in `data/num_tied`, and a batch where every row ties skips its step on every rank,
    `data/tied_batches`), or a `PreferenceBatch` (chosen desirable, rejected undesirable).

    The weight ratio lambda_D n_D / (lambda_U n_U) is logged per batch (`data/weight_ratio`) and
    for the run (`data/weight_ratio_cumulative`); a warning names the weights to change once the
    run's ratio leaves the paper's [1, 4/3] (checked from the 8th step on and at epoch ends).

    Args:
        beta: KL strength in the value function sigmoid(beta * (r - z0)); the KTO paper uses 0.1
            (and up to 1 for small models), see configs/ultrafeedback/kto.yaml.
        desirable_weight: lambda_D, weight of the desirable examples' losses.
        undesirable_weight: lambda_U, weight of the undesirable examples' losses. The paper
            suggests lambda_D * n_D / (lambda_U * n_U) in [1, 4/3].
        labels_from: `labels` (the batch's binary labels) or `rewards` (labels from the batch's
            scalar rewards compared with the batch mean).
        ref_model: reference policy name; `None` = a frozen copy of the initial policy.
        **kwargs: `PolicyModule` arguments (model, tokenizer, dtype, optimiser, schedule, export).
    """

    batch_types = (SingleBatch, PreferenceBatch)
    prog_bar_stats = ("objective/kl",)

    def __init__(
        self,
        beta: float = 0.1,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        labels_from: LabelsFrom = "labels",
        ref_model: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if desirable_weight < 0 or undesirable_weight < 0:
            raise ValueError(f"desirable_weight / undesirable_weight must be >= 0, got {desirable_weight}, {undesirable_weight}")
        if labels_from not in ("labels", "rewards"):
            raise ValueError(f"unknown labels_from {labels_from!r}; expected 'labels' or 'rewards'")
        self.beta, self.desirable_weight, self.undesirable_weight = beta, desirable_weight, undesirable_weight
        self.labels_from = labels_from
        self._last_z0 = 0.0  # the last raw KL estimate: fallback for a batch of one prompt (`kl_estimate`)
        self._counts = [0.0, 0.0]  # desirable, undesirable examples trained on so far (all ranks)
        self._ratio_warned = False
        self.tied_batches = 0  # training batches skipped because every row tied with the batch mean
        self.load_reference(ref_model, self.model_dtype)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """Also: SingleBatches must carry what `labels_from` reads (labels or rewards)."""
        problems = super().check_config(trainer, datamodule)
        if datamodule is None or not checks.yields(datamodule, "SingleBatch"):
            return problems
        name, data = type(self).__name__, type(datamodule).__name__
        if self.labels_from == "labels" and getattr(datamodule, "label_mode", "") is None:
            problems.append(f"{name} has labels_from='labels' but {data} has no label_mode, so its batches carry no "
                            "labels: set the DataModule's label_mode ('threshold' or 'pairs'), or labels_from: rewards")
        if self.labels_from == "rewards" and getattr(datamodule, "with_rewards", True) is False:
            problems.append(f"{name} has labels_from='rewards' but {data} has with_rewards=false")
        return problems

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)  # the single-prompt fallback z0 too (exact resume)
        checkpoint[CHECKPOINT_KEY].update(last_z0=self._last_z0, label_counts=list(self._counts),
                                          tied_batches=self.tied_batches)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get(CHECKPOINT_KEY, {})
        self._last_z0 = float(saved.get("last_z0", 0.0))
        self._counts = [float(c) for c in saved.get("label_counts", [0.0, 0.0])]
        self.tied_batches = int(saved.get("tied_batches", 0))

    def row_labels(self, batch: SingleBatch | PreferenceBatch) -> tuple[RewardLabels, bool]:
        """The N rows' labels (desirable, tied: (N,) bool) and whether every row of the GLOBAL
        batch (all ranks) is tied, which is the same answer on every rank. Only rewards compared
        with their batch mean can tie; binary labels and pairs never do."""
        if isinstance(batch, PreferenceBatch):  # chosen rows first
            desirable = torch.arange(2 * batch.num_pairs, device=batch.input_ids.device) < batch.num_pairs
            return RewardLabels(desirable, torch.zeros_like(desirable)), False
        if not isinstance(batch, SingleBatch):
            raise TypeError(f"KTOModule needs a SingleBatch or a PreferenceBatch, got {type(batch).__name__}")
        if self.labels_from == "labels":
            if batch.labels is None:
                raise ValueError("labels_from='labels' but the batch has no `labels`; use labels_from='rewards' for scalar rewards")
            return RewardLabels(batch.labels.bool(), torch.zeros_like(batch.labels.bool())), False
        if batch.rewards is None:
            raise ValueError("labels_from='rewards' but the batch has no `rewards`")
        everyone, own = gather_rows(batch.rewards)  # the mean of the GLOBAL batch, every rank's rewards
        labels = labels_from_rewards(everyone)
        device = batch.rewards.device
        return RewardLabels(labels.desirable[own].to(device), labels.tied[own].to(device)), bool(labels.tied.all())

    @staticmethod
    def prompt_sharing(batch: SingleBatch | PreferenceBatch) -> PromptSharing | None:
        """The rows of a `SingleBatch` that share a prompt (its collator's `prompt_groups`), for
        the shared-prompt forward; None (every row apart) for a `PreferenceBatch`."""
        return batch.sharing if isinstance(batch, SingleBatch) else None

    @torch.no_grad()
    def kl_estimate(self, batch: SingleBatch | PreferenceBatch) -> Tensor:
        """The raw KL estimate, a () tensor without grad: mean log pi/pi_ref of the batch's
        mismatched sequences over all ranks (z0 is its clamp at 0). A batch whose rows all share
        one prompt (on any rank) has none: every rank reuses the previous estimate (0 at first)."""
        rows = batch.input_ids.shape[0]
        partners = mismatch_partners(batch.input_ids, batch.prompt_lengths) if rows >= 2 else None
        distributed_run = self.attached_trainer is not None and self.trainer.world_size > 1
        lacking = float(partners is None)
        if distributed_run:  # every rank takes the same branch (the gather below is collective)
            lacking = float(distributed.all_reduce_sum(batch.input_ids.new_tensor(lacking, dtype=torch.float32)))
        if lacking:
            log.warning("KTO batch whose %d row(s) share one prompt%s: no mismatched pair, reusing the previous "
                        "KL estimate %.4g", rows, " (on some rank)" if partners is not None else "", self._last_z0)
            return batch.input_ids.new_tensor(self._last_z0, dtype=torch.float32)
        ids, keep, scored = mismatched_sequences(
            batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths, self.tokenizer.pad_token_id,
            partners,
        )  # (N, T')
        # row i keeps its prompt (only the completion moved): its prompt sharing holds
        policy, ref = self.policy_and_ref_logps(ids, keep, scored, self.prompt_sharing(batch))  # (N,), (N,)
        if distributed_run:
            policy, ref = self.all_gather(policy).flatten(), self.all_gather(ref).flatten()  # (W*N,)
        raw = kto_kl_estimate(policy, ref, clamp=False)
        if self.training:
            self._last_z0 = float(raw)
        return raw

    def compute_loss(self, batch: SingleBatch | PreferenceBatch,
                     labels: RewardLabels | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one batch and the detached statistics to log (names `{group}/{name}`).
        `labels`: the batch's `row_labels` when the caller already has them."""
        labels = self.row_labels(batch)[0] if labels is None else labels  # (N,) each
        kl_raw = self.kl_estimate(batch)  # (), unclamped; kto_loss clamps it at 0 (z0)
        policy, ref = self.policy_and_ref_logps(batch.input_ids, batch.attention_mask, batch.loss_mask,
                                                self.prompt_sharing(batch))  # (N,), (N,)
        out = kto_loss(policy, ref, labels.desirable, kl_raw, self.beta, self.desirable_weight, self.undesirable_weight,
                       labelled=labels.labelled)
        desirable = labels.desirable
        stats = {
            "rewards/desirable": out.desirable_rewards,
            "rewards/undesirable": out.undesirable_rewards,
            "rewards/margins": out.desirable_rewards - out.undesirable_rewards,
            "objective/kl": out.kl,  # z0, the reference point used
            "objective/kl_raw": kl_raw,
            "logps/policy": policy.detach().mean(),
            "data/desirable_fraction": desirable.float().mean(),
            "data/num_desirable": out.num_desirable.float(),
            "data/num_undesirable": out.num_undesirable.float(),
            "data/num_tied": out.num_unlabelled.float(),
        }
        return out.loss, stats

    def weight_ratio_stats(self, num_desirable: Tensor, num_undesirable: Tensor) -> dict[str, float]:
        """lambda_D n_D / (lambda_U n_U) of this global batch and of the run so far."""
        counts = torch.stack([num_desirable, num_undesirable]).double()
        n_d, n_u = distributed.all_reduce_sum(counts).tolist()
        self._counts = [self._counts[0] + n_d, self._counts[1] + n_u]
        return {
            "data/weight_ratio": kto_weight_ratio(n_d, n_u, self.desirable_weight, self.undesirable_weight),
            "data/weight_ratio_cumulative": self.cumulative_weight_ratio(),
        }

    def cumulative_weight_ratio(self) -> float:
        return kto_weight_ratio(*self._counts, self.desirable_weight, self.undesirable_weight)

    def check_weight_ratio(self) -> None:
        """Warn once when the run's lambda_D n_D / (lambda_U n_U) is outside the paper's [1, 4/3]."""
        low, high = KTO_WEIGHT_RATIO_RANGE
        ratio = self.cumulative_weight_ratio()
        if self._ratio_warned or not sum(self._counts) or low <= ratio <= high:
            return
        self._ratio_warned = True
        n_d, n_u = self._counts
        target = 1.0 if ratio < low else high  # the nearest end of the range
        suggestion = target * self.undesirable_weight * n_u / max(n_d, 1.0)
        log.warning(
            "KTO: lambda_D n_D / (lambda_U n_U) = %.3g x %d / (%.3g x %d) = %.3g is outside [1, 4/3], the range the KTO "
            "paper recommends (Ethayarajh et al. 2024, Sec. 4.2); e.g. desirable_weight: %.3g (with undesirable_weight "
            "%.3g) gives %.3g", self.desirable_weight, n_d, self.undesirable_weight, n_u, ratio, suggestion,
            self.undesirable_weight, target,
        )

    def on_train_epoch_end(self) -> None:
        self.check_weight_ratio()

    def training_step(self, batch: SingleBatch | PreferenceBatch, batch_idx: int) -> Tensor | None:
        labels, all_tied = self.row_labels(batch)
        if all_tied:  # the same on every rank: all of them skip (no collective is left half done)
            self.tied_batches += 1
            log.warning("KTO: every reward of the batch at global step %d equals the batch mean: no row has a label, "
                        "the step is skipped (%d such batches so far)", self.global_step, self.tied_batches)
            self.log_stats("train", {"data/num_tied": float(labels.tied.sum()), "data/tied_batches": float(self.tied_batches)})
            return None  # Lightning skips backward and the optimizer step
        loss, stats = self.compute_loss(batch, labels)
        stats["data/tied_batches"] = float(self.tied_batches)
        stats.update(self.weight_ratio_stats(stats["data/num_desirable"], stats["data/num_undesirable"]))
        if self.global_step >= 7:
            self.check_weight_ratio()
        if not self.check_finite(batch, loss=loss):
            return None  # on_nonfinite=skip: Lightning skips backward and the step
        self.log_stats("train", {"loss": loss.detach(), **stats}, prog_bar=("loss", *self.prog_bar_stats))
        return loss
