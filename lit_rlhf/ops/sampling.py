"""The sampling distribution as a pure function of the logits: the sampler draws from
`filter_logits`, and the policy's log-probs replay it on their own logits, so for an exact sampler
pi_train / pi_sampler is 1. A reference or teacher scores the full vocabulary at the same
temperature (its own top-k could exclude the sampled token).
"""

from __future__ import annotations

import torch
from torch import Tensor


def apply_temperature(logits: Tensor, temperature: float, inplace: bool = False) -> Tensor:
    """`logits / temperature` (the identity at 1): the one place the sampler and every log-prob
    path apply the temperature (N+ details: one temperature, in one place). `inplace` divides
    `logits` itself (a buffer the caller owns)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if temperature == 1.0:
        return logits
    return logits.div_(temperature) if inplace else logits / temperature


def filters(top_k: int, top_p: float) -> bool:
    """Whether top-k / top-p remove anything (0 and 1.0 are off)."""
    return bool(top_k) or top_p < 1.0


def filter_logits(scores: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Next-token scores (N, V) float32 -> temperature-scaled scores (`apply_temperature`, as the
    log-probs) with the tokens outside the top-k and outside the top-p nucleus at -inf.

    Same operations, in the same order, as transformers' temperature, top-k and top-p logits
    warpers (so the same random draws pick the same tokens): top-k keeps every token scoring at
    least the k-th score; top-p drops the least likely tokens whose cumulative probability (in
    ascending order) is at most 1 - p, always keeping the most likely one (Holtzman et al. 2020).
    """
    scores = apply_temperature(scores, temperature)
    if top_k:
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[..., -1:]  # (N, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1:] = False
        scores = scores.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    return scores


def keep_targets(scores: Tensor, top_k: int, top_p: float, targets: Tensor) -> Tensor:
    """`filter_logits(scores, 1.0, top_k, top_p)` of already tempered scores (N, V), with each
    row's target (N,) kept at its own score: a token sampled from this support is in it anyway; a
    policy that moved since sampling keeps a finite log-prob (and gradient) for its token."""
    filtered = filter_logits(scores, 1.0, top_k, top_p)
    return filtered.scatter(-1, targets[:, None], scores.gather(-1, targets[:, None]))
