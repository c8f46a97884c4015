"""The optimiser every module builds (`TrainingModule.configure_optimizers`): parameter groups
(`decay_groups`) and AdamW (`build_adamw`); the schedule and the clipping are `TrainingModule`'s.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from lit_rlhf.training.in_backward import InBackwardAdamW

SchedulerName = Literal["cosine", "linear", "constant"]


def decay_groups(module: nn.Module, weight_decay: float, name: str | None = None, **extra: Any) -> list[dict[str, Any]]:
    """Split trainable parameters into decayed (matrices) and non-decayed (biases, norms) groups.

    With `name`, the groups are named `name` and `name/no_decay` (distinct names: Lightning's
    `LearningRateMonitor` logs one learning rate per named group and refuses duplicates)."""
    decay, no_decay = [], []
    for param in module.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    names = ({"name": name}, {"name": f"{name}/no_decay"}) if name is not None else ({}, {})
    groups = [
        {"params": decay, "weight_decay": weight_decay, **names[0], **extra},
        {"params": no_decay, "weight_decay": 0.0, **names[1], **extra},
    ]
    return [g for g in groups if g["params"]]


def offloads_optimizer(trainer: Any) -> bool:
    """True when the trainer's DeepSpeed strategy keeps the optimizer states in CPU memory."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = getattr(trainer, "strategy", None) if trainer is not None else None
    if not isinstance(strategy, DeepSpeedStrategy):
        return False
    offload = (strategy.config or {}).get("zero_optimization", {}).get("offload_optimizer") or {}
    return offload.get("device", "none") not in ("none", None)


def build_adamw(param_groups: list[dict[str, Any]], trainer: Any = None, clips: bool = False, in_backward: bool = False,
                **hyper: Any) -> torch.optim.Optimizer:
    """AdamW over `param_groups` (`lr`, `eps`, `betas`, `weight_decay` in `hyper`): DeepSpeed's CPU
    Adam when ZeRO offloads the optimizer; else torch's, fused when every parameter is a float
    tensor on CPU or CUDA (no parameter-sized temporaries), but per-tensor under fp16 with
    clipping (`clips`: the GradScaler unscales before clipping, which the fused kernel cannot);
    an `InBackwardAdamW` (`in_backward`), otherwise the same."""
    if offloads_optimizer(trainer):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(param_groups, adamw_mode=True, **hyper)
    params = [p for group in param_groups for p in group["params"]]
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    if clips and getattr(getattr(trainer, "precision_plugin", None), "scaler", None) is not None:
        fused = False  # fp16: clip after the GradScaler unscales, which needs the non-fused step
    if in_backward:
        return InBackwardAdamW(param_groups, fused=fused or None, **hyper)
    return torch.optim.AdamW(param_groups, fused=fused or None, **hyper)
