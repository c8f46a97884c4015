"""Logging: when the loggers write a step's values and at which step, a logger's version, the
progress bar's refresh rule, the learning rates `LearningRateMonitor` reads.

Written against Lightning 2.6 (see `lit_rlhf.lightning_compat`).
"""

from __future__ import annotations

from typing import Any


def learning_rates(monitor: Any, trainer: Any, interval: str) -> dict[str, float]:
    """The learning rates (and momenta, when asked) a `LearningRateMonitor` would write for
    `interval` ("step", "epoch" or "any"), named as it names them.

    Why private: `LearningRateMonitor._extract_stats` (Lightning 2.6) is its whole reading of the
    optimizers and schedulers (names, parameter groups, momentum); a subclass that only changes the
    step a value is written at reuses it rather than copying it."""
    return monitor._extract_stats(trainer, interval)


def logger_writes_this_step(trainer: Any) -> bool:
    """Whether the loggers write the `on_step` values of the current training batch (every
    `log_every_n_steps`, and when the run is stopping).

    Why private: `_LoggerConnector.should_update_logs` (Lightning 2.6) is the rule the trainer
    applies to decide the write; Lightning's own `LearningRateMonitor` reads it the same way."""
    return bool(trainer._logger_connector.should_update_logs)


def progress_bar_due(bar: Any, current: int, total: int | None) -> bool:
    """Whether a `TQDMProgressBar` redraws at count `current` of `total` (every `refresh_rate`,
    and at the total).

    Why private: `TQDMProgressBar._should_update` (Lightning 2.6) is the bar's own refresh rule; a
    bar that counts something else than batches (rollouts) reuses it rather than copying it."""
    return bool(bar._should_update(current, total))


def logger_version_unset(logger: Any) -> bool:
    """Whether a TensorBoard/CSV logger was given no `version` and has not chosen one yet (it
    would take the next free `version_N` on first use).

    Why private: the loggers' public `version` property chooses (and creates) the next version
    when read; only `_version` (Lightning 2.6) tells an unset version apart without doing so."""
    return hasattr(logger, "root_dir") and getattr(logger, "_version", "") is None


def set_logger_version(logger: Any, version: int | str) -> None:
    """Make a TensorBoard/CSV logger write into `version` (an existing `version_N`) instead of a
    new one.

    Why private: the loggers take `version` only in their constructor; a logger the CLI already
    built is pointed at another version through `_version` (Lightning 2.6)."""
    logger._version = version


def write_metrics_at(trainer: Any, step_of: Any) -> None:
    """Make `trainer` write every logged scalar at `step_of(trainer)`, with Lightning's `epoch`
    column, unless a caller passes or logs a `step`; idempotent.

    Why private: Lightning 2.6 writes `self.log` values through `trainer._logger_connector.log_metrics`
    at the count of batches that stepped before the current one, and offers no public way to choose
    the step but logging a metric named `step`, which `ModelCheckpoint` then reads as the step of its
    `{step}` file names (the file of step 2 would be named after the logged value of step 1)."""
    connector = getattr(trainer, "_logger_connector", None)
    if connector is None or getattr(connector, "lit_rlhf_step_axis", False):
        return
    write = connector.log_metrics

    def log_metrics(metrics: dict[str, Any], step: int | None = None) -> None:
        if step is None and metrics and "step" not in metrics:
            metrics = {"epoch": trainer.current_epoch, **metrics}  # Lightning adds it only without a step
            step = step_of(trainer)
        write(metrics, step)

    connector.log_metrics = log_metrics
    connector.lit_rlhf_step_axis = True
