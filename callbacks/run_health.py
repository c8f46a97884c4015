"""Warnings that catch a dead run: a run that trains without a learning signal and says nothing.

`RunHealthCallback` watches these things and logs one warning for each (once per run):

- **every score equal**: the final (shaped) scores of a rollout are all the same for
  `patience` rollouts in a row. The usual cause is the EOS trick (D23) in `replace` mode with a
  `max_new_tokens` too short for any response to end: every response gets the penalty score,
  and the advantages, relative to each other, are all zero;
- **zero-variance advantages**: for group methods (GRPO/RLOO: `num_generations` responses per
  prompt), every group's scores are equal for `patience` rollouts in a row, so every
  group-relative advantage is exactly 0 and the policy loss has no gradient but the KL's;
- **warm-up longer than the run**: at the start of fit, when the learning-rate warm-up is as
  long as the whole schedule (the peak learning rate is never reached), and at the end of fit
  when training stopped inside the warm-up;
- at the end of fit, for the online methods (PPO, GRPO, RLOO; `dead_run_report`):
  **the reward did not move**: the optimised reward (the shaped scores of each rollout, what
  `train/objective/scores` logs) over the last quarter of the rollouts against the first
  quarter changed by less than twice its standard error (computed from the per-rollout means:
  rollouts are the independent draws), and **nearly every response was truncated**: 90% or more
  of the responses of the last quarter ended without EOS at `max_new_tokens` (what
  `train/response/eos_fraction` logs). Each is one plain line in the end-of-fit report.

A module whose update does not read the scores (`learns_from_scores` False: pure distillation,
`DistillationModule` with `reward_weight` 0, where the scores are only logged) gets neither
score warning nor the reward line; the truncation line still applies.

It only observes (through the rollout hook `on_rollout_end` of `lit_rlhf.modules.online` and
Lightning's hooks); the CLI adds it to every run unless the config lists it itself
(`callbacks.default_callbacks`, passed to the CLI by `main.py`).
"""

from __future__ import annotations

import logging
import math
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


MIN_ROLLOUTS = 4  # fewer rollouts than this: too few to compare a first and a last window
MOVE_THRESHOLD = 2.0  # a change within this many standard errors has "not moved"
TRUNCATED_THRESHOLD = 0.9  # this share of responses without EOS, or more: "nearly every response"


def windows(n: int) -> int:
    """Rollouts in each of the first and last windows of a run of `n` rollouts: a quarter, at least 2."""
    return max(2, n // 4)


def _mean_var(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)


def reward_line(scores: list[float]) -> str | None:
    """"reward did not move: ..." when the mean of the per-rollout scores over the last window is
    within `MOVE_THRESHOLD` standard errors of the first window's (a Welch-style standard error
    sqrt(var_first / w + var_last / w) of the per-rollout means); None when it moved, or with fewer
    than `MIN_ROLLOUTS` rollouts."""
    n = len(scores)
    if n < MIN_ROLLOUTS:
        return None
    w = windows(n)
    (first, var_first), (last, var_last) = _mean_var(scores[:w]), _mean_var(scores[-w:])
    change, error = last - first, math.sqrt(var_first / w + var_last / w)
    if abs(change) > MOVE_THRESHOLD * error:
        return None
    noise = f"within {MOVE_THRESHOLD:g} standard errors ({error:.2g})" if error > 0 else "every rollout scored the same"
    return (f"reward did not move: the optimised reward (train/objective/scores) went from {first:.4g} (mean of the "
            f"first {w} rollouts) to {last:.4g} (last {w} of {n}), a change of {change:+.3g}, {noise}. Check that the "
            "reward tells responses apart and that the policy learns (lr, KL coefficient, number of rollouts).")


def truncation_line(eos_fractions: list[float], counts: list[int], max_new_tokens: int | None) -> str | None:
    """"N% of responses were truncated ..." when `TRUNCATED_THRESHOLD` or more of the responses of
    the last window (all rollouts for a short run) ended without EOS; None otherwise."""
    n = len(eos_fractions)
    if not n:
        return None
    w = windows(n) if n >= MIN_ROLLOUTS else n
    total = sum(counts[-w:])
    if total <= 0:
        return None
    truncated = 1.0 - sum(f * c for f, c in zip(eos_fractions[-w:], counts[-w:])) / total
    if truncated < TRUNCATED_THRESHOLD:
        return None
    where = f"max_new_tokens={max_new_tokens}" if max_new_tokens is not None else "max_new_tokens"
    return (f"{100 * truncated:.0f}% of responses were truncated at {where} (no EOS; last {w} of {n} rollouts): "
            "raise max_new_tokens, or penalise unfinished responses (callbacks.EOSTrickCallback) so the policy learns "
            "to stop.")


def dead_run_report(scores: list[float], eos_fractions: list[float], counts: list[int],
                    max_new_tokens: int | None) -> list[str]:
    """The end-of-fit lines of a run that did not learn: per-rollout mean scores, EOS fractions and
    response counts in rollout order; an empty list for a healthy run."""
    return [line for line in (reward_line(scores), truncation_line(eos_fractions, counts, max_new_tokens)) if line]


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
        # per rollout, for the end-of-fit report: mean optimised score, share ending with EOS, responses
        self.scores: list[float] = []
        self.eos_fractions: list[float] = []
        self.counts: list[int] = []

    def _warn(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning(message, *args)

    # ------------------------------------------------------------------ rollouts
    def on_rollout_end(self, trainer: Any, pl_module: Any, rollout: Any) -> None:
        scores = rollout.scores
        if scores is None:
            return
        has_eos = getattr(rollout, "has_eos", None)
        self.scores.append(float(scores.detach().float().mean()))
        self.eos_fractions.append(float(has_eos.float().mean()) if has_eos is not None else 1.0)
        self.counts.append(int(scores.numel()))
        if not getattr(pl_module, "learns_from_scores", True):
            return  # the scores are only logged (pure distillation): equal ones stop nothing
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

    # ------------------------------------------------------------------ the end-of-fit report
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """One plain line for each sign of a dead online run (`dead_run_report`), on rank 0."""
        if not trainer.is_global_zero or not self.scores:
            return
        sampling = getattr(pl_module, "sampling", None)
        scores = self.scores if getattr(pl_module, "learns_from_scores", True) else []  # no reward line then
        for line in dead_run_report(scores, self.eos_fractions, self.counts,
                                    getattr(sampling, "max_new_tokens", None)):
            log.warning(line)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"equal_streak": self.equal_streak, "flat_streak": self.flat_streak, "scores": list(self.scores),
                "eos_fractions": list(self.eos_fractions), "counts": list(self.counts)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.equal_streak = int(state_dict.get("equal_streak", 0))
        self.flat_streak = int(state_dict.get("flat_streak", 0))
        self.scores = [float(v) for v in state_dict.get("scores", [])]
        self.eos_fractions = [float(v) for v in state_dict.get("eos_fractions", [])]
        self.counts = [int(v) for v in state_dict.get("counts", [])]
