"""How long an online run is (`lit_rlhf.modules.online`): episodes, the budget, the schedule length.

A run is measured in **episodes**: one episode is one sampled response (B prompts x G
generations x world size per rollout). With `total_episodes` set, the module stops the trainer
once that many episodes were sampled (a run resumed from a checkpoint that already holds them
trains nothing) and sizes the learning-rate schedule to
`ceil(total_episodes / episodes per rollout) * updates_per_rollout()` optimizer steps; leave
`trainer.max_steps` at -1 and `trainer.max_epochs` at -1 then (the prompt loader is simply
reshuffled each epoch, D21). Without it, `trainer.max_steps` counts optimizer steps
(`updates_per_rollout()` of them per rollout). With `lr_schedule_per: rollout` the schedule
steps once per rollout instead.

`EpisodeBudgetMixin` holds the methods; `OnlineModule` mixes it in and defines what they read:
the settings `total_episodes` and `lr_schedule_per`, a method's `repeats` and
`updates_per_rollout()`, and the counters `episodes` and `rollouts` (advanced by its training
step, saved in checkpoints here).
"""

from __future__ import annotations

import math
from typing import Any

from lit_rlhf.modules.base import CHECKPOINT_KEY


class EpisodeBudgetMixin:
    """The episode budget, the schedule length and the checkpointed counters of an `OnlineModule`."""

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.budget_reached():  # resumed from a checkpoint of the run's last step: nothing left to sample
            self.trainer.should_stop = True

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)  # bookkeeping (tokens/s is logged in training_step)
        if self.budget_reached():
            self.trainer.should_stop = True

    def budget_reached(self) -> str:
        """Why the episode budget stops the run ("" while it does not)."""
        total = self.total_episodes
        if total and self.episodes >= total:
            return f"total_episodes={total} reached ({self.episodes} episodes sampled)"
        return ""

    def prompts_per_rollout(self) -> int:
        """Prompts per rollout on one rank: the prompt DataModule's (or loader's) batch size."""
        trainer = self.trainer
        dm = getattr(trainer, "datamodule", None)
        size = getattr(dm, "batch_size", None) or (getattr(dm, "hparams", None) or {}).get("batch_size")
        if not size:
            trainer.fit_loop.setup_data()  # builds the train dataloader (a no-op once built)
            size = getattr(trainer.train_dataloader, "batch_size", None)
        if not size:
            raise ValueError("cannot tell the prompt batch size: give the DataModule a `batch_size`")
        return int(size)

    def episodes_per_rollout(self) -> int:
        return self.prompts_per_rollout() * self.repeats * max(1, self.trainer.world_size)

    def num_schedule_steps(self) -> int:
        """Scheduler steps of the fit: optimizer steps, or rollouts with `lr_schedule_per: rollout`."""
        steps = self.num_training_steps()
        if self.lr_schedule_per == "rollout":
            return math.ceil(steps / self.updates_per_rollout())
        return steps

    def num_training_steps(self) -> int:
        """Optimizer steps of the fit: from `total_episodes`, else `max_steps`, else epochs."""
        per_rollout = self.updates_per_rollout()
        total = self.total_episodes
        if total:
            return math.ceil(total / self.episodes_per_rollout()) * per_rollout
        if self.trainer.max_steps and self.trainer.max_steps > 0:
            return int(self.trainer.max_steps)
        return super().num_training_steps() * per_rollout

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_KEY].update({"episodes": self.episodes, "rollouts": self.rollouts})

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        info = checkpoint.get(CHECKPOINT_KEY, {})
        self.episodes = int(info.get("episodes", 0))
        self.rollouts = int(info.get("rollouts", 0))
