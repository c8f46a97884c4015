"""PassAtKCallback in a CLI fit of GRPO on the tiny model and the bundled arithmetic problems."""

from __future__ import annotations

import csv

import pytest
import torch
import yaml

import lit_rlhf.evaluation.verifiable as verifiable
from callbacks import PassAtKCallback
from lit_rlhf.cli import main


def _fit(tmp_path, **init_args):
    cfg = tmp_path / "callback.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": {"callbacks": [{"class_path": "callbacks.PassAtKCallback", "init_args": {
        "n": 2, "ks": [1, 2], "num_prompts": 3, "sampling": {"max_new_tokens": 4, "temperature": 1.0},
        "every_n_steps": 1, "at_validation_end": False, "num_resamples": 200, **init_args}}]}}))
    torch.set_num_threads(1)
    return main([
        "fit", "--config", "examples/verifiable_math.yaml", "--config", str(cfg),
        "--model.init_args.model=tiny-random-llama", "--model.init_args.total_episodes=48",
        "--model.init_args.max_new_tokens=4", "--data.init_args.max_prompt_length=256",
        f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false",
    ])


def test_logged_every_step_with_intervals(tmp_path):
    cli = _fit(tmp_path)
    callback = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PassAtKCallback))
    assert cli.trainer.global_step == 2 and [h["step"] for h in callback.history] == [1.0, 2.0]
    metrics = callback.history[-1]
    assert metrics["val/verifiable/num_problems"] == 3.0
    for name in ("avg_at_1", "pass_at_1", "maj_at_1", "avg_at_2", "pass_at_2", "maj_at_2"):
        key = f"val/verifiable/{name}"
        assert metrics[f"{key}_ci_low"] <= metrics[key] <= metrics[f"{key}_ci_high"]
        assert float(cli.trainer.callback_metrics[key]) == pytest.approx(metrics[key])
    rows = list(csv.DictReader(open(tmp_path / "verifiable_math" / "metrics.csv")))
    assert sum(bool(r.get("val/verifiable/pass_at_2")) for r in rows) == 2
    assert callback.state_dict()["history"] == callback.history


def test_values_by_hand_with_a_sampler_that_answers(tmp_path, monkeypatch):
    """Every problem's first sample right, its second "#### -1": avg 0.5, pass@2 1, maj@2 1 (tie:
    the first answer wins), maj@1 1."""
    def fake(model, tokenizer, rows, sampling, batch_size, synced_gpus=False, seed=0, engine=None):
        references = cli_refs[: len(rows) // 2]
        return [f"#### {references[i // 2]}" if i % 2 == 0 else "#### -1" for i in range(len(rows))]

    from lit_rlhf.data import QADataModule
    from lit_rlhf.models import load_tokenizer

    dm = QADataModule("bundled:arithmetic", load_tokenizer("tiny-random-llama"), chat=False, max_prompt_length=256,
                      prompt_template="Question: {question}\nAnswer:", train_split=None, test_split=None)
    cli_refs = list(dm.dataset("val")["reference"])
    monkeypatch.setattr(verifiable, "generate_completions", fake)
    cli = _fit(tmp_path, every_n_steps=2)
    callback = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PassAtKCallback))
    (metrics,) = callback.history
    assert metrics["val/verifiable/avg_at_2"] == 0.5 and metrics["val/verifiable/pass_at_1"] == 0.5
    assert metrics["val/verifiable/pass_at_2"] == 1.0 and metrics["val/verifiable/maj_at_2"] == 1.0
    assert metrics["val/verifiable/maj_at_1"] == 1.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="every k of ks must be in 1..n=2"):
        PassAtKCallback(n=2, ks=[4])
    with pytest.raises(ValueError, match="do_sample"):
        from lit_rlhf.generation import SamplingConfig

        PassAtKCallback(n=2, ks=[1], sampling=SamplingConfig(do_sample=False))
