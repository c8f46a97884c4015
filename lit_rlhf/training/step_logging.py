"""Step logging: every scalar, training and validation alike, is written at the optimizer steps done
(`trainer.global_step`, as the console and `JudgeEvalCallback` show), not at Lightning's count of
batches stepped before the current one. `use_step_axis` (installed by `TrainingModule.setup`)
makes a trainer write at `logged_step` (`lightning_compat.write_metrics_at`; a logged `step`
metric would be read by `ModelCheckpoint` as its `{step}`); a `step` a caller passes still wins.
"""

from __future__ import annotations

from typing import Any

from lit_rlhf.lightning_compat import write_metrics_at

__all__ = ["logged_step", "use_step_axis"]


def logged_step(trainer: Any) -> int:
    """The step the scalars written now belong to: the optimizer steps done."""
    return int(trainer.global_step)


def use_step_axis(trainer: Any) -> None:
    """Make `trainer` write every logged scalar at `logged_step` (see the module docstring); idempotent."""
    write_metrics_at(trainer, logged_step)
