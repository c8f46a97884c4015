"""Callbacks for lit_rlhf: they observe or shape training, they never step an optimizer.

A callback changes a knob (the KL coefficient), shapes rollout rewards through the rollout hook
of the online modules, or evaluates. It keeps its state in `state_dict()` so checkpoints carry it.

The rollout hook (PPO, GRPO; `lit_rlhf.modules.online`): after a rollout is generated and
scored, and before advantages are computed, the module calls, for each callback of
`trainer.callbacks` that defines it, in list order,

    def on_rollout_scores(self, trainer, pl_module, rollout: Rollout) -> Rollout

A hook returns a Rollout with scores of the same shape, e.g.
`rollout.with_scores(torch.where(rollout.has_eos, rollout.scores, -1.0))`, or the rollout
unchanged when it only observes. After the update, callbacks that define

    def on_rollout_end(self, trainer, pl_module, rollout: Rollout) -> None

observe the final rollout (its `logps` always filled); `KLControlCallback` measures the KL there.

`default_callbacks` (the compact progress bar, the dead-run warnings) is what `main.py` adds to
every run; `PreemptionCheckpoint` is re-exported from `lit_rlhf.preemption`, where the CLI adds
it to every run by default. This package imports `lit_rlhf`, never the other way round.
"""

from callbacks.defaults import default_callbacks
from callbacks.divergence import DivergenceMonitor
from callbacks.eos_trick import EOSTrickCallback
from callbacks.judge_eval import JudgeEvalCallback
from callbacks.kl_control import KLControlCallback
from callbacks.lr_monitor import LearningRateMonitor
from callbacks.pass_at_k import PassAtKCallback
from callbacks.preemption import PreemptionCheckpoint
from callbacks.progress import CompactProgressBar
from callbacks.reward_normalization import RewardNormalizationCallback
from callbacks.run_health import RunHealthCallback

__all__ = [
    "CompactProgressBar",
    "DivergenceMonitor",
    "EOSTrickCallback",
    "JudgeEvalCallback",
    "KLControlCallback",
    "LearningRateMonitor",
    "PassAtKCallback",
    "PreemptionCheckpoint",
    "RewardNormalizationCallback",
    "RunHealthCallback",
    "default_callbacks",
]
