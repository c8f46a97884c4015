"""DROVModule fits through the CLI with configs/ultrafeedback/drov.yaml (tiny model, bundled data)."""

from __future__ import annotations

import math
from pathlib import Path

from lit_rlhf.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ultrafeedback" / "drov.yaml"


def test_fit_on_bundled_ultrafeedback_with_two_learning_rates(tmp_path):
    cli = main([
        "fit", "--config", str(CONFIG),
        "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.dtype=float32",
        "--model.init_args.gradient_checkpointing=false", "--model.init_args.export_dir=null",
        "--model.init_args.warmup_steps=0", "--model.init_args.value_lr=3e-4",
        "--data.init_args.path=bundled:ultrafeedback", "--data.init_args.train_split=train",
        "--data.init_args.val_split=null", "--data.init_args.limit=4",
        "--data.init_args.max_prompt_length=128", "--data.init_args.max_completion_length=48",
        "--data.init_args.truncate_completions=true", "--data.init_args.batch_size=4",
    ])
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step == 3
    (optimizer,) = trainer.optimizers
    initial = {g["name"]: g["initial_lr"] for g in optimizer.param_groups}
    # the config's lr and the override, one AdamW; decay and no-decay groups named apart
    assert initial == {"policy": 1e-4, "policy/no_decay": 1e-4, "value": 3e-4, "value/no_decay": 3e-4}
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/policy/loss", "train/value/loss", "train/value/mean", "train/objective/logratio",
                "train/rewards/mean", "train/objective/dro"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    # the value network moved away from its D11 initialisation and is saved with the module
    assert any(k.startswith("value.") for k in module.state_dict())
