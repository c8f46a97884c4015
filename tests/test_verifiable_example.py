"""The verifiable-reward example (examples/verifiable_math.py): a shortened run on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from examples.verifiable_math import paired_rise, run


def test_paired_rise_interval_by_hand():
    before = [False, False, True, True]
    after = [True, True, True, False]  # differences 1, 1, 0, -1: mean 0.25, sd sqrt(11/12)
    rise, low, high = paired_rise(before, after)
    half = 1.96 * (11 / 12) ** 0.5 / 2
    assert rise == pytest.approx(0.25) and (low, high) == pytest.approx((0.25 - half, 0.25 + half))


def test_the_example_runs_end_to_end_on_the_tiny_model(tmp_path, capsys):
    torch.set_num_threads(1)
    result = run([
        "--config", "examples/verifiable_math.yaml", "--model.init_args.model=tiny-random-llama",
        "--model.init_args.total_episodes=24", "--model.init_args.max_new_tokens=4",
        "--data.init_args.test_split=test[:6]", "--data.init_args.eval_batch_size=6",
        "--data.init_args.max_prompt_length=256", f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ])
    out = capsys.readouterr().out
    assert "95% interval of the rise" in out and "test" in out
    assert result["n"] == 6 and result["steps"] == 1 and result["episodes"] == 24
    assert 0.0 <= result["before"] <= 1.0 and 0.0 <= result["after"] <= 1.0
    low, high = result["rise_95ci"]
    assert low <= result["rise"] <= high
    log_dir = tmp_path / "verifiable_math"
    assert (log_dir / "learning_curve.png").stat().st_size > 1000
    assert json.loads((log_dir / "results.json").read_text())["train_reward"] == result["train_reward"]
