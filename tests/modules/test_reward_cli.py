"""RewardModule through the CLI with configs/tldr/reward.yaml on the real TL;DR comparisons sample.

Overrides: the tiny model, the shared sample as data (rows [:12] train, [12:28] validation),
small max lengths (the byte tokenizer makes one token per character), 3 steps, 2 validation
batches, and the D15 callback pointed at the bundled TL;DR SFT sample. The per-`batch` and
per-`confidence` accuracy tables must reach TensorBoard.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from lit_rlhf.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tldr" / "reward.yaml"


def _config_for_test(tmp_path: Path) -> Path:
    """The shipped config with its D15 callback pointed at bundled data (lists cannot be patched
    from the command line) and checkpoints under tmp_path; everything else is as shipped."""
    config = yaml.safe_load(CONFIG.read_text())
    for cb in config["trainer"]["callbacks"]:
        if cb["class_path"] == "callbacks.RewardNormalizationCallback":
            cb["init_args"].update(path="bundled:tldr_sft", split="train", limit=6, batch_size=3)
        if cb["class_path"].endswith("ModelCheckpoint"):
            cb["init_args"]["dirpath"] = str(tmp_path / "checkpoints")
    out = tmp_path / "reward.yaml"
    out.write_text(yaml.safe_dump(config))
    return out


def test_cli_fit_on_the_tldr_comparisons_sample_logs_group_tables(tmp_path, tldr_comparisons_sample):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = main([
        "fit", "--config", str(_config_for_test(tmp_path)),
        "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path / "tb"),
        "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1",
        "--trainer.num_sanity_val_steps=0",
        "--model.init_args.model=tiny-random-llama", f"--model.init_args.export_dir={tmp_path / 'hf_model'}",
        "--model.init_args.lr=1e-4",
        f"--data.init_args.path={tldr_comparisons_sample}", "--data.init_args.name=null",
        "--data.init_args.train_split=train[:12]", "--data.init_args.val_split=train[12:28]",
        "--data.init_args.max_prompt_length=300", "--data.init_args.max_completion_length=96",
        "--data.init_args.truncate_completions=true",
        "--data.init_args.batch_size=4", "--data.init_args.eval_batch_size=8",
    ])
    module, trainer = cli.model, cli.trainer
    assert type(module).__name__ == "RewardModule" and trainer.global_step == 3
    assert module.hparams.adam_eps == 1e-5 and module.hparams.lr_scheduler == "cosine"  # from the YAML
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for key in ("train/loss", "val/loss", "val/rewards/accuracy", "val/rewards/chosen", "val/rewards/rejected",
                "val/rewards/margins", "val/calibration/ece"):
        assert key in metrics and math.isfinite(metrics[key]), key
    by_batch = [k for k in metrics if k.startswith("val/accuracy_by_batch/")]
    by_conf = [k for k in metrics if k.startswith("val/accuracy_by_confidence/")]
    assert by_batch and len(by_conf) >= 2, sorted(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in by_batch + by_conf)

    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    table = acc.Tensors("val/accuracy_by_batch/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert table.startswith("| batch | accuracy | pairs |") and "| batch13 |" in table
    assert "val/accuracy_by_confidence/text_summary" in tags["tensors"]
    assert "val/calibration" in tags["images"]
    assert set(by_batch) <= set(tags["scalars"])

    # D15 on the bundled SFT references, then the export (which carries the new bias)
    norm = next(cb for cb in trainer.callbacks if type(cb).__name__ == "RewardNormalizationCallback")
    assert norm.stats["num_references"] == 6 and abs(norm.stats["mean_after"]) < 1e-6
    assert (tmp_path / "checkpoints" / "reward-normalized.ckpt").is_file()
    assert (tmp_path / "hf_model" / "config.json").is_file()


def test_cli_fit_ultrafeedback_config_with_data_margins(tmp_path):
    cfg = Path(__file__).resolve().parents[2] / "configs" / "ultrafeedback" / "reward.yaml"
    cli = main([
        "fit", "--config", str(cfg),
        "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.accumulate_grad_batches=1", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.dtype=float32",
        "--model.init_args.memory.gradient_checkpointing=false", "--model.init_args.export_dir=null",
        "--model.init_args.use_margin=true",
        "--data.init_args.path=bundled:ultrafeedback_binarized", "--data.init_args.margin_from=score_difference",
        "--data.init_args.limit=8", "--data.init_args.batch_size=2",
    ])
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step == 2 and module.hparams.use_margin
    batch = next(iter(trainer.datamodule.train_dataloader()))
    assert batch.margin is not None and batch.margin.shape == (batch.num_pairs,)
    metrics = trainer.callback_metrics
    for key in ("train/loss", "val/loss", "val/rewards/accuracy", "val/calibration/ece"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert not [k for k in metrics if "accuracy_by_" in k]  # group_columns: [] in this config
