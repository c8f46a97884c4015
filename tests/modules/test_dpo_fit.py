"""DPOModule fits through the CLI with configs/tldr/dpo.yaml (tiny model, small data)."""

from __future__ import annotations

import math
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger

from lit_rlhf.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tldr" / "dpo.yaml"
TRAIN_KEYS = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"]


def fit(tmp_path, *overrides: str):
    return main([
        "fit", "--config", str(CONFIG),
        "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.export_dir=null",
        "--model.init_args.warmup_steps=1",
        "--data.init_args.max_prompt_length=320", "--data.init_args.max_completion_length=64",
        "--data.init_args.truncate_completions=true",
        "--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2", "--data.init_args.on_bad_rows=skip",
        *overrides,
    ])


def test_fit_with_precomputed_reference_on_the_real_tldr_sample(tmp_path, tldr_comparisons_sample):
    cli = fit(tmp_path, f"--data.init_args.path={tldr_comparisons_sample}", "--data.init_args.name=null",
              "--data.init_args.val_split=null", "--data.init_args.limit=12")
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step == 2
    assert module.precompute_ref_logps and not hasattr(module, "ref_model")  # the reference was freed
    assert len(module.ref_logps_cache) >= 2 * 4  # chosen + rejected of the precomputed rows
    metrics = trainer.callback_metrics
    for key in ["train/loss"] + [f"train/{k}" for k in TRAIN_KEYS]:
        assert key in metrics and math.isfinite(float(metrics[key])), key


def test_fit_with_live_reference_bundled_data_and_validation(tmp_path):
    logger = ["--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger", f"--trainer.logger.save_dir={tmp_path}"]
    cli = fit(tmp_path, "--data.init_args.path=bundled:tldr_comparisons", "--data.init_args.limit=8",
              "--model.init_args.precompute_ref_logps=false", "--model.init_args.loss_type=ipo",
              "--model.init_args.nll_coef=0.1", *logger)
    module, trainer = cli.model, cli.trainer
    assert isinstance(trainer.logger, TensorBoardLogger)
    assert trainer.global_step == 2 and hasattr(module, "ref_model")
    metrics = trainer.callback_metrics
    for key in [f"val/{k}" for k in TRAIN_KEYS] + ["train/loss/nll", "val/loss"]:
        assert key in metrics and math.isfinite(float(metrics[key])), key
