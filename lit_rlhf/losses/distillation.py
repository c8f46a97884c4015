"""On-policy distillation losses over the student's own sampled responses (Agarwal et al. 2024,
"On-Policy Distillation of Language Models", GKD; Thinking Machines, "On-Policy Distillation",
2025; Qwen3 technical report, Sec. 4.5): the policy-gradient form on the sampled reverse KL
(`reverse_kl_advantages`, `distillation_pg_loss`) and the supervised form, GKD's generalized JSD
(`generalized_jsd`, `gkd_loss`, `chunked_gkd_loss`). pi_s the student, pi_t the teacher, M the
response mask; the equations are in `docs/methods/distillation.md`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from lit_rlhf.losses.orpo import log1mexp
from lit_rlhf.ops import masked_mean
from lit_rlhf.ops.logprobs import apply_temperature

LOG_FLOOR = -1e4  # log-probabilities are floored here: exp() is exactly 0 and every difference finite


class DistillationPGOutput(NamedTuple):
    loss: Tensor  # scalar, with gradient
    reverse_kl: Tensor  # detached: the sampled per-token estimate mean_t (log pi_s - log pi_t) over M
    advantage_mean: Tensor  # detached: mean of the advantages over M
    distill_advantage_mean: Tensor  # detached: mean of the distillation part (the discounted -KL returns)


class GKDLossOutput(NamedTuple):
    loss: Tensor  # scalar, with gradient: the token mean of the divergence over M
    divergence: Tensor  # (B, T) detached per-token divergence, 0 off the mask
    tail_mass: Tensor  # detached: the teacher's mean mass outside its top-k over M (0 on the full vocabulary)


def _at_least_float32(x: Tensor) -> Tensor:
    return x if x.dtype == torch.float64 else x.float()


def reverse_kl_advantages(student_logps: Tensor, teacher_logps: Tensor, mask: Tensor, gamma: float = 0.0) -> Tensor:
    """Per-token distillation advantages (B, T), no gradient.

    r_t = -(log pi_s(y_t) - log pi_t(y_t)) on the tokens of `mask`, 0 elsewhere (a sampled
    estimate of -KL(pi_s || pi_t) at position t); A_t = sum_{k >= t} gamma^(k - t) r_k, the
    discounted return over the response's later tokens (gamma 0: A_t = r_t; gamma 1: the
    reverse KL of the rest of the sequence, the whole-sequence KL's REINFORCE reward-to-go).

    Args:
        student_logps: (B, T) the student's log-probs of the sampled tokens.
        teacher_logps: (B, T) the teacher's log-probs of the same tokens.
        mask: (B, T) bool, the response tokens.
        gamma: discount of the later tokens' rewards, in [0, 1].
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    rewards = torch.where(mask, -(student_logps.detach().float() - teacher_logps.detach().float()), 0.0)  # (B, T)
    if gamma == 0.0:
        return rewards
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return torch.where(mask, returns, 0.0)


def distillation_pg_loss(
    logps: Tensor,
    teacher_logps: Tensor | None,
    mask: Tensor,
    gamma: float = 0.0,
    task_advantages: Tensor | None = None,
    reward_weight: float = 0.0,
    ref_logps: Tensor | None = None,
    kl_coef: float = 0.0,
    is_weights: Tensor | None = None,
) -> DistillationPGOutput:
    """REINFORCE on the student's sampled tokens with the distillation advantage held fixed:

    A_t = reverse_kl_advantages(logps, teacher_logps, mask, gamma)_t
          + reward_weight * task_advantages            (one per row, broadcast to its tokens)
          - kl_coef * (log pi_s(y_t) - log pi_ref(y_t))  (k1 penalty to a reference, per token)
    L = -sum(M * w * sg(A) * logps) / sum(M): a mean over the batch's response tokens, so over
    micro-batches it is exact when each is weighted by its share of the tokens. w: the truncated
    importance weights min(pi_train / pi_sampler, C) of samples drawn by another engine or an
    older student (`is_weights`, (B, T), held fixed; None: 1, the samples are the student's own).

    Args:
        logps: (B, T) the student's log-probs of its sampled tokens, with gradient (on-policy: also the
            sampling log-probs in A).
        teacher_logps: (B, T) the teacher's; None: no distillation part (`reverse_kl` is then 0).
        mask: (B, T) bool, the response tokens.
        gamma: discount of `reverse_kl_advantages`.
        task_advantages: (B,) one task advantage per row, or None.
        reward_weight: weight of `task_advantages` in A.
        ref_logps: (B, T) the reference's log-probs, needed when kl_coef > 0.
        kl_coef: weight of the k1 penalty to the reference.
        is_weights: (B, T) truncated importance weights, held fixed; None: 1 (the student's own samples).
    """
    if teacher_logps is None:
        distill = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    else:
        distill = reverse_kl_advantages(logps, teacher_logps, mask, gamma)  # (B, T)
    advantages = distill
    if reward_weight:
        if task_advantages is None:
            raise ValueError("reward_weight > 0 needs task_advantages (one per row)")
        advantages = advantages + reward_weight * task_advantages.detach().float()[:, None]
    if kl_coef:
        if ref_logps is None:
            raise ValueError("kl_coef > 0 needs ref_logps")
        advantages = advantages - kl_coef * (logps.detach().float() - ref_logps.float())
    advantages = torch.where(mask, advantages, 0.0)
    weighted = advantages if is_weights is None else advantages * is_weights.detach().float()
    loss = -masked_mean(weighted * logps, mask)
    reverse_kl = distill.new_zeros(()) if teacher_logps is None else masked_mean(logps.detach().float() - teacher_logps.float(), mask)
    return DistillationPGOutput(loss, reverse_kl, masked_mean(advantages, mask).detach(), masked_mean(distill, mask))


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) over the last dimension, from log-probabilities; 0 log 0 = 0 (floored logs)."""
    log_p, log_q = log_p.clamp(min=LOG_FLOOR), log_q.clamp(min=LOG_FLOOR)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def generalized_jsd(student_logps: Tensor, teacher_logps: Tensor, beta: float) -> Tensor:
    """GKD's generalized JSD (Agarwal et al. 2024, Eq. 1) over the last dimension -> (...).

    P = teacher, Q = student, m = beta * P + (1 - beta) * Q:
    beta = 0: KL(teacher || student) (forward); beta = 1: KL(student || teacher) (reverse);
    otherwise beta * KL(teacher || m) + (1 - beta) * KL(student || m).

    Args:
        student_logps: (..., K) the student's log-probabilities over K outcomes (the vocabulary, or the
            buckets of `topk_buckets`).
        teacher_logps: (..., K) the teacher's, over the same outcomes.
        beta: the mixture weight of the teacher in m, in [0, 1].
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return _kl(teacher_logps, student_logps)
    if beta == 1.0:
        return _kl(student_logps, teacher_logps)
    mixture = torch.logaddexp(teacher_logps.clamp(min=LOG_FLOOR) + math.log(beta),
                              student_logps.clamp(min=LOG_FLOOR) + math.log1p(-beta))  # log m
    return beta * _kl(teacher_logps, mixture) + (1.0 - beta) * _kl(student_logps, mixture)


def topk_buckets(student_logps: Tensor, teacher_topk_logps: Tensor, teacher_topk_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Both distributions on k + 1 buckets: the teacher's top-k tokens, then the rest of the mass.

    Returns (student, teacher) log-probs
    (..., k + 1): the student's tail is logsumexp of its log-probs off the k tokens (exact), the
    teacher's log(1 - sum of its top-k mass) (all it is known by). With k = V both tails are empty
    (floored to LOG_FLOOR, contributing 0), and the divergence equals the full-vocabulary one.

    Args:
        student_logps: (..., V) the student's full log-probabilities (with gradient).
        teacher_topk_logps: (..., k) the teacher's log-probs of its k most likely tokens (normalised over the
            whole vocabulary).
        teacher_topk_ids: (..., k) those tokens.
    """
    picked = student_logps.gather(-1, teacher_topk_ids)  # (..., k)
    off = torch.ones_like(student_logps, dtype=torch.bool).scatter(-1, teacher_topk_ids, False)  # (..., V)
    tail = torch.logsumexp(student_logps.masked_fill(~off, LOG_FLOOR * 10), dim=-1, keepdim=True)  # (..., 1)
    student = torch.cat([picked, tail.clamp(min=LOG_FLOOR)], dim=-1)
    teacher_topk_logps = _at_least_float32(teacher_topk_logps)
    below_one = -1e-30 if teacher_topk_logps.dtype == torch.float64 else -1e-12  # the top-k mass, in log
    top_mass = torch.logsumexp(teacher_topk_logps, dim=-1, keepdim=True).clamp(max=below_one)
    teacher_tail = log1mexp(top_mass).clamp(min=LOG_FLOOR)
    teacher = torch.cat([teacher_topk_logps, teacher_tail], dim=-1)
    return student, teacher


def gkd_loss(
    student_logps: Tensor,
    teacher_logps: Tensor,
    mask: Tensor,
    beta: float = 0.5,
    teacher_topk_ids: Tensor | None = None,
) -> GKDLossOutput:
    """Token mean of the generalized JSD between the student and the teacher at every response token.

    L = sum_{i,t} M_it * JSD(beta)(pi_t(. | x_i, y_i,<t) || pi_s(. | x_i, y_i,<t)) / sum M (a mean
    over the batch's response tokens, not over sequences; exact over micro-batches weighted by
    their share of the tokens). See `generalized_jsd` for beta's two ends.

    Args:
        student_logps: (B, T, V) log-probabilities, with gradient.
        teacher_logps: (B, T, V) over the full vocabulary, or (B, T, k) the teacher's top-k log-probs.
        mask: (B, T) bool, the response tokens.
        beta: the generalized JSD's beta (`generalized_jsd`).
        teacher_topk_ids: (B, T, k) the tokens of a top-k `teacher_logps` (the divergence is then on k + 1
            buckets, `topk_buckets`); None: full vocabulary.
    """
    teacher_logps = teacher_logps.detach()
    if teacher_topk_ids is None:
        if teacher_logps.shape != student_logps.shape:
            raise ValueError(f"full-vocabulary GKD needs teacher and student log-probs of one shape, got "
                             f"{tuple(teacher_logps.shape)} and {tuple(student_logps.shape)}")
        student, teacher = _at_least_float32(student_logps), _at_least_float32(teacher_logps)
        tail = torch.zeros((), device=student_logps.device)
    else:
        student, teacher = topk_buckets(_at_least_float32(student_logps), teacher_logps, teacher_topk_ids)
        tail = masked_mean(teacher[..., -1].exp(), mask).detach()
    divergence = torch.where(mask, generalized_jsd(student, teacher, beta), 0.0)  # (B, T)
    return GKDLossOutput(masked_mean(divergence, mask), divergence.detach(), tail)


class ChunkedGKDOutput(NamedTuple):
    loss: Tensor  # scalar, with gradient: the token mean of the divergence over M (as `gkd_loss`)
    divergence: Tensor  # (B, T) detached per-token divergence, 0 off the mask
    tail_mass: Tensor  # detached: the teacher's mean mass outside its top-k over M (0 without top-k)
    student_logps: Tensor  # (B, T) the student's log-probs of `targets`, with gradient, 0 off the mask
    teacher_logps: Tensor  # (B, T): the teacher's log-probs of `targets`, 0 off the mask


def _gkd_chunk(hidden: Tensor, weight: Tensor, bias: Tensor | None, teacher_hidden: Tensor, teacher_weight: Tensor,
               teacher_bias: Tensor | None, targets: Tensor, beta: float, temperature: float,
               top_k: int | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One chunk of c scored tokens: (divergence (c,), student and teacher log-probs of the
    targets (c,), the teacher's mass off its top-k (c,))."""
    student = torch.log_softmax(apply_temperature(_at_least_float32(F.linear(hidden, weight, bias)), temperature), dim=-1)
    with torch.no_grad():
        logits = _at_least_float32(F.linear(teacher_hidden, teacher_weight, teacher_bias))
        teacher = torch.log_softmax(apply_temperature(logits, temperature), dim=-1)
    picked = targets[:, None]
    if top_k is None:
        student_b, teacher_b, tail = student, teacher, teacher.new_zeros(teacher.shape[0])
    else:
        top = teacher.topk(top_k, dim=-1)
        student_b, teacher_b = topk_buckets(student, top.values, top.indices)
        tail = teacher_b[:, -1].exp()
    divergence = generalized_jsd(student_b, teacher_b, beta)
    return divergence, student.gather(-1, picked).squeeze(-1), teacher.gather(-1, picked).squeeze(-1), tail


def chunked_gkd_loss(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    teacher_hidden: Tensor,
    teacher_weight: Tensor,
    teacher_bias: Tensor | None,
    targets: Tensor,
    mask: Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_size: int = 256,
    top_k: int | None = None,
) -> ChunkedGKDOutput:
    """`gkd_loss` from the two models' last hidden states and output layers, `chunk_size` scored
    tokens at a time: at most one chunk's (chunk_size, V) logits of each model exist at once, in the
    forward and in the backward pass (each chunk is recomputed there, `torch.utils.checkpoint`),
    never the (B, T, V) log-probabilities of `gkd_loss`. Same values and gradients up to float
    rounding (tested against `gkd_loss`).

    Args:
        hidden: (B, T, H) the student's hidden states that predict `targets`, with gradient.
        weight: (V, H) the student's output layer.
        bias: (V,) its bias, or None.
        teacher_hidden: (B, T, Ht) the teacher's hidden states (no gradient).
        teacher_weight: (V, Ht) the teacher's output layer.
        teacher_bias: (V,) its bias, or None.
        targets: (B, T) the token ids predicted.
        mask: (B, T) bool, the tokens scored.
        beta: the generalized JSD's beta (`generalized_jsd`).
        temperature: both models' logits are divided by it (`apply_temperature`).
        chunk_size: scored tokens per chunk.
        top_k: the divergence on the teacher's top-k tokens plus the tail bucket (`topk_buckets`); None: the
            full vocabulary.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    scored = mask.bool()
    rows_h, rows_t, rows_y = hidden[scored], teacher_hidden[scored].detach(), targets[scored]  # (N, H), (N, Ht), (N,)
    parts: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
    for start in range(0, rows_y.shape[0], chunk_size):
        chunk = slice(start, start + chunk_size)
        parts.append(torch.utils.checkpoint.checkpoint(
            _gkd_chunk, rows_h[chunk], weight, bias, rows_t[chunk], teacher_weight.detach(),
            None if teacher_bias is None else teacher_bias.detach(), rows_y[chunk], beta, temperature, top_k,
            use_reentrant=False))
    if parts:
        divergence, student_logps, teacher_logps, tail = (torch.cat(p) for p in zip(*parts))
    else:  # nothing scored: a zero loss that still reaches the student's graph
        divergence = student_logps = rows_h.sum(dim=-1) * 0.0
        teacher_logps = tail = divergence.detach()
    count = max(int(rows_y.shape[0]), 1)

    def spread(values: Tensor) -> Tensor:  # (N,) back to (B, T), 0 off the mask
        out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
        out[scored] = values
        return out

    return ChunkedGKDOutput(divergence.sum() / count, spread(divergence.detach()),
                            tail.sum().detach() / count if top_k is not None else tail.new_zeros(()),
                            spread(student_logps), spread(teacher_logps))
