"""The training loop: gradient accumulation, the eval-mode check, Lightning's signal handling (a
preemption checkpoint at an optimizer-step boundary instead), model-parallel sizes.

Written against Lightning 2.6 (see `lit_rlhf.lightning_compat`).
"""

from __future__ import annotations

from typing import Any, Callable


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
