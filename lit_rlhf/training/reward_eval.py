"""Validation and test of a reward model on preference pairs (`PairEvaluationMixin`), correct under
DDP: `{stage}/loss` and `{stage}/rewards/{accuracy,chosen,rejected,margins}`; the accuracy per
value of each grouping column of `batch.meta` (D16: `{stage}/accuracy_by_<column>/<value>` and a
TensorBoard table) and per evaluation split (`{stage}/<split>/accuracy`); calibration (D18:
`{stage}/calibration/ece` and a figure). The module calls `init_pair_evaluation` and defines
`_loss(batch) -> (RewardLossOutput, chosen, rejected)`.
"""

from __future__ import annotations

from typing import Sequence

import torchmetrics
from torch import nn

from lit_rlhf.training.reward_metrics import (
    PreferenceRecords,
    accuracy_table,
    calibration_buckets,
    calibration_figure,
    grouped_accuracy,
    metric_safe,
)
from lit_rlhf.types import PreferenceBatch

EVAL_SPLIT = "eval_split"  # meta column naming the evaluation split of each pair
STAGES = ("val", "test")


class PairEvaluationMixin:
    """Validation and test steps of a pairwise reward model: running metrics, grouped accuracy
    (D16), per-split accuracy and calibration (D18)."""

    def init_pair_evaluation(self, group_columns: Sequence[str], calibration_bins: int) -> None:
        """The metric states of both stages (`group_columns`: D16; `calibration_bins`: D18)."""
        if calibration_bins < 1:
            raise ValueError(f"calibration_bins must be >= 1, got {calibration_bins}")
        self.group_columns, self.calibration_bins = tuple(group_columns), calibration_bins
        names = ("loss", "accuracy", "chosen", "rejected", "margins")
        self.eval_metrics = nn.ModuleDict({stage: nn.ModuleDict({name: torchmetrics.MeanMetric() for name in names})
                                           for stage in STAGES})
        # the named evaluation splits (meta "eval_split") get their own `{stage}/{split}/accuracy`
        record_columns = self.group_columns + (() if EVAL_SPLIT in self.group_columns else (EVAL_SPLIT,))
        self.eval_records = nn.ModuleDict({stage: PreferenceRecords(record_columns) for stage in STAGES})

    def _eval_step(self, batch: PreferenceBatch, stage: str) -> None:
        out, chosen, rejected = self._loss(batch)
        n = batch.num_pairs
        diff = (chosen - rejected).detach()  # (B,)
        metrics = self.eval_metrics[stage]
        for name, value in (("loss", out.loss.detach()), ("accuracy", out.accuracy), ("chosen", out.chosen_mean),
                            ("rejected", out.rejected_mean), ("margins", out.margin_mean)):
            metrics[name].update(value, weight=n)
            key = f"{stage}/loss" if name == "loss" else f"{stage}/rewards/{name}"
            self.log(key, metrics[name], on_step=False, on_epoch=True, prog_bar=name in ("loss", "accuracy"), batch_size=n)
        self.eval_records[stage].update(diff, batch.meta or {})

    def validation_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_records("val")

    def on_test_epoch_end(self) -> None:
        self._log_records("test")

    def _log_records(self, stage: str) -> None:
        """Grouped accuracy (D16), per-split accuracy and calibration (D18) of the stage's pairs."""
        records = self.eval_records[stage]
        if records.update_count == 0:
            return
        diffs, groups = records.compute()  # synced over processes: identical on every rank
        records.reset()
        correct = diffs > 0  # (N,) ties count as wrong, as in the loss's accuracy
        tables = {}
        for column, labels in groups.items():
            rows = grouped_accuracy(correct, labels)
            split = column == EVAL_SPLIT and column not in self.group_columns  # `{stage}/{split}/accuracy`
            if rows and not split:
                tables[column] = rows
            for value, accuracy, count in rows:
                name = f"{stage}/{metric_safe(value)}/accuracy" if split else f"{stage}/accuracy_by_{column}/{metric_safe(value)}"
                self.log(name, accuracy, on_step=False, on_epoch=True, sync_dist=False, batch_size=count)
        buckets = calibration_buckets(diffs, self.calibration_bins)
        ece = sum(b["count"] * abs(b["accuracy"] - b["predicted"]) for b in buckets) / max(1, diffs.numel())
        self.log(f"{stage}/calibration/ece", ece, on_step=False, on_epoch=True, sync_dist=False)
        if self.attached_trainer is None or self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        from lightning.pytorch.loggers import TensorBoardLogger

        for experiment in [lg.experiment for lg in self.trainer.loggers if isinstance(lg, TensorBoardLogger)]:
            for column, rows in tables.items():
                experiment.add_text(f"{stage}/accuracy_by_{column}", accuracy_table(column, rows), self.global_step)
            experiment.add_figure(f"{stage}/calibration", calibration_figure(buckets, stage), self.global_step, close=True)
