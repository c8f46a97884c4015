"""Save a checkpoint when the job is told to stop (SIGTERM from a cluster, SIGINT from Ctrl-C).

Every `python main.py fit` gets a `PreemptionCheckpoint` (`lit_rlhf.cli`); what it does when a
signal lands, the exit codes and resubmission are in `docs/guides/resume.md`. The signal is only
recorded and acted on at an optimizer-step boundary (never inside an accumulation window or an
epoch's end), before the first step (nothing to save), or not at all once the fit loop ended on
its own, so the resumed run is the straight run, bitwise. It replaces Lightning's own SIGTERM
handling while active; under several processes every rank takes the same decision at each step
boundary (one all-reduce of a flag per step).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerStatus

from lit_rlhf import lightning_compat
from lit_rlhf.stopping import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, Preempted

log = logging.getLogger(__name__)


class PreemptionCheckpoint(Callback):
    """Write `last.ckpt` at the first optimizer-step boundary after SIGTERM or SIGINT, then exit.

    Args:
        dirpath: where to write `last.ckpt`; defaults to the directory of the ModelCheckpoint that
            keeps `last.ckpt` (`save_last`), else of the first ModelCheckpoint, else
            `<default_root_dir>/checkpoints`.
        filename: checkpoint file name (default `last.ckpt`, what `--ckpt_path last` finds when it
            sits in the ModelCheckpoint's directory).

    Attributes:
        hold_until_exit: after a complete fit, keep ignoring SIGTERM after `trainer.fit` returned
            (the CLI sets it: the process ends after the fit); False: pass it on to the handler from
            before the fit.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "last.ckpt") -> None:
        self.dirpath = dirpath
        self.filename = filename
        self.received: int | None = None
        self.saved_path: Path | None = None
        self._previous: dict[int, Any] = {}
        self._waiting_logged = False
        self._started = False  # the first optimizer step of this run has begun
        self._single_process = True
        self.finished = False  # the fit loop ended on its own: a signal no longer stops anything
        self.hold_until_exit = False
        self.trainer_ref: Callable[[], Trainer | None] = lambda: None

    def _install(self, trainer: Trainer) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(signum)
            if current != self._on_signal:
                self._previous.setdefault(signum, current)
                signal.signal(signum, self._on_signal)
        # a SIGTERM that Lightning's handler (installed just before the sanity check) caught
        originals = lightning_compat.signal_handlers_restored_at_teardown(trainer)
        for signum, handler in originals.items():
            # Lightning saved our handler (installed in `setup`) as "the original" and puts it back
            # at its teardown, after ours: give it the handler that was there before us instead
            if handler == self._on_signal and signum in self._previous:
                originals[signum] = self._previous[signum]
        if lightning_compat.take_lightning_sigterm(trainer):
            self.received = self.received or signal.SIGTERM

    def _uninstall(self, keep: tuple[int, ...] = ()) -> None:
        """Put back the handlers from before the fit, except those of the signals in `keep`."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in [s for s in self._previous if s not in keep]:
            handler = self._previous.pop(signum)
            if handler is not None:
                signal.signal(signum, handler)

    def release(self) -> None:
        """Put back every handler this callback replaced (after a complete fit it keeps SIGTERM's)."""
        self.finished = False
        self._uninstall()

    def _pass_on(self, signum, frame) -> None:
        """Put back the handlers from before the fit and let the one of `signum` handle it."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.release()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # the default action (SIGTERM: the process ends)

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.received = self.received or signum
        if self.finished:
            trainer = self.trainer_ref()
            if not self.hold_until_exit and (trainer is None or trainer.state.status == TrainerStatus.FINISHED):
                self._pass_on(signum, frame)  # the fit returned and the script goes on: not ours any more
                return
            log.warning("%s after the run's last step: the run is complete; it winds down (logs are written) and "
                        "exits with code 0", signal.Signals(signum).name)
            return
        if not self._started and self._single_process:
            # nothing trained yet and no other rank to agree with: stop now, not after a long set-up
            # step such as DPO's reference precompute
            raise self._before_first_step()
        log.warning("%s received: a checkpoint is written at the end of the current optimizer step, then the run "
                    "exits with code %d%s", signal.Signals(signum).name, self.exit_code,
                    " (Ctrl-C again to abort)" if signum == signal.SIGINT else "")

    @property
    def exit_code(self) -> int:
        """The process exit status of a run this callback stopped: 75 (SIGTERM) or 130 (SIGINT)."""
        return INTERRUPTED_EXIT_CODE if self.received == signal.SIGINT else PREEMPTED_EXIT_CODE


    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.received, self.saved_path, self._waiting_logged, self._started = None, None, False, False
            self.finished = False
            self.trainer_ref = weakref.ref(trainer)
            self._single_process = trainer.world_size == 1
            self._install(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.saved_path is not None:
            return
        # the loop ended on its own (a preemption save ends it with an exception): the run is complete
        self.finished = True
        if self.received is not None:
            log.warning("%s arrived after the run's last optimizer step: the run is complete and finishes (exit "
                        "code 0)", signal.Signals(self.received).name)
        if signal.SIGTERM in self._previous:  # Lightning's teardown, before `on_fit_end`, keeps our handler
            lightning_compat.signal_handlers_restored_at_teardown(trainer)[signal.SIGTERM] = self._on_signal

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # a complete run keeps SIGTERM's handler (the module's teardown and the loggers' final flush
        # come after this hook; `_on_signal` passes a signal on once the fit has returned)
        self._uninstall(keep=(signal.SIGTERM,) if self.finished else ())

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.finished and signal.SIGTERM in self._previous:  # Lightning's teardown follows: not ours
            lightning_compat.signal_handlers_restored_at_teardown(trainer)[signal.SIGTERM] = self._previous[signal.SIGTERM]
        self.release()

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)  # Lightning registered its SIGTERM handler just before this
        self._exit_if_signalled(trainer)

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._exit_if_signalled(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)
        self._exit_if_signalled(trainer)
        self._started = True
        self._prefer_newest_last(trainer)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not closes_optimizer_step(trainer):
            if self.received is not None and not self._waiting_logged:
                self._waiting_logged = True
                log.warning("signal received inside a gradient accumulation window: finishing the window first")
            return
        if self.saved_path is not None or not self._signalled(trainer):
            return
        self._save(trainer)
        log.warning(self.message(trainer))
        # Lightning ends the run at the end of this batch, once its metrics are logged, by raising
        # SIGTERMException (a SystemExit; `python main.py` exits with `exit_code`); validation due
        # after this batch is skipped (it changes nothing a checkpoint holds)
        lightning_compat.stop_after_this_batch(trainer)

    def _signalled(self, trainer: Trainer) -> bool:
        """Whether any rank received a signal (every rank calls this at the same points)."""
        flag = self.received is not None
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            tensor = torch.tensor([int(flag)], device=trainer.strategy.root_device)
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
            if bool(tensor.item()) and not flag:
                self.received = signal.SIGTERM
            flag = bool(tensor.item())
        return flag

    def _exit_if_signalled(self, trainer: Trainer) -> None:
        if self._signalled(trainer):
            raise self._before_first_step()

    def _before_first_step(self) -> Preempted:
        return Preempted(f"{signal.Signals(self.received).name} before the first optimizer step of this run: nothing "
                         f"new to save, exiting with code {self.exit_code}; rerun the same command (with --ckpt_path "
                         "last)", self.exit_code)

    def message(self, trainer: Trainer) -> str:
        """The line the run ends with after a preemption save."""
        return (f"preempted by {signal.Signals(self.received).name}: saved {self.saved_path} at global step "
                f"{trainer.global_step}; exiting with code {self.exit_code}: rerun the same command with "
                "--ckpt_path last")

    def checkpoint_path(self, trainer: Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath) / self.filename
        placed = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
        if placed:
            keeper = next((c for c in placed if c.save_last), placed[0])  # the one that keeps last.ckpt
            return Path(keeper.dirpath) / self.filename
        return Path(trainer.default_root_dir) / "checkpoints" / self.filename

    def _save(self, trainer: Trainer) -> None:
        path = self.checkpoint_path(trainer)
        # a ModelCheckpoint whose `last` file this is records it, so after the resume it keeps
        # writing that one file (not `last-v1.ckpt`)
        for callback, last in _last_keepers(trainer):
            if Path(last) == path:
                callback.last_model_path = str(path)
        trainer.save_checkpoint(path)  # written through a temporary file in the same directory: atomic
        self.saved_path = path

    @staticmethod
    def _prefer_newest_last(trainer: Trainer) -> None:
        """On a resumed run, a ModelCheckpoint that finds its `last.ckpt` already there (written by
        this callback or by a run it did not record) overwrites it instead of adding `last-v1.ckpt`,
        so `last.ckpt` is always the newest."""
        for callback, last in _last_keepers(trainer) if trainer.ckpt_path else ():
            if not callback.last_model_path and os.path.exists(last):
                callback.last_model_path = last


def _last_keepers(trainer: Trainer) -> list[tuple[ModelCheckpoint, str]]:
    """(callback, its `last.ckpt` path) of every ModelCheckpoint that keeps one."""
    return [(c, os.path.join(c.dirpath, f"{c.CHECKPOINT_NAME_LAST}{c.FILE_EXTENSION}"))
            for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.save_last and c.dirpath]


def holds_after_fit(handler: Any) -> bool:
    """Whether `handler` is the SIGTERM handler a `PreemptionCheckpoint` keeps after a complete fit."""
    owner = getattr(handler, "__self__", None)
    return isinstance(owner, PreemptionCheckpoint) and owner.finished


def closes_optimizer_step(trainer: Trainer) -> bool:
    """Whether the batch that just ended took an optimizer step (always, under manual
    optimisation: the online methods take theirs inside the batch), i.e. the state is at an
    optimizer-step boundary, with no half-accumulated gradient."""
    module = trainer.lightning_module
    if not module.automatic_optimization:
        return True
    return not lightning_compat.accumulating(trainer)
