"""What every training module shares, beside the methods in `lit_rlhf.modules`.

- `base`: `TrainingModule`, the LightningModule under every method: optimiser and schedule set-up,
  the non-finite guard, exact resume, start-up checks, step logging, export;
- `settings`: a module's settings as attributes, `hparams` as their record, the rebuild from a
  checkpoint; `step_logging`: scalars at the optimizer step they belong to;
- `memory`: `Memory`, the settings that trade time for memory (one `memory:` argument);
  `moved`: a class's former arguments and the one line naming where they went;
- `optim` (AdamW groups and schedules, a module's optimizer set-up) and `in_backward` (optimizer
  steps inside the backward pass); `guard`: the non-finite guard (check, skip or error);
- `reference_table`: DPO's reference log-probs computed once before training;
- `reward_eval` and `reward_metrics`: a reward model's evaluation on preference pairs.
"""

from lit_rlhf.training.memory import Memory

__all__ = ["Memory"]
