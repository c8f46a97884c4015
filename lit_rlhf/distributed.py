"""Global statistics across data-parallel ranks, in plain `torch.distributed`.

Statistics a method defines over the batch must cover every rank's rows, or the update depends
on how the batch was split: PPO's advantage and reward whitening (D25, D24:
`global_masked_whiten`), GRPO's `scale: batch` std and batch-mean baselines (`gather_rows`, then
the pure function), sums such as KTO's counts (`all_reduce_sum`). Every helper returns its input's
value when `torch.distributed` is not initialised or has one process. They are collectives (every
rank calls them in the same order) and not differentiable.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    """True when `torch.distributed` is initialised with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Element-wise sum over ranks (a new tensor; the input is not modified)."""
    out = tensor.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def gather_rows(tensor: Tensor) -> tuple[Tensor, slice]:
    """Concatenate every rank's rows (dim 0, sizes may differ) in rank order.

    tensor: (n_r, ...) on rank r -> (sum_r n_r, ...) on every rank, and the slice of the result
    that holds this rank's rows, so a batch statistic can be computed on the global tensor and
    this rank keeps `global_result[own]`. The trailing dimensions must match across ranks.
    """
    if not is_distributed():
        return tensor.detach(), slice(0, tensor.shape[0])
    tensor = tensor.detach().contiguous()
    size = torch.tensor([tensor.shape[0]], device=tensor.device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world_size())]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]
    longest = max(counts)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    start = sum(counts[: rank()])
    return torch.cat([part[:n] for part, n in zip(parts, counts)]), slice(start, start + counts[rank()])


def global_masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of the kept elements of every rank: () tensor; 0 when no rank keeps any."""
    sums = all_reduce_sum(torch.stack([torch.where(mask, values, 0).sum().double(), mask.sum().double()]))
    return (sums[0] / sums[1].clamp(min=1)).to(values.dtype)


def global_masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the kept elements of every rank (Bessel-corrected by default): () tensor.

    Two passes (global mean, then the global sum of squared deviations), so it equals
    `lit_rlhf.ops.masked_var` on the concatenation of every rank's elements.
    """
    mean = global_masked_mean(values, mask)
    stats = all_reduce_sum(
        torch.stack([torch.where(mask, (values - mean) ** 2, 0).sum().double(), mask.sum().double()])
    )
    count = stats[1]
    if unbiased and count < 2:
        raise ValueError(f"unbiased masked variance needs at least 2 kept elements over all ranks, got {int(count)}")
    var = stats[0] / (count - 1 if unbiased else count.clamp(min=1))
    return var.to(values.dtype)


def global_masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """`lit_rlhf.ops.masked_whiten` with the mean and variance of every rank's kept elements.

    values, mask: (N, T) on each rank -> (N, T) whitened with the global moments, 0 where the
    mask is False. With one process it equals `masked_whiten`. (D24 rewards with
    `shift_mean=False`, D25 advantages.)
    """
    mean = global_masked_mean(values, mask)
    var = global_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, torch.zeros((), dtype=values.dtype, device=values.device))
