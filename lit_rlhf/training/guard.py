"""The non-finite guard's pieces: which tensors and gradients are not finite, and the errors.

`TrainingModule.check_finite` and `gradients_finite` (`lit_rlhf.training.base`) use these so
that no NaN/inf loss, reward, advantage or gradient reaches the weights (`on_nonfinite`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def nonfinite_rows_message(name: str, tensor: Tensor, batch: Any, where_in_run: str) -> str:
    """What a non-finite `tensor` (named `name`) says: its bad rows (with the dataset row ids of
    `batch.meta["index"]` when the batch carries them) and its first values."""
    rows = []
    if tensor.ndim >= 1:
        bad = ~torch.isfinite(tensor.detach()).reshape(tensor.shape[0], -1).all(dim=1)
        rows = bad.nonzero().flatten().tolist()
    ids = (getattr(batch, "meta", None) or {}).get("index")
    where = f"batch rows {rows}" + (f" (dataset rows {[ids[i] for i in rows if i < len(ids)]})" if ids else "")
    return f"non-finite {name} at {where_in_run}: {where}; values: {tensor.detach().flatten()[:8].tolist()}"


def nonfinite_grad_names(module: nn.Module) -> list[str]:
    """Names of the parameters whose gradient has a NaN/inf (one host sync when all are finite)."""
    named = [(n, p.grad) for n, p in module.named_parameters() if p.grad is not None]
    # a NaN/inf anywhere makes the sum non-finite: one read per gradient, no mask allocated
    if not named or bool(torch.isfinite(torch.stack([g.sum(dtype=torch.float32) for _, g in named])).all()):
        return []
    return [n for n, g in named if not bool(torch.isfinite(g).all())]


class NonFiniteError(FloatingPointError):
    """A NaN/inf loss, reward, advantage or gradient was about to reach the weights."""


class SkipStep(Exception):
    """Raised inside the optimizer closure to skip one step (caught in `optimizer_step`)."""
