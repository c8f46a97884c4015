"""RunHealthCallback's end-of-fit report: a reward that did not move, responses cut at max_new_tokens."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from callbacks.run_health import RunHealthCallback, dead_run_report, reward_line, truncation_line
from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule
from lit_rlhf.types import Rollout

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# per-rollout mean scores of a run that learns: noisy, but the last quarter is well above the first
RISING = [0.10, 0.14, 0.08, 0.12, 0.20, 0.25, 0.22, 0.31, 0.35, 0.33, 0.41, 0.44]
# a run that does not learn: the same noise around a constant
FLAT = [0.10, 0.14, 0.08, 0.12, 0.11, 0.09, 0.13, 0.10, 0.12, 0.08, 0.11, 0.13]


def test_a_flat_reward_is_reported_and_a_rising_one_is_not():
    line = reward_line(FLAT)
    assert line is not None and line.startswith("reward did not move:")
    assert "first 3 rollouts" in line and "last 3 of 12" in line and "standard errors" in line
    assert reward_line(RISING) is None
    assert reward_line([0.5, 0.5, 0.5, 0.5]).endswith(
        "Check that the reward tells responses apart and that the policy learns (lr, KL coefficient, number of rollouts).")
    assert "every rollout scored the same" in reward_line([0.5] * 8)
    assert reward_line([0.5, 0.5, 0.6, 0.6]) is None  # a change with no noise at all moved
    assert reward_line(FLAT[:3]) is None  # too few rollouts to compare two windows


def test_truncated_responses_are_reported_with_max_new_tokens():
    counts = [8] * 8
    line = truncation_line([0.0] * 6 + [0.125, 0.0], counts, max_new_tokens=53)
    assert line == ("94% of responses were truncated at max_new_tokens=53 (no EOS; last 2 of 8 rollouts): raise "
                    "max_new_tokens, or penalise unfinished responses (callbacks.EOSTrickCallback) so the policy "
                    "learns to stop.")
    # the policy learned to stop: the last window counts, not the start of the run
    assert truncation_line([0.0] * 6 + [0.9, 0.95], counts, max_new_tokens=53) is None
    assert truncation_line([0.5] * 8, counts, max_new_tokens=53) is None
    assert "last 3 of 3 rollouts" in truncation_line([0.0] * 3, [8] * 3, max_new_tokens=4)  # a short run: all of it


def test_the_report_is_empty_for_a_healthy_run_and_names_both_problems_of_a_dead_one():
    assert dead_run_report(RISING, [0.9] * 12, [16] * 12, 53) == []
    lines = dead_run_report(FLAT, [0.02] * 12, [16] * 12, 24)
    assert [line.split(":")[0] for line in lines] == ["reward did not move", "98% of responses were truncated at max_new_tokens=24 (no EOS; last 3 of 12 rollouts)"]


def _rollout(scores: list[float], eos: float) -> Rollout:
    n = len(scores)
    has_eos = torch.arange(n) < round(eos * n)
    empty = torch.zeros(n, 1)
    return Rollout(empty.long(), empty.bool(), empty.long(), empty.bool(), has_eos, None,
                   scores=torch.tensor(scores))


def test_the_callback_reports_at_fit_end_from_its_rollouts_and_a_resume_keeps_them(caplog):
    trainer = SimpleNamespace(is_global_zero=True)
    module = SimpleNamespace(repeats=1, sampling=SimpleNamespace(max_new_tokens=24))
    healthy, dead = RunHealthCallback(), RunHealthCallback()
    for i, mean in enumerate(RISING):
        healthy.on_rollout_end(trainer, module, _rollout([mean - 0.05, mean + 0.05], eos=1.0))
        dead.on_rollout_end(trainer, module, _rollout([FLAT[i] - 0.05, FLAT[i] + 0.05], eos=0.0))
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        healthy.on_fit_end(trainer, module)
    assert caplog.text == ""
    resumed = RunHealthCallback()
    resumed.load_state_dict(dead.state_dict())  # checkpoints carry the rollouts' history
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        resumed.on_fit_end(trainer, module)
    assert "reward did not move" in caplog.text
    assert "100% of responses were truncated at max_new_tokens=24" in caplog.text


PROMPTS = ["hello there", "what is", "tell me a story", "x", "abc", "The cat", "Q: 2+2?", "once"]


def constant_reward(prompts, completions, **columns):
    return [0.5 for _ in completions]


def test_a_tiny_dead_run_says_so_at_fit_end(tmp_path, caplog):
    """The tiny random model rarely samples EOS in 4 tokens, and a constant reward never moves."""
    torch.manual_seed(0)
    module = GRPOModule(model="tiny-random-llama", reward_fns=[constant_reward], num_generations=2, max_new_tokens=4,
                        total_episodes=16, log_completions_every_n_steps=0)
    rows = [{"_prompt_ids": module.tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    loader = DataLoader(rows, batch_size=2, collate_fn=PromptCollator(module.tokenizer.pad_token_id))
    trainer = L.Trainer(max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[RunHealthCallback()])
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        trainer.fit(module, loader)
    assert module.rollouts == 4
    assert "reward did not move: the optimised reward (train/objective/scores) went from 0.5" in caplog.text
    assert "every rollout scored the same" in caplog.text
    assert "% of responses were truncated at max_new_tokens=4 (no EOS; last 2 of 4 rollouts)" in caplog.text


def test_a_module_that_does_not_learn_from_scores_gets_no_score_warning(caplog):
    """Pure distillation logs the task reward only: equal scores are no dead run; truncation still is."""
    trainer = SimpleNamespace(is_global_zero=True)
    module = SimpleNamespace(repeats=2, sampling=SimpleNamespace(max_new_tokens=24), learns_from_scores=False)
    callback = RunHealthCallback(patience=2)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        for _ in range(8):
            callback.on_rollout_end(trainer, module, _rollout([0.0, 0.0], eos=1.0))
        callback.on_fit_end(trainer, module)
    assert caplog.text == "" and callback.scores == [0.0] * 8
    truncated = RunHealthCallback(patience=2)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        for _ in range(8):
            truncated.on_rollout_end(trainer, module, _rollout([0.0, 0.0], eos=0.0))
        truncated.on_fit_end(trainer, module)
    assert "dead run?" not in caplog.text and "reward did not move" not in caplog.text
    assert "100% of responses were truncated at max_new_tokens=24" in caplog.text
    learning = SimpleNamespace(repeats=2, sampling=SimpleNamespace(max_new_tokens=24))  # the default: it learns
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        for _ in range(8):
            RunHealthCallback(patience=2).on_rollout_end(trainer, learning, _rollout([0.0, 0.0], eos=1.0))
        warned = RunHealthCallback(patience=2)
        for _ in range(3):
            warned.on_rollout_end(trainer, learning, _rollout([0.0, 0.0], eos=1.0))
    assert "dead run?" in caplog.text
