"""KTOModule fits through the CLI with configs/ultrafeedback/kto.yaml (tiny model, bundled data)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lit_rlhf.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ultrafeedback" / "kto.yaml"


def fit(tmp_path, *overrides):
    return main([
        "fit", "--config", str(CONFIG),
        "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.dtype=float32",
        "--model.init_args.memory.gradient_checkpointing=false", "--model.init_args.export_dir=null",
        "--model.init_args.warmup_steps=1", "--model.init_args.lr=1e-3",
        "--data.init_args.path=bundled:ultrafeedback", "--data.init_args.train_split=train",
        "--data.init_args.val_split=null", "--data.init_args.limit=4",
        "--data.init_args.max_prompt_length=128", "--data.init_args.max_completion_length=48",
        "--data.init_args.truncate_completions=true", "--data.init_args.batch_size=4", *overrides,
    ])


def test_fit_on_bundled_ultrafeedback_with_labels_from_rewards(tmp_path):
    cli = fit(tmp_path)
    module, trainer = cli.model, cli.trainer
    assert module.labels_from == "rewards"
    assert trainer.global_step == 3
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/rewards/desirable", "train/rewards/undesirable", "train/objective/kl",
                "train/data/desirable_fraction"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert float(metrics["train/objective/kl"]) >= 0.0
    assert 0.0 < float(metrics["train/data/desirable_fraction"]) < 1.0  # mean split of a batch's rewards
    ratio, cumulative = float(metrics["train/data/weight_ratio"]), float(metrics["train/data/weight_ratio_cumulative"])
    assert ratio == pytest.approx(float(metrics["train/data/num_desirable"]) / float(metrics["train/data/num_undesirable"]))
    assert math.isfinite(cumulative) and cumulative > 0


def test_weight_ratio_outside_the_papers_range_warns_once(tmp_path, caplog):
    # desirable_weight 3 on a mean split of the rewards: lambda_D n_D / (lambda_U n_U) ~ 3 > 4/3
    with caplog.at_level("WARNING", logger="lit_rlhf.modules.kto"):
        cli = fit(tmp_path, "--trainer.max_steps=-1", "--trainer.max_epochs=1", "--model.init_args.desirable_weight=3.0")
    warnings = [r.getMessage() for r in caplog.records if "outside [1, 4/3]" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "desirable_weight:" in warnings[0]
    assert float(cli.trainer.callback_metrics["train/data/weight_ratio_cumulative"]) > 4 / 3
