"""Every use of a Lightning private attribute, one small function each.

Lightning's public API does not cover a few things this project needs (its own signal handling
replaced by a checkpoint at an optimizer-step boundary, one step axis for every logged scalar, a
trusted instantiator for its own checkpoints, ...). Each such use is a function here, with the
reason no public API serves and the Lightning version it was written against;
`tests/test_lightning_compat.py` has a test per function that fails when Lightning changes under
it, and `tests/test_architecture.py` checks that no other file of `lit_rlhf` or `callbacks`
touches a Lightning private name. When Lightning moves, this file and its test are the whole
change.

Written against Lightning 2.6 (`lightning.pytorch`).
"""

from __future__ import annotations

from typing import Any, Callable

from lightning.pytorch.core import saving

LIGHTNING_VERSION = "2.6"  # the version every function below was written against

__all__ = [
    "LIGHTNING_VERSION", "accumulating", "attached_trainer", "callback_state_key", "checkpoint_dir", "last_checkpoints_in_dir",
    "learning_rates", "logger_version_unset", "logger_writes_this_step", "progress_bar_due", "replace_eval_mode_check",
    "set_logger_version", "set_model_parallel_sizes", "signal_handlers_restored_at_teardown", "stop_after_this_batch", "take_lightning_sigterm",
    "trust_checkpoint_instantiator", "uncount_stepped_batch",
]


# ----------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------


def trust_checkpoint_instantiator(path: str) -> None:
    """Add `path` (a `module.function` import path) to the instantiators `load_from_checkpoint`
    accepts from a checkpoint's hyper-parameters (`_instantiator`).

    Why private: Lightning 2.6 blocks any instantiator not in `saving._ALLOWED_INSTANTIATORS`
    (arbitrary code execution from a checkpoint) and offers no function to extend that set; its
    error message itself says to add the path there. Idempotent."""
    saving._ALLOWED_INSTANTIATORS.add(path)


def last_checkpoints_in_dir(callback: Any, trainer: Any) -> set[str]:
    """The `last*.ckpt` files in `callback`'s (a `ModelCheckpoint`) directory: the files
    `ckpt_path="last"` chooses from.

    Why private: `ModelCheckpoint._find_last_checkpoints` is the rule `trainer.fit(ckpt_path="last")`
    applies (Lightning 2.6); no public method names the candidates, and a copy of the rule would
    drift from the one that picks the file."""
    return set(callback._find_last_checkpoints(trainer))


def checkpoint_dir(callback: Any, trainer: Any) -> str:
    """The directory `callback` (a `ModelCheckpoint`) writes to: its `dirpath`, else the one it
    derives from the first logger (`save_dir/name/version/checkpoints`) or `default_root_dir`.

    Why private: before the first save `dirpath` may still be None; the derivation is the
    name-mangled `ModelCheckpoint.__resolve_ckpt_dir` (Lightning 2.6), which has no public
    counterpart."""
    if callback.dirpath is not None:
        return str(callback.dirpath)
    return str(callback._ModelCheckpoint__resolve_ckpt_dir(trainer))


def callback_state_key(callback: Any, **kwargs: Any) -> str:
    """The key a callback's state is saved under in a checkpoint, its class name with `kwargs`, so
    several instances of one callback class keep their states apart.

    Why private: `Callback._generate_state_key` (Lightning 2.6) is the format Lightning's own
    callbacks (`ModelCheckpoint`, `EarlyStopping`) use; its docstring offers it for `state_key`."""
    return callback._generate_state_key(**kwargs)


def uncount_stepped_batch(fit_loop_state: dict[str, Any]) -> None:
    """Take one batch off the count of batches that stepped in a checkpoint's fit-loop state
    (`checkpoint["loops"]["fit_loop"]`), the counter Lightning writes training scalars against.

    Why private: the counter is `_TrainingEpochLoop._batches_that_stepped`, saved under
    `"epoch_loop.state_dict"` (Lightning 2.6); a checkpoint rewritten to its mid-epoch form
    (`lit_rlhf.resume.as_mid_epoch`) must move it with the batch counters, and no public API
    edits loop state."""
    fit_loop_state["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1


# ----------------------------------------------------------------------------------------------
# the training loop
# ----------------------------------------------------------------------------------------------


def accumulating(trainer: Any) -> bool:
    """Whether the current batch only accumulates gradients (no optimizer step at its end) under
    automatic optimisation.

    Why private: `_TrainingEpochLoop._should_accumulate` (Lightning 2.6) is the loop's own
    decision, including its rules for the epoch's last batch and for strategies that accumulate
    themselves (DeepSpeed); `accumulate_grad_batches` alone does not give it."""
    return bool(trainer.fit_loop.epoch_loop._should_accumulate())


def replace_eval_mode_check(trainer: Any, check: Callable[[], None]) -> bool:
    """Run `check` instead of the fit loop's warning about submodules in eval mode at the start
    of training; returns whether the loop had that check to replace.

    Why private: Lightning 2.6's `_FitLoop._warn_if_modules_in_eval_mode` warns of every module
    in eval mode, the frozen reference and reward models included (kept in eval mode on purpose,
    D7), and has no switch; the replacement warns of the trained modules only."""
    loop = trainer.fit_loop
    if not callable(getattr(loop, "_warn_if_modules_in_eval_mode", None)):
        return False
    loop._warn_if_modules_in_eval_mode = check
    return True


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


# ----------------------------------------------------------------------------------------------
# signals: a preemption checkpoint at an optimizer-step boundary
# ----------------------------------------------------------------------------------------------


def signal_handlers_restored_at_teardown(trainer: Any) -> dict[int, Any]:
    """The handlers (signal number -> handler) Lightning saved when it installed its own SIGTERM
    handler and puts back at teardown; the dict itself, so an entry can be changed ({} when the
    trainer has none).

    Why private: `_SignalConnector._original_handlers` (Lightning 2.6); a callback that installs
    its handler before Lightning's would otherwise get its own handler put back after the run."""
    connector = getattr(trainer, "_signal_connector", None)
    handlers = getattr(connector, "_original_handlers", None)
    return handlers if isinstance(handlers, dict) else {}


def take_lightning_sigterm(trainer: Any) -> bool:
    """Whether Lightning's SIGTERM handler recorded a signal; clears the record, so the signal
    becomes the caller's to act on.

    Why private: `_SignalConnector.received_sigterm` (Lightning 2.6) is where Lightning's handler
    notes the signal it would stop on at the end of the current batch."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is None or not connector.received_sigterm:
        return False
    connector.received_sigterm = False
    return True


def stop_after_this_batch(trainer: Any) -> None:
    """End the fit at the end of the current training batch as after a SIGTERM: once its metrics
    are logged, `trainer.fit` raises `SIGTERMException`; validation due after the batch is skipped.

    Why private: Lightning 2.6 stops this way only through `_SignalConnector.received_sigterm`
    (checked at the end of every batch); `trainer.should_stop` would let the epoch-end hooks and
    the validation due after the batch run and end the fit normally. `_skip_next_val` is the
    training epoch loop's own switch for skipping that validation."""
    trainer._signal_connector.received_sigterm = True
    trainer.fit_loop.epoch_loop._skip_next_val = True


# ----------------------------------------------------------------------------------------------
# loggers
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# strategies
# ----------------------------------------------------------------------------------------------


def set_model_parallel_sizes(strategy: Any, world_size: int) -> None:
    """Resolve a `ModelParallelStrategy`'s `data_parallel_size: auto` to `world_size` divided by
    its tensor-parallel size (1 unless set), before `setup_environment` builds the device mesh;
    sizes given as numbers are left alone.

    Why private: Lightning 2.6 keeps the two sizes in `_data_parallel_size` and
    `_tensor_parallel_size` and resolves `auto` only inside `setup_environment`, the data-parallel
    one to the number of nodes; no public setter exists, and FSDP2 alone wants every process in
    the data-parallel dimension (`lit_rlhf.training.sharding.resolve_data_parallel_size`)."""
    if strategy._data_parallel_size != "auto":
        return
    tensor = 1 if strategy._tensor_parallel_size == "auto" else int(strategy._tensor_parallel_size)
    strategy._tensor_parallel_size = tensor
    strategy._data_parallel_size = max(1, world_size // tensor)


# ----------------------------------------------------------------------------------------------
# public API in place of a private attribute
# ----------------------------------------------------------------------------------------------


def attached_trainer(module: Any) -> Any:
    """The Trainer `module` (a LightningModule) is attached to, or None.

    Public API: `LightningModule.trainer` raises when no Trainer is attached (Lightning 2.6), so
    this asks it instead of reading the private `_trainer` behind it."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def restart_next_epoch_afresh(trainer: Any) -> bool:
    """After a restore from a checkpoint saved in the `on_train_batch_end` of an epoch's last batch,
    clear the fit loop's restart stage so the next epoch starts as a fresh one; True when it did.

    Why internal: the loops' restart stages (`restarted_mid_epoch`, `restarted_on_train_batch_end`,
    `reset_restart_stage`; Lightning 2.6) are public names but undocumented; the test is the one
    `_FitLoop.reset` uses to count the saved epoch as done, and no public API starts the next epoch
    afresh (`lit_rlhf.resume.start_next_epoch_afresh` says why it must)."""
    loop = trainer.fit_loop
    if not (getattr(loop, "restarted_mid_epoch", False)
            and getattr(loop.epoch_loop, "restarted_on_train_batch_end", False)
            and loop.epoch_loop.batch_progress.is_last_batch):
        return False
    loop.reset_restart_stage()
    return True


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
