"""What the non-finite guard of `TrainingModule` (`check_finite`, `gradients_finite`,
`optimizer_step`) raises (`on_nonfinite: error`) and reports.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


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


class NonFiniteError(FloatingPointError):
    """A NaN/inf loss, reward, advantage or gradient was about to reach the weights."""


class SkipStep(Exception):
    """Raised inside the optimizer closure to skip one step (caught in `optimizer_step`)."""
