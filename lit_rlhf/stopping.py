"""Why a fit stopped: one line at the end of every run, and the exit code of a preempted one
(`docs/guides/resume.md`).

A run that finishes logs `run stopped: <reason>` (`stop_reason`): the budget reached
(`max_steps`, `max_epochs`, `total_episodes`, `max_time`), a callback that asked to stop, or for a
resumed run with nothing left, the limit to raise. A run stopped by SIGTERM
(`lit_rlhf.preemption.PreemptionCheckpoint`) ends `python main.py` with `Preempted`, a
`SystemExit` with `PREEMPTED_EXIT_CODE` (75, sysexits.h's `EX_TEMPFAIL`: try again; in process,
`trainer.fit` raises Lightning's `SIGTERMException`); Ctrl-C saves the same way and exits with 130.
"""

from __future__ import annotations

from typing import Any

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: rerun the same command with --ckpt_path last
INTERRUPTED_EXIT_CODE = 130  # Ctrl-C (128 + SIGINT), after the checkpoint is written


class Preempted(SystemExit):
    """The run stopped on a signal; `code` is the process exit status (75 for SIGTERM)."""

    def __init__(self, message: str, code: int = PREEMPTED_EXIT_CODE) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def stop_reason(trainer: Any, module: Any = None, steps_at_start: int | None = None) -> str:
    """A one-line reason why `trainer.fit` returned (budget reached, stopped by a callback, ...).

    `steps_at_start` is the global step the fit started from (the checkpoint's); when no step was
    trained the line says so, and which limit to raise to train further.
    """
    step, epoch = trainer.global_step, trainer.current_epoch
    max_steps, max_epochs = trainer.max_steps, trainer.fit_loop.max_epochs
    own = getattr(module, "budget_reached", None)
    reasons: list[str] = []
    if callable(own) and own():
        reasons.append(own())
    steps_done = max_steps is not None and max_steps != -1 and step >= max_steps
    if steps_done:
        reasons.append(f"max_steps={max_steps} reached")
    # Lightning counts the epoch a max_steps stop cut short as completed: the epochs stopped the run
    # only when its last epoch ran to its last batch
    epoch_ended = not steps_done or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    if max_epochs is not None and max_epochs != -1 and epoch >= max_epochs and epoch_ended:
        reasons.append(f"max_epochs={max_epochs} reached")
    for timer in (c for c in trainer.callbacks if type(c).__name__ == "Timer"):
        remaining = timer.time_remaining()
        if remaining is not None and remaining <= 0:
            reasons.append(f"max_time={timer.time_elapsed() + remaining:.0f}s reached")
    if not reasons:
        stoppers = [type(c).__name__ for c in trainer.callbacks if getattr(c, "stopped_epoch", 0)]
        if stoppers:
            reasons.append(f"stopped early by {', '.join(stoppers)}")
        elif trainer.should_stop:
            reasons.append("stopped early: a callback or the module set trainer.should_stop")
        elif trainer.limit_train_batches == 0:
            reasons.append("limit_train_batches=0")
        else:
            reasons.append("the train loop ended")
    line = "; ".join(reasons) + f" (global step {step}, epoch {epoch})"
    if steps_at_start is not None and step == steps_at_start:
        line += f"; no step trained: the checkpoint at step {steps_at_start} had already met this budget"
        unmet = []
        if max_steps not in (None, -1) and step < max_steps:
            unmet.append(f"max_steps={max_steps}")
        if unmet:
            line += f" ({', '.join(unmet)} not reached: raise the limit that stopped it)"
    elif max_steps not in (None, -1) and step < max_steps and reasons and "max_steps" not in line:
        line += f"; max_steps={max_steps} not reached"
    return line
