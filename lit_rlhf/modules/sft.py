"""Supervised fine-tuning: next-token loss on the completion tokens only."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy
from torch import Tensor

from lit_rlhf import distributed
from lit_rlhf.types import unpack
from lit_rlhf.models.attention import use_varlen_attention
from lit_rlhf.models.packed import packed_token_logps, packing_supported
from lit_rlhf.modules.pairwise import OfflineModule
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import PackedSFTBatch, SFTBatch


class SFTModule(OfflineModule):
    """Next-token negative log-likelihood on completion tokens, prompt and padding masked.

    EOS is in the loss mask (D3), so the model learns to stop. The loss is the token mean over the
    optimizer step's batches, all ranks: each batch backpropagates its token SUM, and the gradients
    are divided by the step's tokens (`gradient_factor`); under DeepSpeed each batch's own token
    mean. Padded (`SFTBatch`) and packed (`PackedSFTBatch`) batches give the same loss; packed rows
    switch an `sdpa` policy to `sdpa_varlen`, or are unpacked (warned) for a model that cannot
    keep packed examples apart. The logged `train/loss` is each batch's token mean.

    Args: see `PolicyModule` (model, tokenizer, optimiser and schedule, export).
    """

    batch_types = (SFTBatch, PackedSFTBatch)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._step_tokens = 0.0  # completion tokens of the batches accumulated since the last step

    def batch_logps(self, batch: SFTBatch | PackedSFTBatch) -> tuple[Tensor, Tensor]:
        """(per-token log-probs of the policy, the loss mask they go with) of a padded or packed batch."""
        if isinstance(batch, PackedSFTBatch):
            use_varlen_attention(self.policy)  # sdpa -> sdpa_varlen: each packed example's attention alone
            if packing_supported(self.policy):
                logps = packed_token_logps(self.policy, batch.input_ids, batch.position_ids, batch.loss_mask,
                                           chunk_size=self.logprob_chunk_size)
                return logps, batch.loss_mask
            batch = unpack(batch, self.tokenizer.pad_token_id)
        return self.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask), batch.loss_mask

    def nll_terms(self, batch: SFTBatch | PackedSFTBatch) -> tuple[Tensor, Tensor]:
        """(summed NLL of the completion tokens, their number) of one batch."""
        logps, loss_mask = self.batch_logps(batch)
        return -masked_sum(logps, loss_mask), loss_mask.sum()

    def compute_loss(self, batch: SFTBatch | PackedSFTBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The token mean of the NLL of one batch (validation and test)."""
        nll_sum, tokens = self.nll_terms(batch)
        return nll_sum / tokens.clamp(min=1), {}

    def _sums_tokens(self) -> bool:
        """Whether the gradient is normalised by the step's tokens (not under DeepSpeed)."""
        return self.attached_trainer is not None and not isinstance(self.trainer.strategy, DeepSpeedStrategy)

    def training_step(self, batch: SFTBatch, batch_idx: int):
        nll_sum, tokens = self.nll_terms(batch)
        loss = nll_sum / tokens.clamp(min=1)
        if not self.check_finite(batch, loss=loss):
            return None  # Lightning skips backward and the optimizer step
        self.log_stats("train", {"loss": loss.detach()}, prog_bar=("loss",))
        if not self._sums_tokens():
            return loss
        self._step_tokens += float(tokens)
        return nll_sum

    def gradient_factor(self) -> float | None:
        """What turns the accumulated token sums into the token mean of the step's batches, all ranks."""
        if not self._sums_tokens() or not self._step_tokens:
            return None
        total = distributed.all_reduce_sum(torch.tensor(self._step_tokens, dtype=torch.float64, device=self.device))
        # Lightning divided each batch's loss by accumulate_grad_batches, DDP averaged the ranks
        return self.trainer.accumulate_grad_batches * distributed.world_size() / float(total)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Scale the step's gradients by `gradient_factor` (none left with `optimizer_in_backward`)."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        factor = self.gradient_factor() if grads else None
        if factor is not None:
            torch._foreach_mul_(grads, factor)
        self._step_tokens = 0.0

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().optimizer_step(*args, **kwargs)
        finally:
            self._step_tokens = 0.0  # a skipped step (non-finite gradient) starts a fresh count
