"""`python main.py fit ... --ckpt_path last` (`docs/guides/resume.md`): the run directory pinned to
the logger's newest `version_N` (`pin_run_directory`), `NothingToResume` unless
`--fresh_if_no_checkpoint true`, the exit codes of a stopped run (75 after SIGTERM, 130 after
Ctrl-C), the next epoch started afresh after an epoch's last batch (`start_next_epoch_afresh`) and
Lightning's "dataloader is not resumable" warning dropped for the project's resumable samplers
(`exact_resume_warnings`).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from lit_rlhf import lightning_compat
from lit_rlhf.preemption import PreemptionCheckpoint, holds_after_fit
from lit_rlhf.stopping import PREEMPTED_EXIT_CODE, Preempted

log = logging.getLogger(__name__)

FRESH_FLAG = "fresh_if_no_checkpoint"
NOT_RESUMABLE_WARNING = ("You're resuming from a checkpoint that ended before the epoch ended and your dataloader is "
                         "not resumable")


class NothingToResume(FileNotFoundError):
    """`--ckpt_path last` found no `last*.ckpt` to resume from."""


def add_resume_arguments(parser: Any) -> None:
    parser.add_argument(
        f"--{FRESH_FLAG}", type=bool, default=False,
        help="with --ckpt_path last: start a new run when the run has no last checkpoint yet (else an error)",
    )


def pin_run_directory(trainer: Any) -> None:
    """Make every TensorBoard/CSV logger without a fixed version reuse its newest `version_N`."""
    for logger in trainer.loggers:
        if not lightning_compat.logger_version_unset(logger):
            continue
        root = Path(logger.root_dir)
        versions = [int(m.group(1)) for p in (root.iterdir() if root.is_dir() else [])
                    if p.is_dir() and (m := re.fullmatch(r"version_(\d+)", p.name))]
        if versions:
            lightning_compat.set_logger_version(logger, max(versions))
            log.warning("--ckpt_path last: continuing the run in %s (the newest version of %s)", logger.log_dir, root)


def _model_checkpoints(trainer: Any) -> list[Any]:
    from lightning.pytorch.callbacks import ModelCheckpoint

    return [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]


def last_checkpoints(trainer: Any) -> list[str]:
    """The `last*.ckpt` files `--ckpt_path last` chooses from (every ModelCheckpoint's directory)."""
    found = (lightning_compat.last_checkpoints_in_dir(c, trainer) for c in _model_checkpoints(trainer))
    return sorted(set().union(*found))


def checkpoint_dirs(trainer: Any) -> list[str]:
    """The ModelCheckpoint directories `--ckpt_path last` looks in, each once, in callback order
    (Lightning's own rule for a callback's directory)."""
    return list(dict.fromkeys(lightning_compat.checkpoint_dir(c, trainer) for c in _model_checkpoints(trainer)))


def prepare_fit(trainer: Any, config: Any) -> None:
    """Before `trainer.fit` from the CLI: pin the run directory and check `--ckpt_path last`.

    `config` is the fit subcommand's config (its `ckpt_path` is set to None when a fresh start
    was asked for and there is no checkpoint)."""
    if config.get("ckpt_path") != "last":
        return
    pin_run_directory(trainer)
    if last_checkpoints(trainer):
        return
    where = ", ".join(checkpoint_dirs(trainer)) or "(no ModelCheckpoint callback: add one with save_last: true)"
    if config.get(FRESH_FLAG):
        log.warning("--ckpt_path last: no last checkpoint in %s; starting a new run (--%s)", where, FRESH_FLAG)
        config["ckpt_path"] = None
        return
    raise NothingToResume(
        f"--ckpt_path last, but there is no last checkpoint in {where}. Pass a checkpoint path, or add "
        f"--{FRESH_FLAG} true to start a new run when none exists yet."
    )


def resumes_mid_epoch_exactly(datamodule: Any) -> bool:
    """Whether `datamodule`'s train loader resumes inside an epoch exactly without Lightning's
    help: a DataModule of `lit_rlhf.data` whose train loader is the base class's (a
    `ResumableSampler`) and that loads in the main process (`num_workers: 0`)."""
    from lit_rlhf.data.base import RLHFDataModule

    return (isinstance(datamodule, RLHFDataModule)
            and type(datamodule).train_dataloader is RLHFDataModule.train_dataloader
            and not getattr(datamodule, "num_workers", 0))


@contextmanager
def exact_resume_warnings(datamodule: Any) -> Iterator[None]:
    """Inside the block, Lightning's "your dataloader is not resumable" warning is dropped when
    `resumes_mid_epoch_exactly(datamodule)` (the warning would contradict the exact resume)."""
    with warnings.catch_warnings():
        if resumes_mid_epoch_exactly(datamodule):
            warnings.filterwarnings("ignore", message=re.escape(NOT_RESUMABLE_WARNING))
        yield


def _exit_at_once(signum, frame) -> None:
    raise Preempted(f"{signal.Signals(signum).name} during start-up: nothing trained yet, exiting with code "
                    f"{PREEMPTED_EXIT_CODE}")


@contextmanager
def sigterm_exits_during_startup() -> Iterator[None]:
    """Until the trainer runs, SIGTERM exits with 75 at once (nothing was trained); the default
    handler is back when the block ends. A handler that an earlier complete fit of this process
    left in place (`PreemptionCheckpoint`) is replaced too; any other is left alone."""
    current = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or (
            current != signal.SIG_DFL and not holds_after_fit(current)):
        yield
        return
    signal.signal(signal.SIGTERM, _exit_at_once)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) == _exit_at_once:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def end_startup_handler(trainer: Any) -> None:
    """Hand SIGTERM over to the trainer: `PreemptionCheckpoint` takes it in its `setup` (and, the
    fit being the last thing this process does, keeps it after a complete fit until the process
    exits: `hold_until_exit`), and without that callback (`--preemption_checkpoint false`)
    Lightning's handler does (stopping at the end of a batch)."""
    preemption = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionCheckpoint)]
    for callback in preemption:
        callback.hold_until_exit = True
    if signal.getsignal(signal.SIGTERM) == _exit_at_once and not preemption:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def preempted_exit(trainer: Any, exception: BaseException) -> Preempted | None:
    """The `Preempted` exit for a fit that ended on a signal (None for any other exception)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    if isinstance(exception, Preempted):
        return exception
    if not isinstance(exception, SIGTERMException):
        return None
    for callback in trainer.callbacks if trainer is not None else []:
        if isinstance(callback, PreemptionCheckpoint) and callback.saved_path is not None:
            return Preempted(callback.message(trainer), callback.exit_code)
    return Preempted(f"SIGTERM: stopped at the end of a batch without a preemption checkpoint (it is off: "
                     f"--preemption_checkpoint false or trainer.enable_checkpointing: false); exiting with code "
                     f"{PREEMPTED_EXIT_CODE}")


def as_mid_epoch(trainer: Any, checkpoint: dict[str, Any], at_last_batch: tuple[int, int] | None) -> bool:
    """Rewrite the loop counters of a checkpoint saved after an epoch a stop cut short (a budget
    reached mid-epoch, EarlyStopping; at `on_train_epoch_end` or `on_train_end`) into those right
    after its last batch, since Lightning counts that epoch as finished and a resume with a larger
    budget would start the next epoch. `at_last_batch`: the fit loop's (processed, completed) epochs
    after the last batch (`TrainingModule.on_train_batch_end`). Returns whether it changed."""
    if at_last_batch is None or trainer.sanity_checking or "loops" not in checkpoint:
        return False
    loop = trainer.fit_loop
    batches = loop.epoch_loop.batch_progress
    total = trainer.num_training_batches
    epochs = loop.epoch_progress.current
    processed, completed = epochs.processed - at_last_batch[0], epochs.completed - at_last_batch[1]
    cut_short = not batches.is_last_batch and 0 < batches.current.ready < total != float("inf")
    if processed <= 0 or not cut_short or batches.current.completed != batches.current.ready:
        return False
    state = checkpoint["loops"]["fit_loop"]
    for counters in (state["epoch_loop.batch_progress"]["current"], state["epoch_loop.batch_progress"]["total"]):
        counters["completed"] -= 1
    if not lightning_compat.accumulating(trainer):  # the last batch stepped: counted after its hooks
        lightning_compat.uncount_stepped_batch(state)
    for counters in (state["epoch_progress"]["current"], state["epoch_progress"]["total"]):
        counters["processed"] -= processed
        counters["completed"] -= completed
    checkpoint["epoch"] -= completed
    return True


def start_next_epoch_afresh(trainer: Any) -> bool:
    """Call at `on_train_start`: on a run resumed from a checkpoint written in an epoch's last batch,
    start the next epoch as a fresh one (returns whether the loop's state changed). Lightning keeps
    the restart stage "mid-epoch" into the next epoch, skipping its `ready`/`started` counts and
    `on_train_epoch_start` hooks, so a checkpoint written in it would record that epoch as finished
    and a resume would train it again with the old data order."""
    return lightning_compat.restart_next_epoch_afresh(trainer)
