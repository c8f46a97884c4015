"""The learning rate is written on the same step axis as the losses it explains."""

from __future__ import annotations

import logging

import lightning as L
import torch

from callbacks import LearningRateMonitor
from lit_rlhf.modules import SFTModule
from tests.modules.test_step_logging import csv_rows, sft_loader, steps_of


def fit_steps(tmp_path, monitor):
    torch.manual_seed(0)
    module = SFTModule(model="tiny-random-llama", lr=1e-3, lr_scheduler="linear", warmup_steps=2)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path), log_every_n_steps=1,
                        callbacks=[monitor], limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, sft_loader(module.tokenizer, 4))
    rows = csv_rows(tmp_path)
    lr_name = next(k for row in rows for k, v in row.items() if k.startswith("lr-") and v)
    return steps_of(rows, "train/loss"), steps_of(rows, lr_name), [float(r[lr_name]) for r in rows if r.get(lr_name)]


def test_learning_rate_of_step_k_is_written_at_k(tmp_path):
    loss_steps, lr_steps, lrs = fit_steps(tmp_path / "ours", LearningRateMonitor(logging_interval="step"))
    assert loss_steps == lr_steps == [1, 2, 3, 4]
    assert lrs[0] < lrs[1]  # the warm-up: the first step runs below the second


def test_lightnings_monitor_is_one_step_off(tmp_path):
    """What the subclass fixes: Lightning's own monitor writes the same values one step earlier."""
    _, lr_steps, _ = fit_steps(tmp_path / "lightning", L.pytorch.callbacks.LearningRateMonitor(logging_interval="step"))
    assert lr_steps == [0, 1, 2, 3]


def test_a_run_without_a_logger_trains_and_says_so_once(caplog):
    """Lightning's monitor refuses a trainer without a logger; this one steps aside with one line."""
    module = SFTModule(model="tiny-random-llama", lr=1e-3)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, callbacks=[LearningRateMonitor()],
                        limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    with caplog.at_level(logging.WARNING, logger="callbacks.lr_monitor"):
        trainer.fit(module, sft_loader(module.tokenizer, 4))
    assert trainer.global_step == 2
    assert [r.getMessage() for r in caplog.records if r.name == "callbacks.lr_monitor"] == [
        "LearningRateMonitor: the run has no logger (trainer.logger is false), so the learning rate is not logged"]
