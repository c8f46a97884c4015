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

**Which stats.** `TrainingModule.step_stats_due` / `log_stats`: the training stats are logged on
the steps the logger writes, plus the progress-bar ones on every step when a progress bar shows
them.
"""

from __future__ import annotations

from typing import Any

from lit_rlhf.lightning_compat import write_metrics_at

__all__ = ["logged_step", "use_step_axis"]


def logged_step(trainer: Any) -> int:
    """The step the scalars written now belong to: the optimizer steps done. (Under gradient
    accumulation Lightning writes a window's training stats once, after its optimizer step.)"""
    return int(trainer.global_step)


def use_step_axis(trainer: Any) -> None:
    """Make `trainer` write every logged scalar at `logged_step` (see the module docstring); idempotent."""
    write_metrics_at(trainer, logged_step)
