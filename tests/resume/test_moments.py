"""Stop a run at every kind of moment, rerun it with `--ckpt_path last`: the straight run, bitwise.

SIGTERM (acted on by `PreemptionCheckpoint`) and SIGKILL (`Killed`: only the periodic
checkpoints on disk count) land inside a gradient accumulation window, during generation, during
validation inside training, during a checkpoint save, at an epoch's last step, during the sanity
check and during set-up (`on_fit_start`, DPO's reference precompute). The moments that do not
depend on the method run once (SFT); the method-dependent ones run per method: a signal during a
training step for all seven methods, generation and validation for the online ones (they sample).
The resumed run must equal the straight run: every tensor and number of the final checkpoint and
every logged train scalar of every batch (`harness.assert_same_run`).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from tests.resume.harness import Interrupt, Setup, assert_same_run, interrupted_then_resumed, straight_run
from tests.resume.test_resume import CASES

SIGTERM = signal.SIGTERM
KILL = None


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def sanity(trainer) -> bool:
    return trainer.sanity_checking


def in_fit_validation(trainer) -> bool:
    return not trainer.sanity_checking


def check(setup: Setup, tmp_path, tmp_path_factory, *interrupts: Interrupt):
    straight, straight_root = straight_run(setup, tmp_path_factory)
    runs, final = interrupted_then_resumed(setup, tmp_path / "run", *interrupts)
    assert_same_run(straight, runs, final, straight_root, tmp_path / "run")
    return runs, final


# ----------------------------------------------------------------------------------------------
# moments that do not depend on the method: SFT
# ----------------------------------------------------------------------------------------------

ACCUMULATE = Setup("sft", accumulate=2, max_steps=4)  # 6 batches: windows (1,2) (3) | (4,5) (6)
TWO_EPOCHS = Setup("sft", max_steps=6)  # 3 batches per epoch
EPOCH_END_SAVES = Setup("sft", max_steps=6, every_n_train_steps=1000, save_on_train_epoch_end=True)
SANITY = Setup("sft", max_steps=6, sanity=1)


@pytest.mark.parametrize("case", [
    # SIGTERM inside an accumulation window: saved at the window's end (batch 5), never mid-window
    pytest.param((ACCUMULATE, Interrupt("on_after_backward", n=4)), id="sigterm-inside-accumulation"),
    # SIGKILL inside a window: the periodic checkpoint of the previous optimizer step counts
    pytest.param((ACCUMULATE, Interrupt("on_after_backward", n=5, sig=KILL)), id="kill-inside-accumulation"),
    # SIGTERM after the epoch's last batch was handled (the callback's hook already ran)
    pytest.param((TWO_EPOCHS, Interrupt("on_train_batch_end", n=3)), id="sigterm-after-epoch-last-step"),
    pytest.param((TWO_EPOCHS, Interrupt("on_train_epoch_end")), id="sigterm-at-epoch-end"),
    # SIGKILL after a checkpoint written at the epoch's end (ModelCheckpoint's epoch-end save)
    pytest.param((EPOCH_END_SAVES, Interrupt("on_after_backward", n=4, sig=KILL)), id="kill-after-epoch-end-save"),
    # SIGTERM during a checkpoint save (the periodic one of step 2)
    pytest.param((TWO_EPOCHS, Interrupt("on_save_checkpoint", n=2)), id="sigterm-during-save"),
    # SIGTERM during the epoch-end validation
    pytest.param((SANITY, Interrupt("on_validation_batch_end", when=in_fit_validation)), id="sigterm-during-validation"),
])
def test_stop_at_a_moment_resumes_exactly(case, tmp_path, tmp_path_factory):
    setup, interrupt = case
    runs, _ = check(setup, tmp_path, tmp_path_factory, interrupt)
    if interrupt.sig == SIGTERM:
        assert runs[0].exit_code == 75
        if setup.accumulate > 1:  # the save waited for the end of the accumulation window
            saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
            assert saved["global_step"] == 4  # the last step: the final checkpoint was written after the resume
            assert runs[0].trainer.global_step == 3 and runs[0].trainer.fit_loop.total_batch_idx + 1 == 5


def test_sigterm_during_the_sanity_check_saves_nothing_and_exits_75(tmp_path, tmp_path_factory):
    """Before the first optimizer step there is nothing to save: the run exits with 75 and the rerun
    starts where the last checkpoint (none, then step 3) left off; so does a resumed run stopped
    before its first step."""
    runs, final = check(
        SANITY, tmp_path, tmp_path_factory,
        Interrupt("on_validation_batch_end", when=sanity),  # first run: no checkpoint at all
        Interrupt("on_train_batch_end", n=2),  # saved at batch 3
        Interrupt("on_fit_start"),  # a resumed run (it has no sanity check): before its first step
    )
    assert [r.exit_code for r in runs] == [75, 75, 75]
    assert runs[0].trainer.global_step == 0 and not runs[0].recorder.metrics and not runs[2].recorder.metrics


def test_sigterm_during_setup_exits_75_before_training(tmp_path, tmp_path_factory):
    runs, _ = check(TWO_EPOCHS, tmp_path, tmp_path_factory, Interrupt("setup"))
    assert runs[0].exit_code == 75 and runs[0].trainer.global_step == 0
    assert not runs[0].recorder.metrics


def test_sigterm_during_dpo_reference_precompute(tmp_path, tmp_path_factory):
    """The signal lands at `on_fit_start`, where DPO fills its reference table: nothing saved."""
    setup = Setup("dpo", module_args=dict(precompute_ref_logps=True))
    runs, _ = check(setup, tmp_path, tmp_path_factory, Interrupt("on_fit_start"), Interrupt("on_fit_start"))
    assert [r.exit_code for r in runs] == [75, 75]
    assert all(not r.recorder.metrics for r in runs)


# ----------------------------------------------------------------------------------------------
# per method
# ----------------------------------------------------------------------------------------------


# backward passes per optimizer step: PPO's policy and value terms run one each (run_updates' loss parts)
BACKWARDS_PER_STEP = {"ppo": 2, "ppo_lora": 2, "ppo_ptx": 2}  # PPO-ptx: its SFT term joins the policy part


@pytest.mark.parametrize("name", list(CASES))
def test_sigterm_during_a_training_step(name, tmp_path, tmp_path_factory):
    """SIGTERM in the first backward pass of batch 2 (of 4): saved after batch 2, resumed."""
    steps_per_batch = CASES[name][2]
    backwards = steps_per_batch * BACKWARDS_PER_STEP.get(name, 1)  # per batch
    runs, _ = check(Setup(name), tmp_path, tmp_path_factory, Interrupt("on_after_backward", n=backwards + 1))
    assert runs[0].exit_code == 75 and runs[0].trainer.global_step == 2 * steps_per_batch


@pytest.mark.parametrize("name", list(CASES))
def test_sigkill_during_a_training_step(name, tmp_path, tmp_path_factory):
    """SIGKILL in the first backward pass of batch 3: the periodic checkpoint of batch 2 counts."""
    backwards = CASES[name][2] * BACKWARDS_PER_STEP.get(name, 1)  # per batch
    runs, _ = check(Setup(name), tmp_path, tmp_path_factory, Interrupt("on_after_backward", n=2 * backwards + 1, sig=KILL))
    assert runs[0].killed


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_sigterm_during_generation(name, tmp_path, tmp_path_factory):
    steps_per_batch = CASES[name][2]
    runs, _ = check(Setup(name), tmp_path, tmp_path_factory, Interrupt("on_rollout_scores", n=3))
    assert runs[0].trainer.global_step == 3 * steps_per_batch


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_stop_around_validation_of_an_online_method(name, tmp_path, tmp_path_factory):
    """Validation samples with its own generator: a SIGKILL after the periodic checkpoint of
    batch 2 and the validation that follows it resumes without that validation, and a SIGTERM
    during a validation is acted on after the next step, both as the straight run."""
    setup = Setup(name, val_every=2, max_steps=6 * CASES[name][2])  # validation after batches 2, 4 and 6
    runs, _ = check(setup, tmp_path, tmp_path_factory,
                    Interrupt("on_validation_end", sig=KILL, when=in_fit_validation),
                    Interrupt("on_validation_batch_end", when=in_fit_validation))
    assert runs[0].killed and runs[1].exit_code == 75


def test_sigterm_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """2-process DDP (gloo): the signal reaches rank 1 only; both ranks stop after step 3 (the
    flag is all-reduced at each optimizer-step boundary), and the resumed run is the straight one."""
    from tests.distributed.launch import launch

    results = launch(Path(__file__).with_name("run_ddp_preemption.py"), [], 2, tmp_path, timeout=400)
    for r in results:
        assert r["code"] == 75 and r["stopped_step"] == r["saved_step"] == 3, r
        assert r["resumed_code"] is None and r["resumed_step"] == r["straight_step"] == 4, r
        assert r["resumed"] == r["straight"], r
