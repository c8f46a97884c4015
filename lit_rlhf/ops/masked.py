"""Masked reductions. Masks are boolean, True = keep."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is True (over all elements, or along `dim`)."""
    masked = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` where `mask` is True. An all-False mask gives 0, not NaN."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the kept elements (Bessel-corrected by default, as the N+ code does)."""
    mean = masked_mean(values, mask)
    centred_sq = (values - mean) ** 2
    var = masked_mean(centred_sq, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise ValueError(f"unbiased masked variance needs at least 2 kept elements, got {int(n)}")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten the kept elements to variance 1 (and mean 0 when `shift_mean`), as in D24/D25.

    Elements where `mask` is False are returned as 0.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, torch.zeros((), dtype=values.dtype, device=values.device))
