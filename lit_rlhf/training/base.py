"""Shared plumbing of every trained module: optimiser, non-finite guard, exact resume, start-up
checks, step logging, export at fit end.

`TrainingModule` is the base of `PolicyModule` (`lit_rlhf.modules.policy`: the policy, frozen
models and log-probs every method shares) and of `RewardModule`. What lives here exists once:

- AdamW with warmup and a cosine/linear/constant schedule (`configure_optimizers`, built by
  `lit_rlhf.training.optim`, overridable through `optimizer_param_groups`), stepped inside the
  backward pass with `optimizer_in_backward` (`lit_rlhf.training.in_backward`);
- the non-finite guard: `check_finite` on losses and rewards, every gradient before the step
  (`on_nonfinite: error | skip`; `lit_rlhf.training.guard`);
- metric logging under `{stage}/{group}/{name}`, tokens per second, every scalar at the optimizer
  steps done (`lit_rlhf.training.step_logging`: one step axis for training and validation);
- export in Hugging Face format (`export_hf`), at the end of fit when `export_dir` is set, and
  from any checkpoint with `python -m lit_rlhf.export`;
- exact resume: checkpoints carry the random generator states of every rank (`lit_rlhf.rng`),
  restored when training starts, next to the counters the subclasses add; the train data
  position is the DataModule's (`lit_rlhf.data.base.ResumableSampler`); checkpoint files are
  written atomically (`lit_rlhf.checkpoint_io`);
- start-up checks in `setup("fit")` (`lit_rlhf.checks`): a configuration that cannot work fails
  before the first step, with every problem listed. A subclass declares the batch classes it
  trains on in `batch_types`.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, ClassVar

from lightning import LightningModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lit_rlhf import checks, host_memory, models, resume, rng
from lit_rlhf.training import guard, sharding
from lit_rlhf.training.guard import NonFiniteError  # noqa: F401  (imported from here)
from lit_rlhf.lightning_compat import attached_trainer, replace_eval_mode_check, trust_checkpoint_instantiator
from lit_rlhf.training.in_backward import startup_problems
from lit_rlhf.training.memory import MOVED as MEMORY_MOVED
from lit_rlhf.training.memory import Memory
from lit_rlhf.training.optim import clip_unscaled, configure_optimizers
from lit_rlhf.training.settings import INSTANTIATOR, rebuilt_by_us
from lit_rlhf.training.step_logging import StepLoggingMixin, stats_to_log, step_stats_due, use_step_axis  # noqa: F401
from lit_rlhf.checkpoint_io import allow_hparam_globals, install_atomic_checkpoint_io
from lit_rlhf.types import padding_fraction
from lit_rlhf.stopping import stop_reason

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "lit_rlhf"


class TrainingModule(StepLoggingMixin, LightningModule):
    """What every trainable module shares; `PolicyModule` (a causal LM policy) and `RewardModule`
    (a scalar reward model) build on it.

    - AdamW over `optimizer_param_groups()` with warmup and a cosine/linear/constant schedule
      (`configure_optimizers`; fused, or DeepSpeed's CPU Adam under ZeRO offload; stepped inside
      the backward pass with the `optimizer_in_backward` hparam);
    - the non-finite guard: `check_finite` on losses and rewards, every gradient before the
      optimizer step, `on_nonfinite: error | skip` (hparam, default `error`);
    - exact resume: the random generators of every rank in checkpoints, restored when training
      starts, and the skipped-step counter;
    - start-up checks in `setup("fit")` (`lit_rlhf.checks`, against `batch_types`) and atomic
      checkpoint files;
    - step logging under `{stage}/{group}/{name}` (`log_stats`), tokens per second, the
      padding share of each training batch (`train/data/padding_fraction`), every scalar
      written at the optimizer steps done (`lit_rlhf.training.step_logging`);
    - `export_hf(export_dir)` at the end of fit when the `export_dir` hparam is set.

    A subclass records its settings (`lit_rlhf.training.settings.record_settings`), keeps the shared
    ones with `set_training_settings` (read at run time as attributes: `self.lr`, ...) and
    implements `optimizer_param_groups` and `export_hf`.
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
        (Memory() if memory is None else memory).apply_to(self)

    # ----------------------------------------------------------------------------------------
    # optimisation
    # ----------------------------------------------------------------------------------------

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
        """AdamW and its schedule (`lit_rlhf.training.optim.configure_optimizers`)."""
        return configure_optimizers(self)

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
        """Lightning's `clip_gradients`, also for the fused AdamW under bf16 mixed precision
        (`lit_rlhf.training.optim.clip_unscaled`)."""
        if not clip_unscaled(self.trainer, optimizer, gradient_clip_val, gradient_clip_algorithm):
            super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # ----------------------------------------------------------------------------------------
    # non-finite guard: nothing non-finite reaches the weights
    # ----------------------------------------------------------------------------------------

    def check_finite(self, batch: Any = None, **tensors: Tensor | None) -> bool:
        """True when every given tensor is finite. Otherwise raise `NonFiniteError` (`error`) or
        count a skipped step and return False (`skip`); the caller then skips its update.

        Per-example tensors (first dimension = batch rows) report which rows are bad, with the
        dataset row ids of `batch.meta["index"]` when the batch carries them
        (`lit_rlhf.training.guard.check_finite`)."""
        return guard.check_finite(self, batch, tensors)

    def gradients_finite(self) -> bool:
        """Check every gradient; same behaviour as `check_finite` (error or counted skip).

        Under fp16 mixed precision the GradScaler owns this: scaled gradients overflow by design
        and it skips those steps itself (lowering the scale), so nothing is checked here."""
        return guard.gradients_finite(self)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Automatic optimisation: step only when the gradients are finite (see `on_nonfinite`;
        `lit_rlhf.training.guard.guarded_step`)."""
        guard.guarded_step(self, optimizer, optimizer_closure)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Lightning's `load_from_checkpoint`, with `rebuild_module` (the instantiator our
        checkpoints name, `lit_rlhf.training.settings`) trusted first: done here, where a checkpoint
        is loaded, rather than when a module is imported."""
        trust_checkpoint_instantiator(INSTANTIATOR)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = int(checkpoint.get(CHECKPOINT_KEY, {}).get("skipped_steps", 0))
        self._restored_rng = rng.pending_state(checkpoint, attached_trainer(self))
        self._resumed_from_step = checkpoint.get("global_step")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        cls = type(self)
        checkpoint[CHECKPOINT_KEY] = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "skipped_steps": self.skipped_steps}
        rebuilt_by_us(checkpoint)  # rebuilt with the settings a subclass pins left out (lit_rlhf.training.settings)
        rng.save_states(checkpoint, attached_trainer(self))  # every rank's generators (exact resume)
        if attached_trainer(self) is not None:  # an epoch cut short by a stop resumes mid-epoch (lit_rlhf.resume)
            resume.as_mid_epoch(self.trainer, checkpoint, getattr(self, "_epoch_counters_at_batch", None))

    # ----------------------------------------------------------------------------------------
    # start-up: checks, atomic checkpoints, restored random state
    # ----------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        """Before fitting: refuse a configuration that cannot work (`lit_rlhf.checks`) and make
        checkpoint files atomic (`lit_rlhf.checkpoint_io`)."""
        if attached_trainer(self) is not None:
            use_step_axis(self.trainer)  # every scalar at the optimizer steps done (lit_rlhf.training.step_logging)
        if stage == "fit" and attached_trainer(self) is not None:
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
        """Put the trained models in train mode before the fit loop starts; frozen models stay
        in eval mode (`PolicyModule.train`, D7).

        A model loaded with `from_pretrained` arrives in eval mode and Lightning's fit does not
        switch it; left so, gradient checkpointing (which Hugging Face layers apply only in train
        mode) would silently stay off. The fit loop then checks the modes before `on_train_start`
        and would warn of every module in eval mode, the frozen models included: its check is
        replaced by `warn_trained_in_eval_mode`, which leaves the frozen models out."""
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
        trainer = attached_trainer(self)
        if trainer is not None:
            resume.start_next_epoch_afresh(trainer)  # resumed after an epoch's last batch

    # ----------------------------------------------------------------------------------------
    # logging
    # ----------------------------------------------------------------------------------------

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_started_at = time.perf_counter()
        self.free_stale_gradients(batch_idx)
        waste = padding_fraction(batch) if step_stats_due(attached_trainer(self)) else None  # share of PAD slots
        if waste is not None:
            self.log("train/data/padding_fraction", waste, on_step=True, on_epoch=False)

    def free_stale_gradients(self, batch_idx: int) -> None:
        """Drop the previous optimizer step's gradients before this step's forward pass.

        Lightning's automatic optimisation sets them to None only after `training_step`, right
        before the backward pass, so a full copy of the trained weights' size would stay in memory
        through the forward pass, where a step with gradient checkpointing peaks. Dropped here at
        the batches where Lightning zeroes them (the first of each gradient-accumulation window);
        nothing reads them in between, so the step computes the same. Manual optimisation
        (`OnlineModule`) frees them right after each optimizer step itself."""
        trainer = attached_trainer(self)
        if trainer is None or not self.automatic_optimization or batch_idx % trainer.accumulate_grad_batches:
            return
        for param in self.parameters():
            param.grad = None

    def on_before_backward(self, loss: Tensor) -> None:
        self.release_freed_host_memory()  # the forward pass's freed blocks, before the backward pass's own

    def release_freed_host_memory(self) -> None:
        """`release_host_memory`: the heap freed by the last phase back to the system (CPU only;
        changes no value): `lit_rlhf.host_memory.release_between_phases`."""
        host_memory.release_between_phases(self)

    def attach_layer_releases(self) -> None:
        """`release_host_memory: layers`: release before each decoder layer too
        (`lit_rlhf.host_memory.attach_layer_releases`)."""
        host_memory.attach_layer_releases(self)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.release_freed_host_memory()
        trainer = attached_trainer(self)
        if trainer is not None:
            self._epoch_counters_at_batch = resume.epoch_counters(trainer)  # for a checkpoint after a cut-short epoch
        if not step_stats_due(trainer):
            return
        mask = getattr(batch, "attention_mask", None)
        if self._step_started_at is None or mask is None:
            return
        elapsed = time.perf_counter() - self._step_started_at
        self.log("train/perf/tokens_per_sec", float(mask.sum()) / max(elapsed, 1e-9), on_step=True, on_epoch=False)

    # ----------------------------------------------------------------------------------------
    # export
    # ----------------------------------------------------------------------------------------

    def export_hf(self, directory: str | Path) -> Path:
        """Write the trained model in Hugging Face format; returns `directory`."""
        raise NotImplementedError

    def on_fit_end(self) -> None:
        if attached_trainer(self) is not None and self.trainer.is_global_zero:  # one line: why the run stopped
            log.warning("run stopped: %s", stop_reason(self.trainer, self, getattr(self, "_resumed_from_step", None)))
        export_dir = self.export_dir
        if export_dir and sharding.is_sharded(self):  # every rank gathers, rank 0 writes
            sharding.export_sharded(self, export_dir)
        elif export_dir and self.trainer.is_global_zero:
            self.export_hf(export_dir)
