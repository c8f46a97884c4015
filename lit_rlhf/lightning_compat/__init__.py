"""Every use of a Lightning private attribute, one small function each.

Lightning's public API does not cover a few things this project needs (its own signal handling
replaced by a checkpoint at an optimizer-step boundary, one step axis for every logged scalar, a
trusted instantiator for its own checkpoints, ...). Each such use is a function here, with the
reason no public API serves and the Lightning version it was written against;
`tests/test_lightning_compat.py` has a test per function that fails when Lightning changes under
it, and `tests/test_architecture.py` checks that no other file of `lit_rlhf` or `callbacks`
touches a Lightning private name. When Lightning moves, this package (one file per
concern: `checkpoints`, `loop`, `logs`) and its test are the whole change.

Written against Lightning 2.6 (`lightning.pytorch`).
"""

from __future__ import annotations

from lit_rlhf.lightning_compat.checkpoints import (callback_state_key, checkpoint_dir, last_checkpoints_in_dir,
                                                   restart_next_epoch_afresh, trust_checkpoint_instantiator,
                                                   uncount_stepped_batch)
from lit_rlhf.lightning_compat.logs import (learning_rates, logger_version_unset, logger_writes_this_step,
                                            progress_bar_due, set_logger_version, write_metrics_at)
from lit_rlhf.lightning_compat.loop import (accumulating, replace_eval_mode_check,
                                            set_model_parallel_sizes, signal_handlers_restored_at_teardown,
                                            stop_after_this_batch, take_lightning_sigterm)

LIGHTNING_VERSION = "2.6"  # the version every function was written against

__all__ = [
    "LIGHTNING_VERSION", "accumulating", "callback_state_key", "checkpoint_dir", "last_checkpoints_in_dir",
    "learning_rates", "logger_version_unset", "logger_writes_this_step", "progress_bar_due", "replace_eval_mode_check",
    "restart_next_epoch_afresh", "set_logger_version", "set_model_parallel_sizes", "signal_handlers_restored_at_teardown",
    "stop_after_this_batch", "take_lightning_sigterm", "trust_checkpoint_instantiator", "uncount_stepped_batch",
    "write_metrics_at",
]
