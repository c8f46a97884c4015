"""Save a checkpoint when the job is told to stop (SIGTERM from a cluster, SIGINT from Ctrl-C).

    trainer:
      callbacks:
        - class_path: lightning.pytorch.callbacks.ModelCheckpoint
          init_args: {dirpath: outputs/run/checkpoints, save_last: true}
        - class_path: callbacks.PreemptionCheckpoint

On the signal the current optimizer step finishes, `last.ckpt` is written atomically next to the
ModelCheckpoint's files (or under `dirpath`), and the run exits. Resubmit the same command with
`--ckpt_path last` and training continues from that step.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class PreemptionCheckpoint(Callback):
    """Write `last.ckpt` at the end of the step during which SIGTERM or SIGINT arrived, then stop.

    Args:
        dirpath: where to write `last.ckpt`; defaults to the ModelCheckpoint callback's directory,
            else `<default_root_dir>/checkpoints`.
        filename: checkpoint file name (default `last.ckpt`, what `--ckpt_path last` finds when it
            sits in the ModelCheckpoint's directory).
    """

    def __init__(self, dirpath: str | None = None, filename: str = "last.ckpt") -> None:
        self.dirpath = dirpath
        self.filename = filename
        self.received: int | None = None
        self._saved_at_step: int | None = None
        self._previous_sigint: Any = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # SIGTERM is caught by Lightning (trainer.received_sigterm); SIGINT we catch ourselves so
        # that Ctrl-C also ends in a clean step boundary instead of an interrupted step.
        if stage == "fit" and threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def _on_sigint(self, signum, frame) -> None:
        if self.received is not None:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.received = signum
        log.warning("SIGINT received: saving a checkpoint at the end of this step (Ctrl-C again to abort)")

    def checkpoint_path(self, trainer: Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath) / self.filename
        for callback in trainer.callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath:
                return Path(callback.dirpath) / self.filename
        return Path(trainer.default_root_dir) / "checkpoints" / self.filename

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.received_sigterm or self.received is not None:
            self._save(trainer)
            trainer.should_stop = True

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A SIGTERM that lands after this step's `on_train_batch_end` is turned by Lightning into
        # SIGTERMException at the step boundary (end of the batch, after the optimizer step, all
        # ranks together): the state is the one after a complete step, so save it here.
        if isinstance(exception, SIGTERMException):
            self._save(trainer)

    def _save(self, trainer: Trainer) -> None:
        if self._saved_at_step == trainer.global_step:
            return
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # written through a temporary file in the same directory: atomic
        self._saved_at_step = trainer.global_step
        what = "SIGTERM" if trainer.received_sigterm else "SIGINT"
        log.warning("%s: saved %s at global step %d; resume with --ckpt_path last", what, path, trainer.global_step)
