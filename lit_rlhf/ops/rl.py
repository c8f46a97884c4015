"""Pure RL helpers: KL estimators, the KL-penalised sequence reward, GAE, groups of completions,
EOS truncation (D23), reward placement at EOS (D12)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lit_rlhf.ops.masked import masked_sum

KLEstimator = Literal["k1", "k2", "k3"]


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: KLEstimator = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman, "Approximating KL").

    With `log_ratio = logps - ref_logps` (log pi - log pi_ref on the sampled token):
    - k1 = log_ratio                              (unbiased, can be negative; the N+ paper's choice)
    - k2 = log_ratio**2 / 2                       (biased, low variance)
    - k3 = exp(-log_ratio) - 1 + log_ratio        (unbiased, always >= 0; GRPO's, DeepSeekMath eq. 4)
    """
    log_ratio = logps - ref_logps
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; expected 'k1', 'k2' or 'k3'")


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the response tokens (Schulman et al. 2016, eq. 16).

    rewards, values: (B, R); mask: (B, R) bool, True on the policy's tokens. Over the kept
    tokens t < t' < ... of a row (a prefix for one turn; with holes where a multi-turn episode's
    environment tokens lie, which are not actions and are skipped):
    delta_t = r_t + gamma * V_{t'} - V_t, A_t = delta_t + gamma * lam * A_{t'}, with V and A
    taken as 0 past the last kept token. Returns (advantages, returns = advantages + values),
    both 0 where `mask` is False.
    """
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    values = torch.where(mask, values, zeros)
    rewards = torch.where(mask, rewards, zeros)
    length = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])  # A of the next kept token
    next_value = torch.zeros_like(last)  # V of the next kept token
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * last
        kept = mask[:, t]
        advantages[:, t] = torch.where(kept, here, zeros)
        last = torch.where(kept, here, last)  # a skipped token passes both on unchanged
        next_value = torch.where(kept, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, zeros)
    return advantages, returns


def truncate_after_eos(response_ids: Tensor, eos_token_id: int, pad_token_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """D23: keep each response up to and including its first EOS; PAD-fill the rest.

    response_ids: (B, R) -> (truncated_ids (B, R), response_mask (B, R) bool, has_eos (B,) bool).
    A response without EOS keeps all R tokens.
    """
    is_eos = response_ids == eos_token_id
    # number of EOS tokens strictly before position t; position t is kept when that count is 0
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    response_mask = eos_before == 0
    return response_ids.masked_fill(~response_mask, pad_token_id), response_mask, is_eos.any(dim=1)


def last_true_index(mask: Tensor) -> Tensor:
    """Index of the last True of each row, (B, T) -> (B,) long. Rows without True raise."""
    if not bool(mask.any(dim=1).all()):
        raise ValueError("every row needs at least one True in the mask")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values


def place_at_last(scores: Tensor, mask: Tensor) -> Tensor:
    """A (B, T) tensor of zeros with `scores[b]` at the last True position of row b (D12)."""
    out = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    return out.scatter(1, last_true_index(mask).unsqueeze(1), scores.unsqueeze(1))


def place_rewards(scores: Tensor, mask: Tensor, turn_rewards: Tensor | None = None) -> Tensor:
    """Per-token rewards (B, T) that sum to `scores` (B,) in each row: `turn_rewards` (B, T)
    where given (a multi-turn episode's per-turn rewards, each on its turn's last token), and
    the rest of the score, `scores - turn_rewards.sum(1)`, on the last True of `mask` (D12)."""
    if turn_rewards is None:
        return place_at_last(scores, mask)
    turn_rewards = turn_rewards.to(scores.dtype)
    return turn_rewards + place_at_last(scores - turn_rewards.sum(dim=1), mask)


def kl_penalized_sequence_rewards(scores: Tensor, old_logps: Tensor, ref_logps: Tensor | None, mask: Tensor,
                                  kl_coef: float) -> tuple[Tensor, Tensor]:
    """Whole-response rewards with the KL penalty inside -> (rewards (N,), kl (N,)), no gradient:
    r_i = score_i - kl_coef * KL_i, KL_i = sum_t (log pi_old - log pi_ref)(y_i,t), the sequence's k1
    KL (Ziegler et al. 2019's penalised reward on a whole response, as in RLOO, Ahmadian et al.
    2024, and ReMax, Li et al. 2023). scores (N,); old_logps, ref_logps (N, T): the sampled tokens'
    log-probs under the sampling policy and the reference (ref_logps None when kl_coef == 0); mask (N, T) bool."""
    if ref_logps is None:
        if kl_coef != 0.0:
            raise ValueError("ref_logps is required when kl_coef != 0")
        kl = scores.new_zeros(scores.shape)
    else:
        kl = masked_sum(old_logps.detach().float() - ref_logps.detach().float(), mask, dim=1)  # (N,)
    return (scores.detach().float() - kl_coef * kl), kl


def groups_of(values: Tensor, group_size: int) -> Tensor:
    """(B*G,) values, each prompt's G completions contiguous -> their (B, G) view; refuses a flat
    length that G (>= 2) does not divide."""
    if values.dim() != 1 or group_size < 2 or values.numel() % group_size:
        raise ValueError(f"values must be flat (B*G,) with G = group_size >= 2 dividing its length; "
                         f"got shape {tuple(values.shape)} and group_size {group_size}")
    return values.view(-1, group_size)
