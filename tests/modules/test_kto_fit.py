"""KTOModule fits through the CLI with configs/ultrafeedback/kto.yaml (tiny model, bundled data)."""

from __future__ import annotations

import math
from pathlib import Path

from lit_rlhf.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ultrafeedback" / "kto.yaml"


def test_fit_on_bundled_ultrafeedback_with_labels_from_rewards(tmp_path):
    cli = main([
        "fit", "--config", str(CONFIG),
        "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.dtype=float32",
        "--model.init_args.gradient_checkpointing=false", "--model.init_args.export_dir=null",
        "--model.init_args.warmup_steps=1", "--model.init_args.lr=1e-3",
        "--data.init_args.path=bundled:ultrafeedback", "--data.init_args.limit=4",
        "--data.init_args.max_prompt_length=128", "--data.init_args.max_completion_length=48",
        "--data.init_args.truncate_completions=true", "--data.init_args.batch_size=4",
    ])
    module, trainer = cli.model, cli.trainer
    assert module.labels_from == "rewards"
    assert trainer.global_step == 3
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/rewards/desirable", "train/rewards/undesirable", "train/objective/kl",
                "train/data/desirable_fraction"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert float(metrics["train/objective/kl"]) >= 0.0
    assert 0.0 < float(metrics["train/data/desirable_fraction"]) < 1.0  # mean split of a batch's rewards
