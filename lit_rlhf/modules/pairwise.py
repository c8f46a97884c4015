"""`OfflineModule`: the steps of a method trained on a fixed dataset with one loss per batch (SFT,
KTO, DRO-V); `PairwiseModule`: its base for losses that compare the two completions of a
preference pair (DPO and its family, ORPO, SimPO in `examples/simpo.py`)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from lit_rlhf.modules.policy import PolicyModule
from lit_rlhf.types import PreferenceBatch, PromptSharing, split_pair


class PairLogps(NamedTuple):
    """The policy's log-probs of a `PreferenceBatch`, chosen rows first."""

    per_token: Tensor  # (2B, T) per-token log-probs on the completion tokens, 0 elsewhere
    chosen: Tensor  # (B,) summed over the chosen completion's tokens
    rejected: Tensor  # (B,) summed over the rejected completion's tokens
    chosen_lengths: Tensor  # (B,) completion tokens of the chosen rows (EOS included), >= 1
    rejected_lengths: Tensor  # (B,)

    @property
    def chosen_mean(self) -> Tensor:
        """(B,) length-normalised log-probs (1/|y_c|) log pi(y_c|x) of the chosen completions."""
        return self.chosen / self.chosen_lengths

    @property
    def rejected_mean(self) -> Tensor:
        """(B,) length-normalised log-probs of the rejected completions."""
        return self.rejected / self.rejected_lengths


class OfflineModule(PolicyModule):
    """Base of offline methods: a subclass implements `compute_loss(batch) -> (loss, stats)`; the
    training, validation and test steps guard against a non-finite loss (training) and log
    `{stage}/loss` and the stats as `{stage}/{group}/{name}`. Arguments: `PolicyModule`'s."""

    prog_bar_stats: tuple[str, ...] = ()  # shown in the progress bar (training, validation) when present

    def compute_loss(self, batch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one batch and the detached statistics to log (names `{group}/{name}`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss(batch) -> (loss, stats)")

    def policy_and_ref_logps(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                             sharing: PromptSharing | None = None) -> tuple[Tensor, Tensor]:
        """Sequence log-probs (B,) of the policy and of `ref_model`; the reference runs first, so its
        temporaries are freed before the policy's graph exists."""
        ref = self.sequence_logps(self.frozen_logps("ref_model", input_ids, attention_mask, loss_mask, sharing=sharing),
                                  loss_mask)
        policy = self.sequence_logps(self.policy_logps(input_ids, attention_mask, loss_mask, sharing=sharing), loss_mask)
        return policy, ref

    def _step(self, batch, stage: str) -> Tensor | None:
        loss, stats = self.compute_loss(batch)
        if stage == "train" and not self.check_finite(batch, loss=loss):
            return None  # on_nonfinite=skip: Lightning skips backward and the step
        shown = () if stage == "test" else ("loss", *self.prog_bar_stats)
        self.log_stats(stage, {"loss": loss.detach(), **stats}, prog_bar=shown)
        return loss

    def training_step(self, batch, batch_idx: int) -> Tensor | None:
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test")


class PairwiseModule(OfflineModule):
    """Base of pairwise-preference methods on a `PreferenceBatch` (chosen rows `[:B]`, rejected
    `[B:]`; the start-up checks refuse other data). `pair_logps` runs both completions through the
    policy in ONE forward pass, each pair's prompt once under `shared_prompt`; a subclass
    implements `compute_loss` with it and a pure loss of `lit_rlhf.losses`, and loads a reference
    itself if it needs one (`DPOModule`). Arguments: `PolicyModule`'s.
    """

    batch_types = (PreferenceBatch,)
    prog_bar_stats = ("rewards/accuracies",)

    def pair_logps(self, batch: PreferenceBatch) -> PairLogps:
        """The policy's log-probs of both completions of every pair, in one forward pass over the
        (2B, T) rows, each pair's prompt computed once under `shared_prompt`."""
        if not isinstance(batch, PreferenceBatch):
            raise TypeError(f"{type(self).__name__} needs a PreferenceBatch (chosen rows first), got {type(batch).__name__}")
        per_token = self.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask,
                                      sharing=batch.sharing)  # (2B, T)
        chosen, rejected = split_pair(self.sequence_logps(per_token, batch.loss_mask))  # (B,), (B,)
        lengths = batch.loss_mask.sum(dim=1).clamp(min=1).to(per_token.dtype)  # (2B,)
        chosen_lengths, rejected_lengths = split_pair(lengths)
        return PairLogps(per_token, chosen, rejected, chosen_lengths, rejected_lengths)
