"""`TrainingModule`: the plumbing every trained module shares (`PolicyModule`, the base of every
method, and `RewardModule` build on it); its class docstring lists what lives here, once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning import LightningModule
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities.enums import GradClipAlgorithmType
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lit_rlhf import checks, host_memory, resume, rng
from lit_rlhf.training import sharding
from lit_rlhf.training.guard import NonFiniteError, SkipStep, nonfinite_rows_message
from lit_rlhf.lightning_compat import logger_writes_this_step, replace_eval_mode_check, trust_checkpoint_instantiator
from lit_rlhf.training.in_backward import startup_problems
from lit_rlhf.training.memory import MOVED as MEMORY_MOVED
from lit_rlhf.training.memory import Memory
from lit_rlhf.training.optim import build_adamw
from lit_rlhf.training.settings import INSTANTIATOR, rebuilt_by_us
from lit_rlhf.training.step_logging import use_step_axis
from lit_rlhf.checkpoint_io import allow_hparam_globals, install_atomic_checkpoint_io
from lit_rlhf.types import padding_fraction
from lit_rlhf.stopping import stop_reason

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "lit_rlhf"
__all__ = ["CHECKPOINT_KEY", "NonFiniteError", "TrainingModule", "lr_lambda"]


def lr_lambda(name: str, warmup: int, total: int):
    """Multiplier of the peak learning rate at optimizer step `step`: linear warmup, then decay."""
    if name not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown lr_scheduler {name!r}; expected 'cosine', 'linear' or 'constant'")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if name == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 1.0 - progress if name == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class TrainingModule(LightningModule):
    """What every trainable module shares; `PolicyModule` (a causal LM policy) and `RewardModule`
    (a scalar reward model) build on it:

    - AdamW over `optimizer_param_groups()` with warmup and a cosine/linear/constant schedule
      (`configure_optimizers`, `lit_rlhf.training.optim.build_adamw`; in the backward pass with
      `optimizer_in_backward`, `lit_rlhf.training.in_backward`);
    - the non-finite guard (`check_finite`, `gradients_finite`, `on_nonfinite: error | skip`):
      nothing NaN/inf reaches the weights;
    - exact resume: every rank's random generators and the skipped-step counter in checkpoints
      (`lit_rlhf.rng`), an epoch cut short by a stop resumed mid-epoch (`lit_rlhf.resume`);
    - start-up checks (`lit_rlhf.checks`, against `batch_types`), atomic checkpoint files;
    - step logging under `{stage}/{group}/{name}` (`log_stats`) at the optimizer steps done
      (`lit_rlhf.training.step_logging`), tokens per second, the padding share of each batch;
    - `export_hf(export_dir)` at the end of fit (and `python -m lit_rlhf.export` from a checkpoint).

    A subclass records its settings (`lit_rlhf.training.settings.record_settings`), keeps the shared
    ones with `set_training_settings` and implements `optimizer_param_groups` and `export_hf`.
    """

    batch_types: ClassVar[tuple[type, ...]] = ()
    moved_options: ClassVar[dict[str, str]] = MEMORY_MOVED  # former arguments -> where they went
    # the shared settings a subclass gives `set_training_settings`; these defaults until it does
    on_nonfinite: str = "error"
    optimizer_in_backward: bool = False
    release_host_memory: str | None = None
    export_dir: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self._step_started_at: float | None = None
        self.skipped_steps = 0
        self._restored_rng: dict[str, Any] | None = None  # applied in on_train_start

    @property
    def attached_trainer(self) -> Any:
        """The Trainer this module is attached to, or None (`self.trainer` raises without one)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    def set_training_settings(self, *, lr: float, weight_decay: float, adam_eps: float,
                              adam_betas: tuple[float, float], warmup_steps: int, warmup_ratio: float,
                              lr_scheduler: str, export_dir: str | None, on_nonfinite: str,
                              memory: Memory | None) -> None:
        """Refuse impossible values of the settings every trained module shares, and keep them as
        the attributes read at run time (`lit_rlhf.training.settings`; `memory`'s under their
        own names: `self.gradient_checkpointing`, ...)."""
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if on_nonfinite not in ("error", "skip"):
            raise ValueError(f"on_nonfinite must be 'error' or 'skip', got {on_nonfinite!r}")
        self.lr, self.weight_decay, self.adam_eps, self.adam_betas = lr, weight_decay, adam_eps, tuple(adam_betas)
        self.warmup_steps, self.warmup_ratio, self.lr_scheduler = warmup_steps, warmup_ratio, lr_scheduler
        self.export_dir, self.on_nonfinite = export_dir, on_nonfinite
        for name, value in (memory or Memory()).settings().items():  # read at run time: self.gradient_checkpointing, ...
            setattr(self, name, value)

    # optimisation

    def optimizer_param_groups(self) -> list[dict[str, Any]]:
        """Parameter groups for AdamW (see `decay_groups`)."""
        raise NotImplementedError

    def num_training_steps(self) -> int:
        """Total optimizer steps of the fit (override for methods measured in episodes)."""
        steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(steps) or steps <= 0:
            raise ValueError("cannot schedule the learning rate: set trainer.max_steps or trainer.max_epochs")
        return int(steps)

    def num_schedule_steps(self) -> int:
        """Length of the learning-rate schedule in scheduler steps (one per optimizer step here;
        online methods may step it once per rollout)."""
        return self.num_training_steps()

    def configure_optimizers(self):
        """AdamW over `optimizer_param_groups()` (`build_adamw`; attached to the backward pass with
        `optimizer_in_backward`), then a `LambdaLR` of `lr_lambda` over `num_schedule_steps()`,
        warmup `warmup_steps` or `warmup_ratio` of them."""
        trainer = self.attached_trainer
        clips = bool(getattr(trainer, "gradient_clip_val", None)) or bool(getattr(self, "max_grad_norm", None))
        optimizer = build_adamw(self.optimizer_param_groups(), trainer, clips=clips, in_backward=self.optimizer_in_backward,
                                lr=self.lr, eps=self.adam_eps, betas=tuple(self.adam_betas), weight_decay=self.weight_decay)
        if self.optimizer_in_backward:  # each parameter updated by its backward pass (the hooks of a former fit go)
            if getattr(self, "_in_backward_optimizer", None) is not None:
                self._in_backward_optimizer.detach()
            names = {id(param): name for name, param in self.named_parameters(remove_duplicate=False)}
            optimizer.attach(names, self.gradient_factor, lambda message: NonFiniteError(
                f"{message} at global step {self.global_step} (epoch {self.current_epoch}), caught before its update "
                "(optimizer_in_backward)"))
            self._in_backward_optimizer = optimizer
        total = self.num_schedule_steps()
        warmup = self.warmup_steps or int(self.warmup_ratio * total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_lambda(self.lr_scheduler, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def gradient_factor(self) -> float | None:
        """A number every gradient of this optimizer step is multiplied by before the update
        (None: used as they are). With `optimizer_in_backward` the update hooks apply it, read
        once per step at the first completed gradient, i.e. after `training_step` returned."""
        return None

    def teardown(self, stage: str) -> None:
        """After a fit: the in-backward hooks go (a later backward pass only computes gradients)."""
        super().teardown(stage)
        optimizer = getattr(self, "_in_backward_optimizer", None)
        if optimizer is not None and stage == "fit":
            optimizer.detach()
            self._in_backward_optimizer = None
        for handle in getattr(self, "_layer_release_hooks", ()):
            handle.remove()
        self._layer_release_hooks = []

    def clip_gradients(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's `clip_gradients`, also for the fused AdamW under bf16 mixed precision: its
        plugin refuses an optimizer that unscales inside its step, which matters only when a
        GradScaler scales (fp16, where `build_adamw` builds the non-fused AdamW)."""
        trainer, plugin = self.trainer, self.trainer.precision_plugin
        if not isinstance(plugin, MixedPrecision) or plugin.scaler is not None:
            return super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        value = (trainer.gradient_clip_val or 0.0) if gradient_clip_val is None else gradient_clip_val
        algorithm = GradClipAlgorithmType(gradient_clip_algorithm or trainer.gradient_clip_algorithm or "norm")
        Precision.clip_gradients(plugin, optimizer, value, algorithm)

    # non-finite guard: nothing non-finite reaches the weights

    def check_finite(self, batch: Any = None, **tensors: Tensor | None) -> bool:
        """True when every given tensor is finite. Otherwise raise `NonFiniteError` (`error`) or
        count a skipped step and return False (`skip`); the caller then skips its update.

        Per-example tensors (first dimension = batch rows) report which rows are bad, with the
        dataset row ids of `batch.meta["index"]` when the batch carries them."""
        for name, tensor in tensors.items():
            if tensor is not None and not bool(torch.isfinite(tensor).all()):
                where = f"global step {self.global_step} (epoch {self.current_epoch})"
                self.nonfinite(nonfinite_rows_message(name, tensor, batch, where))
                return False
        return True

    def gradients_finite(self) -> bool:
        """Check every gradient; same behaviour as `check_finite` (error or counted skip).

        Under fp16 mixed precision the GradScaler owns this: scaled gradients overflow by design
        and it skips those steps itself (lowering the scale), so nothing is checked here."""
        if self.attached_trainer is not None and getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return True
        named = [(n, p.grad) for n, p in self.named_parameters() if p.grad is not None]
        # a NaN/inf anywhere makes the sum non-finite: one host sync, no mask allocated, when all are finite
        if not named or bool(torch.isfinite(torch.stack([g.sum(dtype=torch.float32) for _, g in named])).all()):
            return True
        bad = [n for n, g in named if not bool(torch.isfinite(g).all())]
        more = " ..." if len(bad) > 5 else ""
        self.nonfinite(f"non-finite gradient at global step {self.global_step} in {bad[:5]}{more}")
        return False

    def nonfinite(self, message: str) -> None:
        """Raise `NonFiniteError` (`on_nonfinite: error`) or count and log a skipped step (`skip`)."""
        if self.on_nonfinite == "error":
            raise NonFiniteError(message + ". Set on_nonfinite: skip to skip such steps instead.")
        self.skipped_steps += 1
        log.warning("skipping the optimizer step: %s (%d skipped so far)", message, self.skipped_steps)
        if self.attached_trainer is not None:
            self.log("train/guard/skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Automatic optimisation: step only when the gradients are finite (see `on_nonfinite`)."""

        def guarded_closure():
            loss = optimizer_closure()
            if not self.gradients_finite():
                optimizer.zero_grad()
                raise SkipStep
            return loss

        with contextlib.suppress(SkipStep):
            optimizer.step(closure=guarded_closure)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Lightning's `load_from_checkpoint`, with `rebuild_module` (the instantiator our
        checkpoints name, `lit_rlhf.training.settings`) trusted first: done here, where a checkpoint
        is loaded, rather than when a module is imported."""
        trust_checkpoint_instantiator(INSTANTIATOR)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = int(checkpoint.get(CHECKPOINT_KEY, {}).get("skipped_steps", 0))
        self._restored_rng = rng.pending_state(checkpoint, self.attached_trainer)
        self._resumed_from_step = checkpoint.get("global_step")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        cls = type(self)
        checkpoint[CHECKPOINT_KEY] = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "skipped_steps": self.skipped_steps}
        rebuilt_by_us(checkpoint)  # rebuilt with the settings a subclass pins left out (lit_rlhf.training.settings)
        rng.save_states(checkpoint, self.attached_trainer)  # every rank's generators (exact resume)
        if self.attached_trainer is not None:  # an epoch cut short by a stop resumes mid-epoch (lit_rlhf.resume)
            resume.as_mid_epoch(self.trainer, checkpoint, getattr(self, "_epoch_counters_at_batch", None))

    # start-up: checks, atomic checkpoints, restored random state

    def setup(self, stage: str) -> None:
        """Before fitting: refuse a configuration that cannot work (`lit_rlhf.checks`) and make
        checkpoint files atomic (`lit_rlhf.checkpoint_io`)."""
        if self.attached_trainer is not None:
            use_step_axis(self.trainer)  # every scalar at the optimizer steps done (lit_rlhf.training.step_logging)
        if stage == "fit" and self.attached_trainer is not None:
            checks.startup_checks(self.trainer, self)
            install_atomic_checkpoint_io(self.trainer)
            allow_hparam_globals(self.hparams)  # resume from our own checkpoints with weights_only loading

    def configure_model(self) -> None:
        """Under Lightning's `ModelParallelStrategy`: FSDP2 on every model of this module
        (`lit_rlhf.training.sharding`); nothing under any other strategy."""
        sharding.shard_module(self)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """The start-up problems of this module's own settings, one message each (`lit_rlhf.checks`
        raises them with the others). Here: `optimizer_in_backward` against what needs all
        gradients at once (`lit_rlhf.training.in_backward.startup_problems`); a subclass adds its
        own to `super().check_config(...)`."""
        return startup_problems(trainer, self, datamodule)

    def on_fit_start(self) -> None:
        """Put the trained models in train mode (a `from_pretrained` model arrives in eval mode,
        where Hugging Face layers skip gradient checkpointing); frozen models stay in eval mode
        (D7), so Lightning's mode check is replaced by `warn_trained_in_eval_mode`."""
        self.train()
        self.attach_layer_releases()
        replace_eval_mode_check(self.trainer, self.warn_trained_in_eval_mode)

    def warn_trained_in_eval_mode(self) -> None:
        """Warn (rank 0), naming them, of the submodules in eval mode at the start of training
        other than the frozen models."""
        frozen = set(getattr(self, "_frozen_names", ()))
        stray = [name for name, m in self.named_modules() if not m.training and name.split(".")[0] not in frozen]
        if stray:
            rank_zero_warn(f"{len(stray)} trained module(s) in eval mode at the start of training: "
                           f"{', '.join(stray[:5])}{', ...' if len(stray) > 5 else ''}")

    def on_train_start(self) -> None:
        """Resume the random generators where the checkpoint left them, after everything that
        may draw differently in a resumed run (set-up, sanity check, dataloader creation)."""
        if self._restored_rng is not None:
            rng.restore_state(self._restored_rng)
            self._restored_rng = None
        trainer = self.attached_trainer
        if trainer is not None:
            resume.start_next_epoch_afresh(trainer)  # resumed after an epoch's last batch

    # logging

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_started_at = time.perf_counter()
        self.free_stale_gradients(batch_idx)
        waste = padding_fraction(batch) if self.step_stats_due() else None  # share of PAD slots
        if waste is not None:
            self.log("train/data/padding_fraction", waste, on_step=True, on_epoch=False)

    def free_stale_gradients(self, batch_idx: int) -> None:
        """Drop the previous optimizer step's gradients before this step's forward pass (where a
        step with gradient checkpointing peaks), at the batches where Lightning's automatic
        optimisation would zero them only after `training_step`; the step computes the same.
        Manual optimisation (`OnlineModule`) frees them after each optimizer step itself."""
        if self.automatic_optimization and batch_idx % self.trainer.accumulate_grad_batches == 0:
            for param in self.parameters():
                param.grad = None

    def on_before_backward(self, loss: Tensor) -> None:
        self.release_freed_host_memory()  # the forward pass's freed blocks, before the backward pass's own

    def release_freed_host_memory(self) -> None:
        """With `release_host_memory` set, on CPU: hand the heap the C library keeps after `free`
        back to the system (`lit_rlhf.host_memory`) between phases; changes no value."""
        if self.release_host_memory and self.device.type == "cpu":
            host_memory.release_freed_memory()

    def attach_layer_releases(self) -> None:
        """`release_host_memory: layers`: release before each decoder layer that runs with
        gradients too (`lit_rlhf.host_memory.release_before_layers`), so what one layer freed is
        not kept through the next. Warns where nothing can be released."""
        mode = self.release_host_memory
        if mode and not host_memory.available():
            rank_zero_warn(f"release_host_memory: {mode} has no effect here: this C library has no malloc_trim "
                           "(it needs glibc on Linux)")
        elif mode == "layers" and self.device.type == "cpu" and not getattr(self, "_layer_release_hooks", None):
            self._layer_release_hooks = host_memory.release_before_layers(self)
            if not self._layer_release_hooks:
                rank_zero_warn("release_host_memory: layers found no decoder layers (transformers' "
                               "GradientCheckpointingLayer) in this module's models: releasing between phases only")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.release_freed_host_memory()
        progress = self.trainer.fit_loop.epoch_progress.current  # a cut-short epoch's checkpoint (`lit_rlhf.resume`)
        self._epoch_counters_at_batch = (progress.processed, progress.completed)
        mask = getattr(batch, "attention_mask", None)
        if self._step_started_at is not None and mask is not None and self.step_stats_due():  # offline steps are timed
            elapsed = time.perf_counter() - self._step_started_at
            self.log("train/perf/tokens_per_sec", float(mask.sum()) / max(elapsed, 1e-9), on_step=True, on_epoch=False)

    def step_stats_due(self) -> bool:
        """Whether this step's stats reach the logger (every `log_every_n_steps`; every step under
        `fast_dev_run`). Each `self.log` costs ~0.3 ms on CPU, so other steps log only the
        progress-bar stats (`log_stats`), as Lightning's `LearningRateMonitor` does."""
        trainer = self.attached_trainer
        return trainer is None or bool(trainer.fast_dev_run) or logger_writes_this_step(trainer)

    def log_stats(self, stage: str, stats: dict[str, Tensor | float], prog_bar: tuple[str, ...] = (), **kwargs) -> None:
        """Log `{stage}/{name}` for every entry (names already carry their group: `rewards/margins`).
        Training stats are per step, and only the progress-bar ones when `step_stats_due` is not."""
        on_step = stage == "train"
        if on_step and not self.step_stats_due():
            shown = self.trainer.progress_bar_callback is not None
            stats = {name: value for name, value in stats.items() if shown and name in prog_bar}
        for name, value in stats.items():
            if isinstance(value, Tensor):
                value = value.detach().float()
            self.log(f"{stage}/{name}", value, prog_bar=name in prog_bar, on_step=on_step, on_epoch=not on_step,
                     sync_dist=not on_step, **kwargs)

    # export

    def export_hf(self, directory: str | Path) -> Path:
        """Write the trained model in Hugging Face format; returns `directory`."""
        raise NotImplementedError

    def on_fit_end(self) -> None:
        if self.attached_trainer is not None and self.trainer.is_global_zero:  # one line: why the run stopped
            log.warning("run stopped: %s", stop_reason(self.trainer, self, getattr(self, "_resumed_from_step", None)))
        export_dir = self.export_dir
        if export_dir and sharding.is_sharded(self):  # every rank gathers, rank 0 writes
            sharding.export_sharded(self, export_dir)
        elif export_dir and self.trainer.is_global_zero:
            self.export_hf(export_dir)
