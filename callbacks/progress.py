"""A progress bar that fits the terminal (80 columns included) and counts what a run counts.

`CompactProgressBar` is Lightning's tqdm bar with:

- short metric names: the stage and group are dropped (`train/objective/kl` -> `kl`,
  `val/rewards/accuracies` -> `val_acc`), no `v_num`, values to 3 significant digits, and the
  line trimmed to the terminal width instead of wrapping;
- for online methods (PPO, GRPO: modules with `rollouts` and `episodes_per_rollout`) one bar
  over the whole run counting rollouts to the true total (`total_episodes` / episodes per
  rollout, or `trainer.max_steps` / updates per rollout), instead of "Epoch 0/-2" with the
  length of the prompt loader;
- for the other methods "epoch e/E" (1-based) over the batches of the epoch;
- a run resumed inside an epoch (`--ckpt_path last` after a preemption) gets its total and ETA
  too: Lightning skips `on_train_epoch_start` then, so the bar is set up in `on_train_start`,
  starting at the batches already trained, and the rate counts only this run's batches;
- at the end of fit, one line per validated metric: its first and last validated value
  (`val_loss 1.21 -> 1.02`), so a run prints its result.

`main.py` adds it when the config names no progress bar (`callbacks.default_callbacks`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar

from lit_rlhf.lightning_compat import progress_bar_due

log = logging.getLogger(__name__)

ABBREVIATIONS = {"accuracies": "acc", "accuracy": "acc", "scores": "score", "margins": "margin"}
# validated metrics worth a line in the summary, by their last name component
SUMMARY_NAMES = ("loss", "accuracy", "accuracies", "margins", "scores", "kl", "eos_fraction", "win_rate")


def short_name(name: str) -> str:
    """`train/objective/kl` -> `kl`, `val/rewards/accuracies` -> `val_acc`, `val/loss` -> `val_loss`."""
    parts = name.split("/")
    stage = parts[0] if len(parts) > 1 and parts[0] in ("train", "val", "test") else None
    last = parts[-1]
    for suffix in ("_step", "_epoch"):
        if last.endswith(suffix):
            last = last[: -len(suffix)]
    last = ABBREVIATIONS.get(last, last)
    return f"{stage}_{last}" if stage in ("val", "test") else last


def format_value(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.3g}"


def is_online(pl_module: Any) -> bool:
    return hasattr(pl_module, "rollouts") and hasattr(pl_module, "episodes_per_rollout")


def total_rollouts(trainer: Any, pl_module: Any) -> int | None:
    """Rollouts the run will take: from `total_episodes`, else `max_steps`; None when unbounded."""
    total = (getattr(pl_module, "hparams", None) or {}).get("total_episodes")
    try:
        if total:
            return math.ceil(total / pl_module.episodes_per_rollout())
        if trainer.max_steps and trainer.max_steps > 0:
            return math.ceil(trainer.max_steps / max(1, pl_module.updates_per_rollout()))
    except Exception:  # an unusual module: fall back to the loader's length
        return None
    return None


class CompactProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar, shortened to fit the terminal; see the module docstring.

    Args:
        refresh_rate: update the bar every this many steps.
        summary: print the first -> last validated value of the headline metrics at fit end.
    """

    BAR_FORMAT = "{desc} |{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"

    def __init__(self, refresh_rate: int = 1, summary: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate)
        self.summary = summary
        self._online_total: int | None = None
        self._first_val: dict[str, float] = {}
        self._last_val: dict[str, float] = {}

    # ------------------------------------------------------------------ metrics
    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        out: dict[str, Any] = {}
        for name, value in items.items():
            key = short_name(name)
            if key in out:  # two metrics shorten alike: keep the full name of the second
                key = name
            out[key] = format_value(value)
        return out

    # ------------------------------------------------------------------ training bar
    @property
    def total_train_batches(self) -> int | float:
        """The epoch's batches, or fewer when `max_steps` ends the run first (Lightning counts
        `max_steps` only under `max_epochs: -1`, and as batches whatever the accumulation)."""
        trainer = self.trainer
        total = trainer.num_training_batches
        if trainer.max_steps is not None and trainer.max_steps > 0:
            total = min(total, max(0, trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches)
        return total

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        self._online_total = total_rollouts(trainer, pl_module) if is_online(pl_module) else None
        loop = trainer.fit_loop
        if getattr(loop, "restarted_mid_epoch", False) or getattr(loop, "restarted_on_epoch_end", False):
            self._resume_bar(trainer, pl_module)

    def _resume_bar(self, trainer: Any, pl_module: Any) -> None:
        """The bar of a run resumed inside an epoch (no `on_train_epoch_start` from Lightning)."""
        self.on_train_epoch_start(trainer, pl_module)
        if is_online(pl_module):
            return
        bar = self.train_progress_bar
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # batches of this epoch trained
        if bar.total is not None and trainer.num_training_batches != float("inf"):
            # Lightning's total counts the steps left (max_steps) from 0; this epoch's batch index goes on from `done`
            bar.total = min(int(trainer.num_training_batches), bar.total + done)
        bar.n = bar.initial = done  # the ETA's rate counts only the batches this run trains
        bar.refresh()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if not is_online(pl_module):
            super().on_train_epoch_start(trainer, pl_module)
            epochs = trainer.max_epochs
            of = f"/{epochs}" if epochs and epochs > 0 else ""
            self.train_progress_bar.set_description(f"epoch {trainer.current_epoch + 1}{of}")
            return
        bar = self.train_progress_bar
        if trainer.current_epoch == 0 or bar.total is None:  # one bar for the whole run
            bar.reset(total=self._online_total)
            bar.n = bar.initial = pl_module.rollouts  # resumed runs start where they stopped (rate: this run's)
            bar.set_description("rollouts")
            bar.refresh()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not is_online(pl_module):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar = self.train_progress_bar
        if bar is not None and progress_bar_due(self, pl_module.rollouts, bar.total):
            bar.n = pl_module.rollouts
            bar.set_postfix(self.get_metrics(trainer, pl_module))
            bar.refresh()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not is_online(pl_module):
            super().on_train_epoch_end(trainer, pl_module)
        elif not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    # ------------------------------------------------------------------ the result line
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking:
            return
        for name, value in trainer.callback_metrics.items():
            if not name.startswith("val/") or name.rsplit("/", 1)[-1] not in SUMMARY_NAMES:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            self._first_val.setdefault(name, number)
            self._last_val[name] = number

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if not (self.summary and trainer.is_global_zero and self._last_val):
            return
        parts = []
        for name, last in self._last_val.items():
            first = self._first_val[name]
            value = format_value(last) if first == last else f"{format_value(first)} -> {format_value(last)}"
            parts.append(f"{name[len('val/'):]} {value}")
        log.info("validation (first -> last): %s", ", ".join(parts))
