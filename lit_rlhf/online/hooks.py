"""The rollout hooks: how callbacks shape a rollout's scores and observe the trained rollout.

For each callback in `trainer.callbacks` **in list order** (the order of the config's
`trainer.callbacks`) that defines it, an online module calls

    rollout = callback.on_rollout_scores(trainer, pl_module, rollout)  # -> Rollout

after the rewards and the method's extras, before the update. A hook returns a new `Rollout` (it
is immutable: `rollout.with_scores(new_scores)`) with scores of the same shape; it may also just
observe (`callbacks.EOSTrickCallback`, D23, uses it). After the update, every callback that
defines `on_rollout_end(trainer, pl_module, rollout) -> None` observes the final rollout
(`callbacks.KLControlCallback` measures the rollout's KL there).
"""

from __future__ import annotations

from typing import Any

from lit_rlhf.types import Rollout


def apply_rollout_hooks(trainer: Any, module: Any, rollout: Rollout) -> Rollout:
    """`on_rollout_scores` of every callback that defines it, in list order (see above)."""
    if trainer is None:
        return rollout
    for callback in trainer.callbacks:
        hook = getattr(callback, "on_rollout_scores", None)
        if hook is None:
            continue
        shaped = hook(trainer, module, rollout)
        name = type(callback).__name__
        if not isinstance(shaped, Rollout):
            raise TypeError(f"{name}.on_rollout_scores must return a Rollout, got {type(shaped).__name__}")
        if shaped.scores is None or shaped.scores.shape != rollout.scores.shape:
            raise ValueError(f"{name}.on_rollout_scores must keep scores of shape {tuple(rollout.scores.shape)}")
        rollout = shaped
    return rollout


def notify_rollout_end(trainer: Any, module: Any, rollout: Rollout) -> None:
    """`on_rollout_end` of every callback that defines it, in list order, with the final rollout
    (after the update; `logps` None when the method never computed them)."""
    for callback in trainer.callbacks if trainer is not None else []:
        hook = getattr(callback, "on_rollout_end", None)
        if hook is not None:
            hook(trainer, module, rollout)
