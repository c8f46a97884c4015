"""Step logging of the trained modules: which training stats reach the logger, and at which step.

**One step axis.** Every scalar a run writes, training and validation alike, is written at the
number of optimizer steps done: Lightning's `trainer.global_step`, the number the console shows
("run stopped: ... (global step 12, ...)"), `JudgeEvalCallback` and the reward model's figures
use.

- A training batch's stats are written after the optimizer step it contributes to: under
  automatic optimisation the batch that completes an accumulation window (Lightning writes no
  other), the 8th step at 8; the online methods (PPO, GRPO, RLOO:
  manual optimisation, several optimizer steps per rollout) after the rollout's updates, so a PPO
  rollout with 2 updates is written at 2, 4, 6, ... and not at the rollout index 0, 1, 2.
- A validation (or test) is written at the steps done when it ran: an SFT run validating every
  8 steps writes its validations at 8 and 16, and a GRPO validation and the judge evaluation at
  its end share one step.

Lightning's own choice (what it writes without a `step`) is the count of batches that stepped
*before* the current one: 0-based (the 8th step at 7), the rollout index for the online methods,
and a validation one step before the judge that evaluates the same policy. `use_step_axis` makes
a trainer write at `logged_step` instead (`lightning_compat.write_metrics_at`: Lightning has no
public way to choose the step of what it writes without logging a `step` metric, which
`ModelCheckpoint` would then read as the step of its `{step}` file names); Lightning's "epoch"
column is kept, and a `step` that a caller passes or logs still wins. `TrainingModule.setup`
installs it.

**Which stats.** `step_stats_due` / `stats_to_log`: the training stats are logged on the steps the
logger writes, plus the progress-bar ones on every step when a progress bar shows them.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.lightning_compat import attached_trainer, logger_writes_this_step, write_metrics_at

__all__ = ["StepLoggingMixin", "logged_step", "stats_to_log", "step_stats_due", "use_step_axis"]


def logged_step(trainer: Any) -> int:
    """The step the scalars written now belong to: the optimizer steps done. (Under gradient
    accumulation Lightning writes a window's training stats once, after its optimizer step.)"""
    return int(trainer.global_step)


def use_step_axis(trainer: Any) -> None:
    """Make `trainer` write every logged scalar at `logged_step` (see the module docstring); idempotent."""
    write_metrics_at(trainer, logged_step)


def stats_to_log(trainer: Any, stats: dict[str, Any], prog_bar: tuple[str, ...]) -> dict[str, Any]:
    """The training step stats worth a `self.log` now: all of them on the steps the logger
    writes (`step_stats_due`); otherwise the progress-bar ones, when a progress bar shows them."""
    if step_stats_due(trainer):
        return stats
    if getattr(trainer, "progress_bar_callback", None) is None:
        return {}
    return {name: value for name, value in stats.items() if name in prog_bar}


def step_stats_due(trainer: Any) -> bool:
    """Whether this training step's stats reach the logger: every `log_every_n_steps` (every
    step under `fast_dev_run`), the steps on which Lightning writes `on_step` values.

    Each `self.log` costs ~0.3 ms on CPU (Lightning's result collection), ~7 ms a step for an
    online method's 20 stats, so the modules log step stats only on these steps, plus the
    progress-bar ones on every step when there is a progress bar (`stats_to_log`); Lightning's
    own `LearningRateMonitor` and `DeviceStatsMonitor` skip their work the same way.
    `trainer.callback_metrics` therefore holds the stats of the last logged step.
    """
    if trainer is None:
        return True
    return bool(trainer.fast_dev_run) or logger_writes_this_step(trainer)


class StepLoggingMixin:
    """`log_stats` of a LightningModule (mixed into `TrainingModule`)."""

    def log_stats(self, stage: str, stats: dict[str, Tensor | float], prog_bar: tuple[str, ...] = (), **kwargs) -> None:
        """Log `{stage}/{name}` for every entry (names already carry their group: `rewards/margins`).

        Training stats are per step; on the steps the logger does not write (see
        `step_stats_due`) only the progress-bar ones are logged, when a progress bar shows them."""
        on_step = stage == "train"
        if on_step:
            stats = stats_to_log(attached_trainer(self), stats, prog_bar)
        for name, value in stats.items():
            if isinstance(value, Tensor):
                value = value.detach().float()
            self.log(
                f"{stage}/{name}", value, prog_bar=name in prog_bar, on_step=on_step, on_epoch=not on_step,
                sync_dist=not on_step, **kwargs,
            )
