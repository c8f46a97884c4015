"""`PairwiseModule`: the base of methods whose loss compares the two completions of a preference
pair under the policy (DPO and its family, ORPO, SimPO in `examples/simpo.py`).

What such a method shares, and what this base does once:

- the batch is a `PreferenceBatch` (chosen rows `[:B]`, rejected rows `[B:]`), and the start-up
  checks refuse any other DataModule (`batch_types`);
- both completions go through the policy in ONE forward pass (`pair_logps`), with the pair's
  `sharing` passed on, so with `shared_prompt` (default) each pair's prompt is computed once
  (`lit_rlhf.models.shared_prompt`): same values and gradients as the padded rows;
- the training, validation and test steps: the non-finite guard, then `{stage}/loss` and the
  statistics `compute_loss` returns, logged as `{stage}/{group}/{name}`.

A subclass implements `compute_loss(batch) -> (loss, stats)`, calling `pair_logps` and a pure
loss from `lit_rlhf.losses`. It loads no reference model; one that needs a reference loads it
itself (`DPOModule`: `load_reference`).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from lit_rlhf.modules.policy import PolicyModule
from lit_rlhf.types import PreferenceBatch, split_pair


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


class PairwiseModule(PolicyModule):
    """Base of pairwise-preference methods: one forward pass over a `PreferenceBatch`, the steps
    and their logging. Subclasses implement `compute_loss`.

    Its arguments are `PolicyModule`'s (model, tokenizer, dtype, optimiser, schedule, LoRA,
    `shared_prompt`, export).
    """

    batch_types = (PreferenceBatch,)  # the start-up checks refuse any other DataModule
    prog_bar_stats: tuple[str, ...] = ("rewards/accuracies",)  # shown in the progress bar when present

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

    def compute_loss(self, batch: PreferenceBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one batch and the detached statistics to log (names `{group}/{name}`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss(batch) -> (loss, stats)")

    def training_step(self, batch: PreferenceBatch, batch_idx: int) -> Tensor | None:
        loss, stats = self.compute_loss(batch)
        if not self.check_finite(batch, loss=loss):
            return None  # on_nonfinite=skip: Lightning skips backward and the step
        self.log_stats("train", {"loss": loss.detach(), **stats}, prog_bar=("loss", *self.prog_bar_stats))
        return loss

    def validation_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        loss, stats = self.compute_loss(batch)
        self.log("val/loss", loss, prog_bar=True, on_epoch=True, sync_dist=True)
        self.log_stats("val", stats, prog_bar=self.prog_bar_stats)

    def test_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        loss, stats = self.compute_loss(batch)
        self.log("test/loss", loss, on_epoch=True, sync_dist=True)
        self.log_stats("test", stats)
