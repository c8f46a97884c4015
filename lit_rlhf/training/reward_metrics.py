"""Validation metrics of the reward model (`RewardModule`): pairwise accuracy, accuracy per value
of a grouping column synced across processes, and calibration against the Bradley-Terry
prediction (N+ D16, D18). Pure torch/torchmetrics and matplotlib; no model."""

from __future__ import annotations

import re
from typing import Any, Sequence

import torch
import torchmetrics
from torch import Tensor

GROUP_LABEL_BYTES = 48  # grouping values are synced across processes as fixed-width utf-8 bytes


def _encode_labels(values: Sequence[Any], n: int, device: torch.device) -> Tensor:
    """(n, GROUP_LABEL_BYTES) uint8: each value as utf-8 text, zero padded; None -> empty."""
    out = torch.zeros((n, GROUP_LABEL_BYTES), dtype=torch.uint8)
    for i, value in enumerate(values):
        raw = b"" if value is None else str(value).encode("utf-8")[:GROUP_LABEL_BYTES]
        out[i, : len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    return out.to(device)


class PreferenceRecords(torchmetrics.Metric):
    """Per-pair reward differences r_c - r_r and the `columns` of the batches' meta over an
    evaluation epoch, synced across processes (labels as fixed-width utf-8 bytes).
    `compute()` -> (diffs (N,), {column: [label] * N})."""

    full_state_update = False

    def __init__(self, columns: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)  # torchmetrics options (dist_sync_fn, process_group, ...)
        self.columns = tuple(columns)
        self.add_state("diffs", default=[], dist_reduce_fx="cat")
        for i in range(len(self.columns)):
            self.add_state(f"labels_{i}", default=[], dist_reduce_fx="cat")

    def update(self, diffs: Tensor, meta: dict[str, list[Any]]) -> None:
        n = diffs.shape[0]
        self.diffs.append(diffs.detach().float())
        for i, column in enumerate(self.columns):
            values = meta.get(column)
            if values is not None and len(values) != n:
                raise ValueError(f"meta[{column!r}] has {len(values)} values for {n} pairs")
            getattr(self, f"labels_{i}").append(_encode_labels(values or [None] * n, n, diffs.device))

    def compute(self) -> tuple[Tensor, dict[str, list[str]]]:
        diffs = torchmetrics.utilities.dim_zero_cat(self.diffs)
        groups = {}
        for i, column in enumerate(self.columns):
            encoded = torchmetrics.utilities.dim_zero_cat(getattr(self, f"labels_{i}")).cpu().tolist()
            labels = [bytes(row).rstrip(b"\0").decode("utf-8", errors="replace") for row in encoded]
            if any(labels):
                groups[column] = labels
        return diffs, groups


def grouped_accuracy(correct: Tensor, labels: Sequence[str]) -> list[tuple[str, float, int]]:
    """[(value, accuracy, count)] per non-empty label, numbers sorted numerically, else by text."""
    totals: dict[str, list[int]] = {}
    for ok, label in zip(correct.tolist(), labels):
        if label:
            entry = totals.setdefault(label, [0, 0])
            entry[0] += int(ok)
            entry[1] += 1

    def key(label: str):
        try:
            return (0, float(label), label)
        except ValueError:
            return (1, 0.0, label)

    return [(label, totals[label][0] / totals[label][1], totals[label][1]) for label in sorted(totals, key=key)]


def accuracy_table(column: str, rows: Sequence[tuple[str, float, int]]) -> str:
    """A markdown table `| column | accuracy | pairs |` (TensorBoard renders it as a table)."""
    lines = [f"| {column} | accuracy | pairs |", "|---|---|---|"]
    lines += [f"| {value} | {accuracy:.4f} | {count} |" for value, accuracy, count in rows]
    return "\n".join(lines)


def calibration_buckets(diffs: Tensor, num_bins: int) -> list[dict[str, float]]:
    """D18: up to `num_bins` equal-count buckets of pairs sorted by |r_c - r_r|, each with its mean
    `abs_diff`, `predicted` (mean sigmoid(|r_c - r_r|), the Bradley-Terry probability of ranking
    it right; a calibrated model's `accuracy` is close to it) and `count`."""
    diffs = diffs.detach().double().cpu().reshape(-1)
    if diffs.numel() == 0:
        return []
    order = diffs.abs().argsort()
    out = []
    for chunk in torch.tensor_split(order, min(num_bins, diffs.numel())):
        d = diffs[chunk]
        out.append({
            "abs_diff": float(d.abs().mean()),
            "predicted": float(torch.sigmoid(d.abs()).mean()),
            "accuracy": float((d > 0).double().mean()),
            "count": int(d.numel()),
        })
    return out


def calibration_figure(buckets: Sequence[dict[str, float]], stage: str = "val"):
    """A matplotlib figure of accuracy and predicted probability against |r_c - r_r| buckets."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 4))
    ax = fig.add_subplot(1, 1, 1)
    x = [b["abs_diff"] for b in buckets]
    ax.plot(x, [b["accuracy"] for b in buckets], "o-", label="accuracy")
    ax.plot(x, [b["predicted"] for b in buckets], "--", label="sigmoid(|r_c - r_r|)")
    ax.set_xlabel("|r_chosen - r_rejected| (bucket mean)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.0, 1.05)
    ax.set_title(f"{stage} reward calibration (D18)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def metric_safe(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", value) or "_"
