"""When an evaluation callback runs: every `every_n_steps` optimizer steps and/or at the end of
each validation run, never twice at one optimizer step (`JudgeEvalCallback`, `PassAtKCallback`)."""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer


class ScheduledEvaluation(Callback):
    """Calls `evaluate(trainer, pl_module)` on the schedule of `every_n_steps` (0: never during
    training) and `at_validation_end`; `evaluate` records `_last_step = trainer.global_step`."""

    every_n_steps: int = 0
    at_validation_end: bool = True
    _last_step: int | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._last_step = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._last_step:
            self.evaluate(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.at_validation_end or trainer.sanity_checking:
            return
        if trainer.state.fn == "fit" and trainer.global_step == self._last_step:
            return  # already evaluated at this step by every_n_steps
        self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        raise NotImplementedError
