"""The sampling distribution as a pure function of the logits, shared by the sampler and the
trainer: the sampler draws from `filter_logits` (`lit_rlhf.generation.hf`), and the trainer's
log-probs replay it on their own logits (`lit_rlhf.ops.logprobs.filtered_token_logps`, the
chunked output layer `lit_rlhf.ops.linear_logprobs`), so for an exact sampler the ratio
pi_train / pi_sampler is 1 (vLLM's `processed_logprobs` are of the same distribution). One rule: every log-prob of the
policy is of the distribution sampled; a reference or teacher scores the full vocabulary at the
same temperature (its own top-k could exclude the sampled token).
"""

from __future__ import annotations

import torch
from torch import Tensor


def apply_temperature(logits: Tensor, temperature: float, inplace: bool = False) -> Tensor:
    """`logits / temperature`: the sampling temperature applied to logits (the identity at 1).

    The one function that applies it, wherever logits meet the temperature: the sampler
    (`lit_rlhf.ops.sampling.filter_logits`), the dense log-probs (`token_logps_from_logits`), the
    chunked output layer (`lit_rlhf.ops.linear_logprobs`, whose backward scales the gradient by the
    same map, the derivative of this linear one) and the shared-prompt layout's dense path. So the
    log-probs of the ratios and of the KL are those of the distribution that was sampled (N+
    details, `docs/ARCHITECTURE.md`: one temperature, applied in one place). `inplace` divides
    `logits` itself (a buffer the caller owns).
    """
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
