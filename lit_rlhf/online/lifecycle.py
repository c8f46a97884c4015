"""An online module's life in a fit, beside its method: set-up, start, and checkpoint state.

`OnlineModule`'s Lightning hooks (`lit_rlhf.modules.online`) call these with itself as `module`:

- `setup`: under DeepSpeed the engine clips inside its step, so it is handed `max_grad_norm`; a
  fit gets a `SourceGuard`, which stops the rollout source if the fit fails;
- `start`: the rollout source starts, unless the episode budget is already spent (a run resumed
  from the checkpoint of its last step);
- `save_state` / `load_state`: the counters `episodes` and `rollouts` (`lit_rlhf.online.budget`)
  and the source's own state (an asynchronous queue) in the module's part of a checkpoint.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy

from lit_rlhf.lightning_compat import attached_trainer
from lit_rlhf.online.async_source import SourceGuard

SOURCE_KEY = "rollout_source"


def setup(module: Any, stage: str) -> None:
    """After the shared set-up: DeepSpeed's clipping and the source's guard (see above)."""
    trainer = attached_trainer(module)
    # under DeepSpeed the engine clips inside its step: hand it `max_grad_norm`
    if trainer is not None and isinstance(trainer.strategy, DeepSpeedStrategy) and module.max_grad_norm:
        trainer.strategy.config.setdefault("gradient_clipping", float(module.max_grad_norm))
    if stage == "fit" and trainer is not None and not any(isinstance(c, SourceGuard) for c in trainer.callbacks):
        trainer.callbacks.append(SourceGuard())  # stops the source if the fit fails


def start(module: Any) -> None:
    """At train start, after the random states are restored (a producer at max_staleness 0 draws
    from them): stop at once when the budget is spent, else start the source."""
    if module.budget_reached():  # resumed from the checkpoint of the run's last step: nothing left
        module.trainer.should_stop = True
        return
    module.rollout_source.start(module)


def save_state(module: Any, state: dict[str, Any]) -> None:
    """The counters and the source's state into `state`, the module's part of a checkpoint."""
    state.update({"episodes": module.episodes, "rollouts": module.rollouts})
    source = module.rollout_source.state_dict()
    if source is not None:
        state[SOURCE_KEY] = source


def load_state(module: Any, state: dict[str, Any]) -> None:
    """The counters and the source's state back from `state` (what `save_state` wrote)."""
    module.episodes, module.rollouts = int(state.get("episodes", 0)), int(state.get("rollouts", 0))
    module.rollout_source.load_state_dict(state.get(SOURCE_KEY))
