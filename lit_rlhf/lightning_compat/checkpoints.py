"""Checkpoints and restores: the instantiator our checkpoints name, `ModelCheckpoint`'s files and
state key, the fit loop's counters of a restored run.

Written against Lightning 2.6 (see `lit_rlhf.lightning_compat`).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.core import saving


def trust_checkpoint_instantiator(path: str) -> None:
    """Add `path` (a `module.function` import path) to the instantiators `load_from_checkpoint`
    accepts from a checkpoint's hyper-parameters (`_instantiator`).

    Why private: Lightning 2.6 blocks any instantiator not in `saving._ALLOWED_INSTANTIATORS`
    (arbitrary code execution from a checkpoint) and offers no function to extend that set; its
    error message itself says to add the path there. Idempotent."""
    saving._ALLOWED_INSTANTIATORS.add(path)


def last_checkpoints_in_dir(callback: Any, trainer: Any) -> set[str]:
    """The `last*.ckpt` files in `callback`'s (a `ModelCheckpoint`) directory: the files
    `ckpt_path="last"` chooses from.

    Why private: `ModelCheckpoint._find_last_checkpoints` is the rule `trainer.fit(ckpt_path="last")`
    applies (Lightning 2.6); no public method names the candidates, and a copy of the rule would
    drift from the one that picks the file."""
    return set(callback._find_last_checkpoints(trainer))


def checkpoint_dir(callback: Any, trainer: Any) -> str:
    """The directory `callback` (a `ModelCheckpoint`) writes to: its `dirpath`, else the one it
    derives from the first logger (`save_dir/name/version/checkpoints`) or `default_root_dir`.

    Why private: before the first save `dirpath` may still be None; the derivation is the
    name-mangled `ModelCheckpoint.__resolve_ckpt_dir` (Lightning 2.6), which has no public
    counterpart."""
    if callback.dirpath is not None:
        return str(callback.dirpath)
    return str(callback._ModelCheckpoint__resolve_ckpt_dir(trainer))


def callback_state_key(callback: Any, **kwargs: Any) -> str:
    """The key a callback's state is saved under in a checkpoint, its class name with `kwargs`, so
    several instances of one callback class keep their states apart.

    Why private: `Callback._generate_state_key` (Lightning 2.6) is the format Lightning's own
    callbacks (`ModelCheckpoint`, `EarlyStopping`) use; its docstring offers it for `state_key`."""
    return callback._generate_state_key(**kwargs)


def uncount_stepped_batch(fit_loop_state: dict[str, Any]) -> None:
    """Take one batch off the count of batches that stepped in a checkpoint's fit-loop state
    (`checkpoint["loops"]["fit_loop"]`), the counter Lightning writes training scalars against.

    Why private: the counter is `_TrainingEpochLoop._batches_that_stepped`, saved under
    `"epoch_loop.state_dict"` (Lightning 2.6); a checkpoint rewritten to its mid-epoch form
    (`lit_rlhf.resume.as_mid_epoch`) must move it with the batch counters, and no public API
    edits loop state."""
    fit_loop_state["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1


def restart_next_epoch_afresh(trainer: Any) -> bool:
    """After a restore from a checkpoint saved in the `on_train_batch_end` of an epoch's last batch,
    clear the fit loop's restart stage so the next epoch starts as a fresh one; True when it did.

    Why internal: the loops' restart stages (`restarted_mid_epoch`, `restarted_on_train_batch_end`,
    `reset_restart_stage`; Lightning 2.6) are public names but undocumented; the test is the one
    `_FitLoop.reset` uses to count the saved epoch as done, and no public API starts the next epoch
    afresh (`lit_rlhf.resume.start_next_epoch_afresh` says why it must)."""
    loop = trainer.fit_loop
    if not (getattr(loop, "restarted_mid_epoch", False)
            and getattr(loop.epoch_loop, "restarted_on_train_batch_end", False)
            and loop.epoch_loop.batch_progress.is_last_batch):
        return False
    loop.reset_restart_stage()
    return True
