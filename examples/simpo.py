"""A new offline method in a few dozen lines: SimPO (Meng et al. 2024, "SimPO: Simple Preference
Optimization with a Reference-Free Reward", Eq. 6).

    L = -log sigmoid( beta/|y_w| * log pi(y_w|x) - beta/|y_l| * log pi(y_l|x) - gamma )

The implicit reward is the policy's length-normalised log-likelihood, so there is no reference
model at all. Everything else is inherited from `PairwiseModule`: one forward pass over each
pair's two completions with its prompt computed once (`pair_logps`), the steps and their
logging; and from `PolicyModule` below it: loading the policy with PAD != EOS and dropout off,
AdamW with warmup and decay, the non-finite guard, exact resume, start-up checks, LoRA, export.
Run it like any built-in method:

    python main.py fit --config examples/simpo.yaml
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch.nn.functional as F
from torch import Tensor

from lit_rlhf.modules import PairwiseModule
from lit_rlhf.types import PreferenceBatch


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


class SimPOModule(PairwiseModule):  # batch_types = (PreferenceBatch,): start-up checks refuse other data
    """SimPO on a `PreferenceBatch` (rows [:B] chosen, [B:] rejected), one forward pass.

    Args:
        beta: reward scale (SimPO uses 2.0-2.5).
        gamma: target reward margin (SimPO uses ~0.5-1.6; gamma/beta ~0.5).
        **kwargs: `PolicyModule` arguments (model, tokenizer, optimiser, schedule, export).
    """

    def __init__(self, beta: float = 2.0, gamma: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # model, tokenizer, optimiser, schedule, LoRA, export ...
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.beta, self.gamma = beta, gamma

    def compute_loss(self, batch: PreferenceBatch) -> tuple[Tensor, dict[str, Tensor]]:  # loss, stats to log
        logps = self.pair_logps(batch)  # one forward pass; sums (B,) and completion lengths (B,), EOS included
        out = simpo_loss(logps.chosen, logps.rejected, logps.chosen_lengths, logps.rejected_lengths, self.beta,
                         self.gamma)  # the pure loss, Eq. 6
        return out.loss, {"rewards/margins": out.margins, "rewards/accuracies": out.accuracy}


if __name__ == "__main__":
    from lit_rlhf.cli import main

    main()
