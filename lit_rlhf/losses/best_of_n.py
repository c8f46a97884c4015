"""Best-of-N sampling and rejection-sampling fine-tuning (Lambert, "RLHF", ch. 10, Rejection
Sampling; Touvron et al. 2023, Llama 2, Sec. 3.2.3; Dong et al. 2023, RAFT).

`best_of_n_kl(n)`: the best-of-n distribution's KL to the base policy, log n - (n-1)/n (Stiennon
et al. 2020; Gao et al. 2023), an upper bound exact without ties (Beirami et al. 2024, "Theoretical
guarantees on the best-of-n alignment policy"). `rejection_sampling_mask`: the kept samples; the
fine-tuning step on them is SFT (`losses.nll_loss`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

Selection = Literal["per_prompt", "top_k"]


def best_of_n_kl(n: int) -> float:
    """KL(pi_best-of-n || pi) = log n - (n - 1) / n nats (0 at n = 1, then growing like log n).

    Derivation: with continuous rewards the best of n samples has the reward quantile
    u ~ Beta(n, 1), density n u^(n-1), so the best-of-n distribution is n F(y)^(n-1) pi(y) and
    its KL to pi is E[log n + (n - 1) log u] = log n + (n - 1) * (-1/n).

    Args:
        n: the number of samples the best is chosen from, >= 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def rejection_sampling_mask(scores: Tensor, group_size: int, selection: Selection = "per_prompt",
                            top_k: int | None = None) -> Tensor:
    """(N,) bool, True on the kept samples.

    `per_prompt`: the best sample of each prompt (the first one on a tie); `top_k`: the `top_k`
    highest scores of the whole rollout, any prompt (the earlier row on a tie).

    Args:
        scores: (N,) one reward per sample, each prompt's `group_size` samples contiguous.
        group_size: the samples per prompt.
        selection: `per_prompt` or `top_k` (above).
        top_k: how many samples `top_k` keeps; unused by `per_prompt`.
    """
    n = scores.shape[0]
    kept = torch.zeros(n, dtype=torch.bool, device=scores.device)
    if selection == "per_prompt":
        if n % group_size:
            raise ValueError(f"{n} scores do not split into groups of {group_size}")
        best = scores.view(-1, group_size).argmax(dim=1)  # (B,) first maximum of each group
        kept[torch.arange(0, n, group_size, device=scores.device) + best] = True
    elif selection == "top_k":
        if top_k is None or not 1 <= top_k <= n:
            raise ValueError(f"top_k must be in [1, {n}] for selection 'top_k', got {top_k}")
        order = torch.sort(scores, descending=True, stable=True).indices
        kept[order[:top_k]] = True
    else:
        raise ValueError(f"selection must be 'per_prompt' or 'top_k', got {selection!r}")
    return kept
