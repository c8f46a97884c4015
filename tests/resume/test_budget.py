"""A finished run resumed with a larger budget continues to it, as the straight run to that budget
(with a constant learning rate; a schedule sized for the old budget is re-sized to the new one
from the resumed step on), and every run ends with one line saying why it stopped."""

from __future__ import annotations

import logging

import pytest

from tests.resume.harness import Setup, assert_same_run, fit, straight_run


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def stop_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("run stopped:")]


PPO = dict(lr_scheduler="constant")
ONLINE_UNBOUNDED = dict(max_steps=-1, max_epochs=-1)


@pytest.mark.parametrize("old, new", [
    # PPO: 8 episodes = 4 rollouts of 2 prompts, then 16: the first run stops mid-epoch (3
    # rollouts per epoch) and its final checkpoint (ModelCheckpoint's at train end) resumes mid-epoch
    pytest.param(Setup("ppo", module_args=dict(total_episodes=8, **PPO), trainer_args=ONLINE_UNBOUNDED,
                       every_n_train_steps=1000),
                 Setup("ppo", module_args=dict(total_episodes=16, **PPO), trainer_args=ONLINE_UNBOUNDED,
                       every_n_train_steps=1000), id="ppo-total_episodes"),
    pytest.param(Setup("dpo", max_steps=4, module_args=dict(lr_scheduler="constant"), every_n_train_steps=1000),
                 Setup("dpo", max_steps=8, module_args=dict(lr_scheduler="constant"), every_n_train_steps=1000),
                 id="dpo-max_steps"),
    pytest.param(Setup("sft", module_args=dict(lr_scheduler="constant"), trainer_args=dict(max_steps=-1, max_epochs=1)),
                 Setup("sft", module_args=dict(lr_scheduler="constant"), trainer_args=dict(max_steps=-1, max_epochs=2)),
                 id="sft-max_epochs"),
])
def test_extending_a_finished_run_continues_to_the_new_budget(old, new, tmp_path, tmp_path_factory, caplog):
    caplog.set_level(logging.WARNING)
    straight, straight_root = straight_run(new, tmp_path_factory)
    first = fit(old, tmp_path / "run")
    assert first.exit_code is None and 0 < first.trainer.global_step < straight.trainer.global_step
    final = fit(new, tmp_path / "run", ckpt_path=str(tmp_path / "run" / "checkpoints" / "last.ckpt"))
    assert_same_run(straight, [first], final, straight_root, tmp_path / "run")
    lines = stop_lines(caplog)
    budget = {"ppo": "total_episodes=", "dpo": "max_steps=", "sft": "max_epochs="}[old.name]
    assert len(lines) >= 3 and all(budget in line for line in lines[-2:]), lines


def test_a_resumed_run_that_has_nothing_left_says_why(tmp_path, caplog):
    """DPO to max_steps=4 with max_epochs=1 (3 batches per epoch) stops at step 3: the epoch
    limit, and the rerun with max_steps=8 trains nothing; both say so."""
    caplog.set_level(logging.WARNING)
    setup = Setup("dpo", max_steps=4, trainer_args=dict(max_epochs=1))
    first = fit(setup, tmp_path)
    assert first.trainer.global_step == 3
    again = fit(Setup("dpo", max_steps=8, trainer_args=dict(max_epochs=1)), tmp_path,
                ckpt_path=str(tmp_path / "checkpoints" / "last.ckpt"))
    assert again.trainer.global_step == 3
    first_line, second_line = stop_lines(caplog)
    assert first_line.startswith("run stopped: max_epochs=1 reached (global step 3, epoch 1); max_steps=4 not reached")
    assert "max_epochs=1 reached" in second_line and "no step trained" in second_line
    assert "max_steps=8 not reached" in second_line


@pytest.mark.parametrize("max_steps, max_epochs, batches, expected", [
    (2, 1, None, "max_steps=2 reached (global step 2"),  # cut mid-epoch: the epoch did not stop it
    (-1, 1, 3, "max_epochs=1 reached (global step 3"),
    (4, 2, 2, "max_steps=4 reached; max_epochs=2 reached (global step 4"),  # both met at the epoch's end
])
def test_the_stop_line_names_what_stopped_the_run(max_steps, max_epochs, batches, expected, tmp_path):
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lit_rlhf.stopping import stop_reason

    trainer = L.Trainer(max_steps=max_steps, max_epochs=max_epochs, limit_train_batches=batches, limit_val_batches=0,
                        default_root_dir=tmp_path, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(BoringModel())
    assert stop_reason(trainer).startswith(expected)
