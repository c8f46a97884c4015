"""Callbacks for lit_rlhf: they observe or shape training, they never step an optimizer.

A callback changes a knob (the KL coefficient), shapes rollout rewards through the rollout hook
of the online modules, or evaluates. It keeps its state in `state_dict()` so checkpoints carry it.
"""

from callbacks.reward_normalization import RewardNormalizationCallback
