"""Supervised fine-tuning: next-token loss on the completion tokens only."""

from __future__ import annotations

from typing import Any

from lit_rlhf.modules.base import PolicyModule
from lit_rlhf.ops import masked_mean
from lit_rlhf.types import SFTBatch


class SFTModule(PolicyModule):
    """Next-token negative log-likelihood on completion tokens, prompt and padding masked.

    Completions end with EOS (D3) and the EOS token is in the loss mask, so the model learns to stop.
    The loss is the mean over all completion tokens of the batch (token-level mean).

    Args: see `PolicyModule` (model, tokenizer, optimiser and schedule, export).
    """

    batch_types = (SFTBatch,)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    def _nll(self, batch: SFTBatch):
        logps = self.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask)  # (B, T)
        return -masked_mean(logps, batch.loss_mask)

    def training_step(self, batch: SFTBatch, batch_idx: int):
        loss = self._nll(batch)
        if not self.check_finite(batch, loss=loss):
            return None  # Lightning skips backward and the optimizer step
        self.log_stats("train", {"loss": loss}, prog_bar=("loss",))
        return loss

    def validation_step(self, batch: SFTBatch, batch_idx: int) -> None:
        self.log("val/loss", self._nll(batch), prog_bar=True, on_epoch=True, sync_dist=True)

    def test_step(self, batch: SFTBatch, batch_idx: int) -> None:
        self.log("test/loss", self._nll(batch), on_epoch=True, sync_dist=True)
