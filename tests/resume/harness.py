"""In-process interrupted runs: a straight fit, the same fit stopped at a chosen moment, resumed.

`Interrupt` sends SIGTERM to this process at the n-th call of a chosen hook (deterministic: the
handler runs as `os.kill` returns), or raises `Killed` there, the in-process stand-in for SIGKILL:
no handler runs and nothing is written on the way out (only the checkpoints already on disk
count). `interrupted_then_resumed` runs a fit with an interruption, then resumes from
`last.ckpt` (or starts afresh when there is none, as a rerun would) until a run finishes, and
`assert_same_run` compares it with the straight run: every tensor and number of the final
checkpoint, and every logged train scalar of every batch.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks import KLControlCallback, PreemptionCheckpoint
from tests.resume.test_resume import CASES, IGNORED


class Killed(BaseException):
    """SIGKILL, in process: nothing handles it, nothing is saved on the way out."""


class Interrupt(Callback):
    """At the `n`-th call of `hook` (counting the calls where `when(trainer)` holds), send `sig`
    to this process, or raise `Killed` when `sig` is None."""

    def __init__(self, hook: str, n: int = 1, sig: int | None = signal.SIGTERM,
                 when: Callable[[Any], bool] | None = None) -> None:
        self.hook, self.n, self.sig, self.when, self.calls = hook, n, sig, when, 0
        self.fired_at_step: int | None = None

    def _hit(self, trainer) -> None:
        if self.when is not None and not self.when(trainer):
            return
        self.calls += 1
        if self.calls != self.n:
            return
        self.fired_at_step = trainer.global_step
        if self.sig is None:
            raise Killed(f"killed at {self.hook} #{self.n}")
        os.kill(os.getpid(), self.sig)

    def setup(self, trainer, pl_module, stage):
        if self.hook == "setup":
            self._hit(trainer)

    def on_fit_start(self, trainer, pl_module):
        if self.hook == "on_fit_start":
            self._hit(trainer)

    def on_validation_batch_end(self, trainer, *args, **kwargs):
        if self.hook == "on_validation_batch_end":
            self._hit(trainer)

    def on_validation_end(self, trainer, pl_module):
        if self.hook == "on_validation_end":
            self._hit(trainer)

    def on_train_batch_end(self, trainer, *args, **kwargs):
        if self.hook == "on_train_batch_end":
            self._hit(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.hook == "on_train_epoch_end":
            self._hit(trainer)

    def on_after_backward(self, trainer, pl_module):
        if self.hook == "on_after_backward":
            self._hit(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.hook == "on_save_checkpoint":
            self._hit(trainer)

    def on_rollout_scores(self, trainer, pl_module, rollout):  # online methods: after generation
        if self.hook == "on_rollout_scores":
            self._hit(trainer)
        return rollout


class Recorder(Callback):
    """Every logged train scalar of every batch (1-based batch number over the whole fit)."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.metrics[trainer.fit_loop.total_batch_idx + 1] = {
            k: float(v) for k, v in trainer.callback_metrics.items()
            if k.startswith("train/") and not any(x in k for x in IGNORED)
        }


@dataclass
class Run:
    module: Any
    trainer: Any
    recorder: Recorder
    exit_code: int | None = None  # SystemExit code (75 = preempted), None when the fit returned
    killed: bool = False


@dataclass
class Setup:
    """One configuration: the method (a key of `CASES`) and what differs from test_resume's."""

    name: str
    max_steps: int | None = None  # default: 4 batches' worth of optimizer steps
    accumulate: int = 1
    val_every: int | None = None  # val_check_interval in batches (validation inside training)
    sanity: int = 0  # num_sanity_val_steps
    every_n_train_steps: int = 1  # the periodic ModelCheckpoint (what SIGKILL leaves behind)
    save_on_train_epoch_end: bool | None = None
    module_args: dict[str, Any] = field(default_factory=dict)
    dm_args: dict[str, Any] = field(default_factory=dict)
    trainer_args: dict[str, Any] = field(default_factory=dict)
    model: str = "tiny-random-llama"  # a name or a saved model's directory (its tokenizer with it)


def fit(setup: Setup, root: Path, interrupt: Callback | None = None, ckpt_path: str | None = None,
        extra_callbacks: tuple[Callback, ...] = ()) -> Run:
    module_cls, module_args, steps_per_batch, dm_cls, dm_args = CASES[setup.name]
    L.seed_everything(0)
    module = module_cls(model=setup.model, **{**module_args, **setup.module_args})
    with_val = bool(setup.val_every or setup.sanity)
    dm = dm_cls(tokenizer=setup.model, val_split="validation" if with_val else None, test_split=None,
                **{**dm_args, **setup.dm_args})
    recorder = Recorder()
    callbacks: list[Callback] = []
    if setup.name in ("ppo", "grpo"):
        callbacks.append(KLControlCallback(target=1.0, horizon=10, clip=0.2))
    callbacks += [recorder, PreemptionCheckpoint()]
    if interrupt is not None:
        callbacks.append(interrupt)
    callbacks += list(extra_callbacks)
    callbacks.append(ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, save_top_k=0,
                                     every_n_train_steps=setup.every_n_train_steps,
                                     save_on_train_epoch_end=setup.save_on_train_epoch_end))
    max_steps = setup.max_steps or 4 * steps_per_batch
    trainer_args = dict(
        max_steps=max_steps, accelerator="cpu", precision=32, logger=False, callbacks=callbacks,
        default_root_dir=root, enable_progress_bar=False, enable_model_summary=False, deterministic=True,
        log_every_n_steps=1, accumulate_grad_batches=setup.accumulate, num_sanity_val_steps=setup.sanity,
        limit_val_batches=1 if with_val else 0, val_check_interval=setup.val_every,
        check_val_every_n_epoch=None if setup.val_every else 1,
    )
    trainer = L.Trainer(**{**trainer_args, **setup.trainer_args})
    run = Run(module, trainer, recorder)
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    except Killed:
        run.killed = True
    except SystemExit as exit_:
        run.exit_code = 75 if exit_.code is None else exit_.code  # Lightning's SIGTERMException: the CLI's 75
    return run


def interrupted_then_resumed(setup: Setup, root: Path, *interrupts: Callback) -> tuple[list[Run], Run]:
    """Fit with each interrupt in turn (each a rerun of the same command with `--ckpt_path last`),
    then once more without; returns the interrupted runs and the final one."""
    runs = []
    last = root / "checkpoints" / "last.ckpt"
    for interrupt in interrupts:
        run = fit(setup, root, interrupt, str(last) if last.exists() else None)
        assert run.killed or run.exit_code is not None, f"{interrupt.hook} #{interrupt.n} did not stop the run"
        runs.append(run)
    final = fit(setup, root, None, str(last) if last.exists() else None)
    assert final.exit_code is None and not final.killed
    return runs, final


def checkpoint_values(path: Path) -> dict[str, Any]:
    """Every tensor and number of a checkpoint, by key path (file names and loop bookkeeping aside)."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    out: dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}/{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}/{i}")
        elif isinstance(value, (torch.Tensor, int, float, bool)) and not isinstance(value, str):
            out[key] = value

    for k in ("state_dict", "optimizer_states", "lr_schedulers", "lit_rlhf", "rng_states", "global_step", "epoch"):
        walk(saved.get(k), k)
    for k, v in saved.get("callbacks", {}).items():
        if not k.startswith(("ModelCheckpoint", "PreemptionCheckpoint")):
            walk(v, f"callbacks/{k}")
    return out


def assert_same_run(straight: Run, runs: list[Run], final: Run, straight_root: Path, root: Path) -> None:
    """The interrupted-and-resumed run is the straight run: final checkpoint and logged scalars."""
    assert final.trainer.global_step == straight.trainer.global_step
    a, b = checkpoint_values(straight_root / "checkpoints" / "last.ckpt"), checkpoint_values(root / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:10]
    different = [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    assert not different, f"final checkpoints differ: {different[:8]}"
    # the final weights in memory too
    sa, sb = straight.module.state_dict(), final.module.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # every logged train scalar of every batch: the batches of each interrupted run up to its
    # checkpoint, then the resumed run's (a later run re-logs the batches an earlier one lost)
    merged: dict[int, dict[str, float]] = {}
    for run in [*runs, final]:
        merged.update(run.recorder.metrics)
    assert sorted(merged) == sorted(straight.recorder.metrics), (sorted(merged), sorted(straight.recorder.metrics))
    for batch, metrics in straight.recorder.metrics.items():
        assert metrics, f"nothing logged at batch {batch}"
        assert merged[batch] == metrics, f"batch {batch} differs: {merged[batch]} != {metrics}"
    assert not list((root / "checkpoints").glob("last-v*.ckpt")), "a second last checkpoint: last.ckpt must be the newest"
    assert not list((root / "checkpoints").glob(".*.tmp")), "a temporary file was left behind"


_STRAIGHT: dict[tuple, tuple[Run, Path]] = {}


def straight_run(setup: Setup, tmp_path_factory) -> tuple[Run, Path]:
    """The straight run of `setup`, once per test session."""
    key = repr(setup)
    if key not in _STRAIGHT:
        root = tmp_path_factory.mktemp("straight")
        run = fit(setup, root)
        assert run.exit_code is None and not run.killed
        _STRAIGHT[key] = (run, root)
    return _STRAIGHT[key]
