"""D23 EOS trick as a rollout-shaping callback: responses that never emitted EOS are penalised."""

from __future__ import annotations

from typing import Literal

import torch
from lightning import Callback

from lit_rlhf.types import Rollout


class EOSTrickCallback(Callback):
    """Replace (or lower) the score of every response without an EOS token (N+ D23).

    Generation samples exactly `max_new_tokens` tokens; a response that did not end within
    them is usually a rambling one, and the reward model has no EOS to read its score at. The
    N+ paper gives such responses a constant score of -1 instead of the reward model's.

    Acts through the rollout hook (`on_rollout_scores`, see `callbacks/__init__.py`), before
    the method computes advantages. Logs `train/eos_trick/penalized` (how many responses of
    the rollout were penalised) and `train/eos_trick/penalized_fraction`.

    Args:
        mode: `replace` sets the score of a response without EOS to `score`; `subtract`
            subtracts `penalty` from it instead.
        score: the constant score of `replace` (-1.0, D23).
        penalty: the amount `subtract` takes off (1.0).
    """

    def __init__(self, mode: Literal["replace", "subtract"] = "replace", score: float = -1.0, penalty: float = 1.0) -> None:
        if mode not in ("replace", "subtract"):
            raise ValueError(f"EOSTrickCallback mode must be 'replace' or 'subtract', got {mode!r}")
        self.mode = mode
        self.score = float(score)
        self.penalty = float(penalty)

    def on_rollout_scores(self, trainer, pl_module, rollout: Rollout) -> Rollout:
        if rollout.scores is None:
            raise ValueError("EOSTrickCallback needs a scored rollout (rollout.scores is None)")
        no_eos = ~rollout.has_eos  # (N,)
        scores = rollout.scores
        if self.mode == "replace":
            shaped = torch.where(no_eos, torch.full_like(scores, self.score), scores)
        else:
            shaped = scores - self.penalty * no_eos.to(scores.dtype)
        count = no_eos.sum().float()
        if getattr(trainer, "training", False):  # a training rollout (not validation): logged per step
            pl_module.log("train/eos_trick/penalized", count, on_step=True, on_epoch=False)
            pl_module.log("train/eos_trick/penalized_fraction", count / no_eos.numel(), on_step=True, on_epoch=False)
        return rollout.with_scores(shaped)
