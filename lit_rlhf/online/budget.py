"""How long an online run is: episodes, the budget, the schedule length.

A run is measured in **episodes**: one episode is one sampled response (B prompts x G
generations x world size per rollout). With `total_episodes` set, the module stops the trainer
once that many episodes were sampled and sizes the learning-rate schedule to
`ceil(total_episodes / episodes per rollout) * updates_per_rollout()` optimizer steps; leave
`trainer.max_steps` at -1 and `trainer.max_epochs` at -1 then (the prompt loader is simply
reshuffled each epoch, D21). Without it, `trainer.max_steps` counts optimizer steps
(`updates_per_rollout()` of them per rollout). With `lr_schedule_per: rollout` the schedule
steps once per rollout instead. The counters `episodes` and `rollouts` live on the module and
travel in its checkpoints.
"""

from __future__ import annotations

import math
from typing import Any


def budget_reached(module: Any) -> str:
    """Why the episode budget stops the run ("" while it does not)."""
    total = module.total_episodes
    if total and module.episodes >= total:
        return f"total_episodes={total} reached ({module.episodes} episodes sampled)"
    return ""


def prompts_per_rollout(trainer: Any) -> int:
    """Prompts per rollout on one rank: the prompt DataModule's (or loader's) batch size."""
    dm = getattr(trainer, "datamodule", None)
    size = getattr(dm, "batch_size", None) or (getattr(dm, "hparams", None) or {}).get("batch_size")
    if not size:
        trainer.fit_loop.setup_data()  # builds the train dataloader (a no-op once built)
        size = getattr(trainer.train_dataloader, "batch_size", None)
    if not size:
        raise ValueError("cannot tell the prompt batch size: give the DataModule a `batch_size`")
    return int(size)


def episodes_per_rollout(module: Any) -> int:
    trainer = module.trainer
    return prompts_per_rollout(trainer) * module.repeats * max(1, trainer.world_size)


def training_steps(module: Any, epoch_steps: int) -> int:
    """Optimizer steps of the fit: from `total_episodes`, else `max_steps`, else `epoch_steps`
    (the batches of the fit's epochs) times the updates per rollout."""
    per_rollout = module.updates_per_rollout()
    if module.total_episodes:
        return math.ceil(module.total_episodes / episodes_per_rollout(module)) * per_rollout
    max_steps = module.trainer.max_steps
    if max_steps and max_steps > 0:
        return int(max_steps)
    return epoch_steps * per_rollout


def schedule_steps(module: Any, training: int) -> int:
    """Scheduler steps of the fit: its `training` optimizer steps, or its rollouts with
    `lr_schedule_per: rollout`."""
    if module.lr_schedule_per == "rollout":
        return math.ceil(training / module.updates_per_rollout())
    return training
