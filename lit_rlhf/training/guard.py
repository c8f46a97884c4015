"""The non-finite guard: no NaN/inf loss, reward, advantage or gradient reaches the weights.

`TrainingModule.check_finite`, `gradients_finite` and `optimizer_step` (`lit_rlhf.training.base`)
call `check_finite`, `gradients_finite` and `guarded_step` with the module; a non-finite value
raises `NonFiniteError` (`on_nonfinite: error`) or counts a skipped step (`skip`, `nonfinite`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.lightning_compat import attached_trainer

log = logging.getLogger(__name__)


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


def check_finite(module: Any, batch: Any, tensors: dict[str, Tensor | None]) -> bool:
    """True when every given tensor is finite; else `nonfinite` with its bad rows, and False."""
    for name, tensor in tensors.items():
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            where = f"global step {module.global_step} (epoch {module.current_epoch})"
            nonfinite(module, nonfinite_rows_message(name, tensor, batch, where))
            return False
    return True


def nonfinite(module: Any, message: str) -> None:
    """Raise `NonFiniteError` (`on_nonfinite: error`) or count and log a skipped step (`skip`)."""
    if module.on_nonfinite == "error":
        raise NonFiniteError(message + ". Set on_nonfinite: skip to skip such steps instead.")
    module.skipped_steps += 1
    log.warning("skipping the optimizer step: %s (%d skipped so far)", message, module.skipped_steps)
    if attached_trainer(module) is not None:
        module.log("train/guard/skipped_steps", float(module.skipped_steps), on_step=True, on_epoch=False)


def gradients_finite(module: Any) -> bool:
    """Every gradient checked as `check_finite` checks tensors; True under fp16's GradScaler."""
    if attached_trainer(module) is not None and getattr(module.trainer.precision_plugin, "scaler", None) is not None:
        return True
    bad = nonfinite_grad_names(module)
    if not bad:
        return True
    more = " ..." if len(bad) > 5 else ""
    nonfinite(module, f"non-finite gradient at global step {module.global_step} in {bad[:5]}{more}")
    return False


def guarded_step(module: Any, optimizer: Any, optimizer_closure: Any = None) -> None:
    """`optimizer.step` with the closure, skipped when `module.gradients_finite()` refuses them."""

    def guarded_closure():
        loss = optimizer_closure() if optimizer_closure is not None else None
        if not module.gradients_finite():
            optimizer.zero_grad()
            raise SkipStep
        return loss

    try:
        optimizer.step(closure=guarded_closure)
    except SkipStep:
        pass
