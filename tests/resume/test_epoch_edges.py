"""Stops at the edges of the loop, per method: a run preempted in the last batch of an epoch, twice
in a row (epochs 0 and 1), then in the first step after a resume, then late in the run's last step,
and resubmitted each time with `--ckpt_path last`, is the uninterrupted run: bitwise the same final
checkpoint and logged scalars (`harness.assert_same_run`), every prompt trained on once per epoch.

8 batches of 3 per epoch (the run ends inside epoch 2). The online methods stop on their episode
budget (`total_episodes`, 8 rollouts' worth; `max_steps` unset), so the last resubmission finds its
budget met and trains nothing; GRPO and PPO also run with asynchronous rollouts (`AsyncRollouts`).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lit_rlhf.online import AsyncRollouts
from tests.resume.harness import Interrupt, Setup, assert_same_run, fit, interrupted_then_resumed
from tests.resume.test_moments import BACKWARDS_PER_STEP
from tests.resume.test_resume import CASES

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

BATCHES = 8  # 3 per epoch: epochs 0 and 1, then 2 batches of epoch 2
PROMPTS_PER_BATCH = 2
# responses per prompt of the online methods whose run is bounded by `total_episodes`
REPEATS = {"ppo": 1, "ppo_ptx": 1, "grpo": 2, "remax": 2, "rejection_sampling": 2, "online_dpo": 2}
ASYNC = {"rollout": AsyncRollouts(max_staleness=1)}  # each module keeps its own copy


class RowCounter(Callback):
    """The dataset rows of every trained batch, by batch number (1-based over the whole fit), with its epoch."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, list[int]]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows[trainer.fit_loop.total_batch_idx + 1] = (trainer.current_epoch, list(batch.meta["index"]))


def setup_of(name: str, module_args: dict) -> Setup:
    steps_per_batch = CASES[name][2]
    if name in REPEATS:  # the episode budget ends the run (the resumed run must see it is met)
        episodes = BATCHES * PROMPTS_PER_BATCH * REPEATS[name]
        return Setup(name, module_args=dict(total_episodes=episodes, **module_args),
                     trainer_args=dict(max_steps=-1, max_epochs=-1))
    return Setup(name, max_steps=BATCHES * steps_per_batch, module_args=module_args)


def edge_moments(name: str) -> list[Interrupt]:
    """SIGTERM in batch 3 (epoch 0's last), in batch 6 (epoch 1's last: the resumed run's third),
    in batch 7 (the first step after that resume), in the last backward pass of batch 8 (the run's
    last step, late)."""
    per_batch = CASES[name][2] * BACKWARDS_PER_STEP.get(name, 1)  # backward passes per batch
    return [Interrupt("on_after_backward", n=2 * per_batch + 1), Interrupt("on_after_backward", n=2 * per_batch + 1),
            Interrupt("on_after_backward", n=1), Interrupt("on_after_backward", n=per_batch)]


def fit_counting(setup, root, interrupt=None, ckpt_path=None):
    counter = RowCounter()
    return fit(setup, root, interrupt, ckpt_path, extra_callbacks=(counter,)), counter


CASES_AND_MODES = [pytest.param(name, {}, id=name) for name in CASES if not name.endswith("_lora")] + [
    pytest.param("grpo", ASYNC, id="grpo-async"), pytest.param("ppo", ASYNC, id="ppo-async")]


@pytest.mark.parametrize("name, module_args", CASES_AND_MODES)
def test_stops_at_epoch_ends_and_in_the_last_step_resume_exactly(name, module_args, tmp_path, monkeypatch):
    setup = setup_of(name, module_args)
    straight, straight_rows = fit_counting(setup, tmp_path / "straight")
    assert straight.exit_code is None and len(straight_rows.rows) == BATCHES
    counters: list[RowCounter] = []
    original = fit

    def counted(*args, **kwargs):  # every run of the interrupted job, with its rows counted
        counters.append(RowCounter())
        return original(*args, **kwargs, extra_callbacks=(counters[-1],))

    monkeypatch.setattr("tests.resume.harness.fit", counted)
    runs, final = interrupted_then_resumed(setup, tmp_path / "run", *edge_moments(name))
    assert [r.exit_code for r in runs] == [75] * 4
    steps_per_batch = CASES[name][2]
    assert [r.trainer.global_step // steps_per_batch for r in runs] == [3, 6, 7, 8]  # where each one saved
    assert not final.recorder.metrics  # the checkpoint of the last step met the budget: nothing more trained
    assert_same_run(straight, runs, final, tmp_path / "straight", tmp_path / "run")
    # the loop's position as the final checkpoints record it: epoch and batch counters, batches stepped
    loops = [torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["loops"]
             for root in (tmp_path / "straight", tmp_path / "run")]
    assert loops[0] == loops[1]

    merged: dict[int, tuple[int, list[int]]] = {}
    for counter in counters:
        merged.update(counter.rows)
    assert merged == straight_rows.rows  # batch for batch, with its epoch
    trained = Counter((epoch, row) for epoch, rows in merged.values() for row in rows)
    assert trained == Counter((epoch, row) for epoch, rows in straight_rows.rows.values() for row in rows)
    if CASES[name][4].get("limit") == 6:  # 6 rows, one example each: each once per epoch
        assert set(trained.values()) == {1}  # none trained twice
        assert sorted(trained)[:12] == [(epoch, row) for epoch in (0, 1) for row in range(6)]  # none lost
