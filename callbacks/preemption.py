"""`callbacks.PreemptionCheckpoint`: the checkpoint written on SIGTERM / SIGINT.

The class lives in `lit_rlhf.preemption` (the CLI adds it to every run by default, and
`lit_rlhf.resume` reads its state to pick the exit code); it is re-exported here so configs can
keep naming `callbacks.PreemptionCheckpoint` next to the other callbacks.
"""

from lit_rlhf.preemption import PreemptionCheckpoint, closes_optimizer_step

__all__ = ["PreemptionCheckpoint", "closes_optimizer_step"]
