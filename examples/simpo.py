"""A new offline method in a few dozen lines: SimPO (Meng et al. 2024, "SimPO: Simple Preference
Optimization with a Reference-Free Reward", Eq. 6).

    L = -log sigmoid( beta/|y_w| * log pi(y_w|x) - beta/|y_l| * log pi(y_l|x) - gamma )

The implicit reward is the policy's length-normalised log-likelihood, so there is no reference
model at all. Everything else (loading the policy with PAD != EOS and dropout off, AdamW with
warmup and decay, the non-finite guard, exact resume, start-up checks, export) is inherited from
`PolicyModule`. Run it like any built-in method:

    python main.py fit --config examples/simpo.yaml
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch.nn.functional as F
from torch import Tensor

from lit_rlhf.modules import PolicyModule
from lit_rlhf.types import PreferenceBatch, split_pair


class SimPOLoss(NamedTuple):
    loss: Tensor  # () mean over pairs
    margins: Tensor  # () detached mean of r_w - r_l
    accuracy: Tensor  # () detached fraction of pairs with r_w > r_l


def simpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, chosen_lengths: Tensor, rejected_lengths: Tensor,
               beta: float, gamma: float) -> SimPOLoss:
    """SimPO, Eq. 6. Sequence log-probs and completion lengths in tokens, all (B,)."""
    chosen = beta * chosen_logps / chosen_lengths  # (B,) length-normalised implicit rewards
    rejected = beta * rejected_logps / rejected_lengths  # (B,)
    loss = -F.logsigmoid(chosen - rejected - gamma).mean()
    diff = (chosen - rejected).detach()
    return SimPOLoss(loss, diff.mean(), (diff > 0).float().mean())


class SimPOModule(PolicyModule):
    """SimPO on a `PreferenceBatch` (rows [:B] chosen, [B:] rejected), one forward pass.

    Args:
        beta: reward scale (SimPO uses 2.0-2.5).
        gamma: target reward margin (SimPO uses ~0.5-1.6; gamma/beta ~0.5).
        **kwargs: `PolicyModule` arguments (model, tokenizer, optimiser, schedule, export).
    """

    batch_types = (PreferenceBatch,)  # the start-up checks refuse any other DataModule

    def __init__(self, beta: float = 2.0, gamma: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.beta, self.gamma = beta, gamma

    def compute_loss(self, batch: PreferenceBatch) -> SimPOLoss:
        per_token = self.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask)  # (2B, T)
        logps = self.sequence_logps(per_token, batch.loss_mask)  # (2B,)
        lengths = batch.loss_mask.sum(dim=1).clamp(min=1)  # (2B,) completion tokens, EOS included
        (chosen, rejected), (chosen_len, rejected_len) = split_pair(logps), split_pair(lengths)
        return simpo_loss(chosen, rejected, chosen_len, rejected_len, self.beta, self.gamma)

    def training_step(self, batch: PreferenceBatch, batch_idx: int) -> Tensor | None:
        out = self.compute_loss(batch)
        if not self.check_finite(batch, loss=out.loss):
            return None  # on_nonfinite: skip
        stats = {"loss": out.loss.detach(), "rewards/margins": out.margins, "rewards/accuracies": out.accuracy}
        self.log_stats("train", stats, prog_bar=("loss",))
        return out.loss

    def validation_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        out = self.compute_loss(batch)
        self.log("val/loss", out.loss, on_epoch=True, sync_dist=True)
        self.log_stats("val", {"rewards/margins": out.margins, "rewards/accuracies": out.accuracy})


if __name__ == "__main__":
    from lit_rlhf.cli import main

    main()
