"""Warnings that catch a dead run: a run that trains without a learning signal and says nothing.

`RunHealthCallback` watches three things and logs one warning for each (once per run):

- **every score equal**: the final (shaped) scores of a rollout are all the same for
  `patience` rollouts in a row. The usual cause is the EOS trick (D23) in `replace` mode with a
  `max_new_tokens` too short for any response to end: every response gets the penalty score,
  and the advantages, relative to each other, are all zero;
- **zero-variance advantages**: for group methods (GRPO/RLOO: `num_generations` responses per
  prompt), every group's scores are equal for `patience` rollouts in a row, so every
  group-relative advantage is exactly 0 and the policy loss has no gradient but the KL's;
- **warm-up longer than the run**: at the start of fit, when the learning-rate warm-up is as
  long as the whole schedule (the peak learning rate is never reached), and at the end of fit
  when training stopped inside the warm-up.

It only observes (through the rollout hook `on_rollout_end` of `lit_rlhf.modules.online` and
Lightning's hooks); the CLI adds it to every run unless the config lists it itself
(`lit_rlhf.cli.default_callbacks`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning import Callback

log = logging.getLogger(__name__)


def all_equal(scores: torch.Tensor) -> bool:
    """True when every entry of `scores` (N,) is the same number (N >= 2)."""
    flat = scores.detach().float().flatten()
    return flat.numel() >= 2 and bool((flat == flat[0]).all())


def all_groups_flat(scores: torch.Tensor, group_size: int) -> bool:
    """True when the scores (N,) split into contiguous groups of `group_size` (> 1) and every
    group's scores are all equal, so every group-relative advantage is 0."""
    flat = scores.detach().float().flatten()
    if group_size < 2 or flat.numel() % group_size:
        return False
    groups = flat.view(-1, group_size)
    return bool((groups == groups[:, :1]).all())


def warmup_steps(pl_module: Any, total: int) -> int:
    """The warm-up length `TrainingModule.configure_optimizers` uses (0 when the module has none)."""
    hp = getattr(pl_module, "hparams", None) or {}
    return int(hp.get("warmup_steps") or int(float(hp.get("warmup_ratio") or 0.0) * total))


def scheduler_steps(trainer: Any) -> int | None:
    """Optimizer steps the first learning-rate scheduler has taken (None without one)."""
    configs = getattr(trainer, "lr_scheduler_configs", None) or []
    if not configs:
        return None
    return int(getattr(configs[0].scheduler, "last_epoch", 0))


class RunHealthCallback(Callback):
    """Warns when a run cannot learn; see the module docstring.

    Args:
        patience: rollouts in a row with equal scores (or flat groups) before warning.
    """

    def __init__(self, patience: int = 3) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience = patience
        self.equal_streak = 0
        self.flat_streak = 0
        self.warned: set[str] = set()

    def _warn(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning(message, *args)

    # ------------------------------------------------------------------ rollouts
    def on_rollout_end(self, trainer: Any, pl_module: Any, rollout: Any) -> None:
        scores = rollout.scores
        if scores is None:
            return
        self.equal_streak = self.equal_streak + 1 if all_equal(scores) else 0
        group = int(getattr(pl_module, "repeats", 1))
        self.flat_streak = self.flat_streak + 1 if all_groups_flat(scores, group) else 0
        if self.equal_streak >= self.patience:
            has_eos = getattr(rollout, "has_eos", None)
            eos = float(has_eos.float().mean()) if has_eos is not None else float("nan")
            self._warn(
                "equal_scores",
                "dead run? every response of the last %d rollouts got the same score (%.4g) and %.0f%% of the "
                "responses ended with EOS: nothing tells responses apart, so nothing is learned. If the EOS "
                "trick (EOSTrickCallback, mode: replace) scores every unfinished response, raise "
                "max_new_tokens or use mode: subtract.",
                self.equal_streak, float(scores.flatten()[0]), 100 * eos,
            )
        elif self.flat_streak >= self.patience:
            self._warn(
                "zero_advantages",
                "dead run? in the last %d rollouts every prompt's %d responses got equal scores, so every "
                "group-relative advantage is 0 and only the KL term has a gradient. Sample more diverse "
                "responses (temperature, num_generations) or use a reward that tells them apart.",
                self.flat_streak, group,
            )

    # ------------------------------------------------------------------ learning-rate warm-up
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            total = int(pl_module.num_training_steps())
        except Exception:  # no finite schedule (e.g. a custom module): nothing to compare
            return
        warmup = warmup_steps(pl_module, total)
        if warmup >= total > 0:
            self._warn(
                "warmup_start",
                "the learning-rate warm-up (%d optimizer steps) is as long as the whole run (%d steps): the peak "
                "learning rate is never reached. Shorten warmup_steps (or warmup_ratio).", warmup, total,
            )

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        done = scheduler_steps(trainer)
        if done is None or "warmup_start" in self.warned:
            return
        try:
            total = int(pl_module.num_training_steps())
        except Exception:
            total = done
        warmup = warmup_steps(pl_module, total)
        if 0 < done < warmup:
            self._warn(
                "warmup_end",
                "training stopped after %d optimizer steps, still inside the %d-step learning-rate warm-up: the "
                "learning rate never reached its peak. Shorten warmup_steps (or warmup_ratio).", done, warmup,
            )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"equal_streak": self.equal_streak, "flat_streak": self.flat_streak}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.equal_streak = int(state_dict.get("equal_streak", 0))
        self.flat_streak = int(state_dict.get("flat_streak", 0))
