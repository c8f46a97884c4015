"""Methods written as a researcher writes one: GRPO subclasses that pin a setting of their base
in the `super().__init__` call or replace one named step of its update (imported by the CLI from
`tests.modules.pinned`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import rloo_advantages
from lit_rlhf.modules import GRPOModule
from lit_rlhf.types import Rollout


class PinnedGRPO(GRPOModule):
    """GRPO on pairs: always two completions per prompt."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(num_generations=2, **kwargs)


class LeaveOneOutGRPO(GRPOModule):
    """GRPO's clipped per-token loss (k3 KL in the loss) fed RLOO's leave-one-out advantages
    (Ahmadian et al. 2024) instead of group-normalised ones: a hybrid of the two, not RLOO as its
    sources define it (`RLOOModule`)."""

    def advantages(self, rollout: Rollout) -> Tensor:
        return rloo_advantages(rollout.scores.float(), self.num_generations)  # (N,)


class NarrowedGRPO(GRPOModule):
    """A variant written the natural way: its constructor lists only its own arguments and pins
    everything else in the `super().__init__` call, `model` and `tokenizer` included."""

    def __init__(self, letters: str = "abcdefghijklmnopqrstuvwxyz", lr: float = 1e-3) -> None:
        from lit_rlhf.rewards import CharacterFractionReward

        super().__init__(model="tiny-random-llama", reward_fns=[CharacterFractionReward(letters)], num_generations=2,
                         max_new_tokens=4, kl_coef=0.0, lr=lr, lr_scheduler="constant",
                         log_completions_every_n_steps=0)
