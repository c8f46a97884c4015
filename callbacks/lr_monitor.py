"""Lightning's learning-rate monitor on the project's one step axis.

`lit_rlhf.training.step_logging` writes every scalar at the optimizer steps done (the step a
training stat belongs to: the 8th step at 8). Lightning's `LearningRateMonitor` writes the
learning rate at the count of batches that stepped before the current one (0-based, and the
rollout index for the online methods), so its curve sat one step (or a whole rollout) away from
the losses it explains. This monitor writes, at the start of a batch, the learning rate the next
optimizer step will use at that step's number, `trainer.global_step + 1`; everything else is
Lightning's.

A run without a logger (`--trainer.logger false`) has nowhere to write the learning rate:
Lightning's monitor refuses such a run; this one steps aside with one line instead.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import LearningRateMonitor as _LightningLearningRateMonitor

from lit_rlhf.lightning_compat import learning_rates, logger_writes_this_step

log = logging.getLogger(__name__)


class LearningRateMonitor(_LightningLearningRateMonitor):
    """`lightning.pytorch.callbacks.LearningRateMonitor` with the scalars at the step they are used in."""

    idle = False  # the run has no logger: nothing is written

    def on_train_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.idle = not trainer.loggers
        if not self.idle:
            super().on_train_start(trainer, *args, **kwargs)
        elif trainer.is_global_zero:
            log.warning("LearningRateMonitor: the run has no logger (trainer.logger is false), so the learning rate "
                        "is not logged")

    def _write(self, trainer: Any, interval: str) -> None:
        if self.idle:
            return
        stats = learning_rates(self, trainer, interval)  # Lightning's own reading of the optimizers
        for logger in trainer.loggers if stats else ():
            logger.log_metrics(stats, step=int(trainer.global_step) + 1)

    def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if logger_writes_this_step(trainer) and self.logging_interval != "epoch":
            self._write(trainer, "step" if self.logging_interval is None else "any")

    def on_train_epoch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if self.logging_interval != "step":
            self._write(trainer, "epoch" if self.logging_interval is None else "any")
