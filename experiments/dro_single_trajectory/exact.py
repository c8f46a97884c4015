"""Exact quantities of a one-token answer space (`task.py`): sums over the vocabulary, no sampling.

With pi(.|x) the policy's next-token distribution at the end of prompt x (log-probs `logp`, (P, V))
and r(x, .) the reward of every token (`rewards`, (P, V)), per prompt:

- expected reward  E_pi[r] = sum_v pi(v|x) r(x, v);
- greedy reward    r(x, argmax_v pi(v|x));
- KL(pi || q)      sum_v pi(v|x) (log pi(v|x) - log q(v|x)), >= 0 exactly (no estimator noise);
- win rate of pi against rho, independent draws y ~ pi, y' ~ rho:
  P(r(y) > r(y')) + 1/2 P(r(y) = r(y')), summed over the reward levels;
- the KL-regularised optimum the DRO objective targets (Richemond et al. 2024, Theorem 1):
  pi*(v|x) ∝ pi_ref(v|x) exp(r(x, v) / tau) for the rewards as trained on (normalised).

From level masses alone (the second half: what `samples.json` keeps of every run): the log
partition of pi*, the distance KL(pi || pi*) from a policy's expected reward and KL to the
start, the reward-vs-KL frontier pi_beta ∝ start exp(r / beta), and the tabular fixed points of
the DRO policy gradient (Eq. 8) with each form of V.

Triplets are drawn from the same distributions (`sample`): an exact categorical draw with a
seeded generator, so the training data and the evaluation use one definition of the policy.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

from lit_rlhf.data.collate import pad_right


@torch.no_grad()
def next_token_logprobs(model: torch.nn.Module, rows: Sequence[dict[str, Any]], pad_token_id: int,
                        batch_size: int = 16) -> Tensor:
    """(P, V) float64 log-probs of the next token after each prompt (`_prompt_ids`), at
    temperature 1. Prompts are right padded, so positions 0..L-1 are the model's default (D5) and
    the distribution is read at each row's last prompt token."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(rows), batch_size):
        ids = [list(r["_prompt_ids"]) for r in rows[start:start + batch_size]]
        input_ids, mask = pad_right(ids, pad_token_id)
        last = torch.tensor([len(row) - 1 for row in ids])
        columns, row_column = torch.unique(last, return_inverse=True)  # the output layer on these columns only
        logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                       logits_to_keep=columns.to(device)).logits  # (b, K, V)
        out.append(torch.log_softmax(logits[torch.arange(len(ids)), row_column.to(device)].double(), dim=-1).cpu())
    model.train(was_training)
    return torch.cat(out)


def expected_reward(logp: Tensor, rewards: Tensor) -> Tensor:
    """(P,) E_pi[r]."""
    return (logp.exp() * rewards).sum(-1)


def greedy_reward(logp: Tensor, rewards: Tensor) -> Tensor:
    """(P,) the reward of the most likely token (the greedy answer)."""
    return rewards.gather(-1, logp.argmax(-1, keepdim=True)).squeeze(-1)


def kl(logp: Tensor, logq: Tensor) -> Tensor:
    """(P,) KL(p || q) = sum_v p (log p - log q), clamped at 0 against rounding."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(-1).clamp(min=0.0)


def level_masses(logp: Tensor, rewards: Tensor) -> Tensor:
    """(P, L) the probability of each reward level of each prompt, levels in ascending order (the
    distinct values of that prompt's reward row; rows with fewer levels are padded with zero mass
    at the end). Two policies' masses on one prompt share its levels, so the win rate needs only
    these (`win_rate_of_levels`), not the (P, V) distributions."""
    rows = []
    for lp, r in zip(logp, rewards):
        levels, index = torch.unique(r, return_inverse=True)  # ascending
        rows.append(torch.zeros(len(levels), dtype=torch.float64).index_add_(0, index, lp.exp().double()))
    width = max(len(row) for row in rows)
    return torch.stack([torch.cat([row, row.new_zeros(width - len(row))]) for row in rows])


def win_rate_of_levels(p: Tensor, q: Tensor) -> Tensor:
    """(P,) P(r(y) > r(y')) + 1/2 P(r(y) = r(y')) for independent draws with level masses p, q
    (`level_masses`, the same prompts)."""
    below = torch.cumsum(q, -1) - q  # mass of q strictly below each level
    return (p * (below + 0.5 * q)).sum(-1)


def win_rate(logp: Tensor, logq: Tensor, rewards: Tensor) -> Tensor:
    """(P,) the win rate of p against q on each prompt (independent draws, ties half)."""
    return win_rate_of_levels(level_masses(logp, rewards), level_masses(logq, rewards))


def regularised_optimum(logq: Tensor, rewards: Tensor, tau: float) -> Tensor:
    """(P, V) log pi* with pi* ∝ q exp(rewards / tau) (Theorem 1's optimum for reference q)."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return torch.log_softmax(logq + rewards / tau, dim=-1)


def sample(logp: Tensor, k: int, seed: int) -> Tensor:
    """(P, k) token ids, k independent draws per prompt from exp(logp), seeded."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.multinomial(logp.exp().float(), k, replacement=True, generator=generator)


# --------------------------------------------------------------------------------------------
# reward levels: what the saved results carry (`level_masses`), and what is exact from them alone
# --------------------------------------------------------------------------------------------
#
# A reward row is constant on each of its levels, so every quantity below needs only the level
# masses of a policy and of the start: for pi_beta ∝ start exp(r / beta) (pi* and the frontier)
# the ratio pi_beta / start is constant on a level, so its level masses carry it whole.

def reward_levels(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """(P, L) the ascending distinct values of each prompt's reward row (`level_masses`'s order),
    zero-padded at the end, and (P, L) bool, True on a real level."""
    rows = [torch.unique(r) for r in rewards]
    width = max(len(row) for row in rows)
    levels = torch.zeros(len(rows), width, dtype=torch.float64)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        levels[i, :len(row)], valid[i, :len(row)] = row.double(), True
    return levels, valid


def log_masses(masses: Tensor, valid: Tensor) -> Tensor:
    """log of level masses, a finite -1e4 (exp: exactly 0) on padding."""
    return torch.where(valid, masses.clamp(min=1e-300).log(), torch.full_like(masses, -1e4))


def log_partition(start: Tensor, levels: Tensor, valid: Tensor, tau: float) -> Tensor:
    """(P,) log Z(x) = log sum_y start(y|x) exp(r(x, y) / tau), from the start's level masses:
    tau log Z(x) is the largest E_pi[r] - tau KL(pi || start), reached by pi* (Theorem 1)."""
    return torch.logsumexp(log_masses(start, valid) + levels / tau, dim=-1)


def tilted_levels(start: Tensor, levels: Tensor, valid: Tensor, beta: float) -> Tensor:
    """(P, L) level masses of pi_beta ∝ start exp(r / beta) (pi* at beta = tau)."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return torch.softmax(log_masses(start, valid) + levels / beta, dim=-1) * valid


def kl_to_optimum(expected: Tensor, kl_start: Tensor, log_z: Tensor, tau: float) -> Tensor:
    """(P,) KL(pi || pi*) exactly, from a policy's E_pi[r] (the rewards pi* is tilted by) and
    KL(pi || start): log pi* = log start + r / tau - log Z, so

        KL(pi || pi*) = KL(pi || start) - E_pi[r] / tau + log Z = log Z - J(pi) / tau,

    with J(pi) = E_pi[r] - tau KL(pi || start) the regularised objective: a policy's shortfall
    from the best J is tau KL(pi || pi*). Clamped at 0 against rounding."""
    return (log_z - (expected - tau * kl_start) / tau).clamp(min=0.0)


def frontier(start: Tensor, levels: Tensor, valid: Tensor, betas: Tensor, rewards: Tensor | None = None) -> Tensor:
    """(N, 2) the reward-vs-KL frontier over the prompts: for each beta, (mean KL(pi_beta ||
    start), mean E_{pi_beta}[rewards]) with pi_beta ∝ start exp(levels / beta). A common beta
    maximises mean E[r] - beta mean KL, so no policy has a higher mean reward at the same mean KL
    (the KL over tokens: within a level pi_beta keeps the start's shape). `rewards` (P, L): the
    reward read on the levels (default: `levels` themselves, e.g. raw rewards while `levels` are
    normalised ones: the same order, the same frontier)."""
    rewards = levels if rewards is None else rewards
    log_start = log_masses(start, valid)
    points = []
    for beta in betas.tolist():
        logp = torch.log_softmax(log_start + levels / beta, dim=-1)
        p = logp.exp() * valid
        kl_value = torch.where(p > 0, p * (logp - log_start), torch.zeros_like(p)).sum(-1)
        points.append([float(kl_value.mean()), float((p * rewards).sum(-1).mean())])
    return torch.tensor(points, dtype=torch.float64)


def frontier_at_kl(start: Tensor, levels: Tensor, valid: Tensor, target_kl: float, rewards: Tensor | None = None,
                   iterations: int = 200) -> tuple[float, float]:
    """(beta, mean reward) of the frontier point whose mean KL to the start is `target_kl`
    (bisection on log beta; the KL falls as beta rises)."""
    if target_kl <= 0:
        return math.inf, float(((start * valid) * (levels if rewards is None else rewards)).sum(-1).mean())
    low, high = math.log(1e-4), math.log(1e4)  # log beta
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        kl_value = float(frontier(start, levels, valid, torch.tensor([math.exp(middle)]))[0, 0])
        low, high = (middle, high) if kl_value > target_kl else (low, middle)
    beta = math.exp(0.5 * (low + high))
    return beta, float(frontier(start, levels, valid, torch.tensor([beta]), rewards)[0, 1])


def offline_fixed_point(start: Tensor, levels: Tensor, valid: Tensor, tau: float, value: str,
                        tolerance: float = 1e-12, max_rounds: int = 200) -> tuple[Tensor, float]:
    """(P, L) level masses where the DRO policy gradient (Eq. 8) vanishes in expectation, for a
    tabular policy trained to convergence on unlimited draws from the start, with V:

    - `per_prompt`: V(x) = E_start[r - tau log pi/start] (DRO-V's V at its optimum): pi*;
    - `single`: one V for every prompt, its mean over prompts (the single-value ablation,
      `batch_estimate`, with the batch as large as the data);
    - `zero`: V = 0.

    With V held fixed, Eq. 8's expected gradient is the gradient of
    1/2 E_start[(r - V - tau log pi/start)^2] in the policy's logits, so each round minimises
    that over the logits (L-BFGS) and then sets V from the minimiser; the rounds stop when V
    moves less than `tolerance` (a secant step on V after the first two). Returns the masses
    and V (its mean over prompts). Tabular: one logit per level and prompt; a token's share of
    its level stays the start's (the gradient is the same for every token of a level)."""
    if value not in ("per_prompt", "single", "zero"):
        raise ValueError(f"value must be per_prompt, single or zero, got {value!r}")
    log_start = log_masses(start, valid)
    weights = start * valid

    # the loss's curvature in a level's logit scales with its start mass (some are ~1e-9): L-BFGS
    # runs on logits times sqrt(mass), where the curvature is about the same for every level
    scale = torch.where(valid & (weights > 0), weights.clamp(min=1e-300).sqrt(), torch.ones_like(weights))

    def minimise(v: Tensor, theta: Tensor) -> Tensor:
        phi = (theta * scale).requires_grad_(True)
        opt = torch.optim.LBFGS([phi], lr=1, max_iter=2000, tolerance_grad=1e-13, tolerance_change=0,
                                history_size=50, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            logits = log_start + phi / scale
            ratio = torch.where(valid, torch.log_softmax(logits, -1) - log_start, torch.zeros_like(phi))
            loss = 0.5 * (weights * (levels - v - tau * ratio) ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return phi.detach() / scale

    def target(theta: Tensor) -> Tensor:  # (P,) E_start[r - tau log pi/start]
        ratio = torch.where(valid, torch.log_softmax(log_start + theta, -1) - log_start, torch.zeros_like(theta))
        return (weights * (levels - tau * ratio)).sum(-1)

    theta = torch.zeros_like(levels)
    if value == "per_prompt":  # Theorem 1 in closed form: V(x) = tau log Z(x), pi = pi*
        return tilted_levels(start, levels, valid, tau), float((tau * log_partition(start, levels, valid, tau)).mean())
    if value == "zero":
        theta = minimise(torch.zeros(()), theta)
        return torch.softmax(log_start + theta, -1) * valid, 0.0
    v, history = 0.0, []
    for _ in range(max_rounds):
        theta = minimise(torch.tensor(v, dtype=torch.float64), theta)
        new = float(target(theta).mean())
        history.append((v, new - v))
        if abs(new - v) < tolerance:
            return torch.softmax(log_start + theta, -1) * valid, new
        if len(history) >= 2 and history[-1][1] != history[-2][1]:  # secant on F(v) = target - v
            (v0, f0), (v1, f1) = history[-2], history[-1]
            v = v1 - f1 * (v1 - v0) / (f1 - f0)
        else:
            v = new
    raise RuntimeError(f"the single value did not settle in {max_rounds} rounds (last move {history[-1][1]:.2e})")
