"""Pairwise judging of the policy's completions against a baseline's, and its statistics."""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple, Sequence

from lit_rlhf.judges import Judgement, LengthRatioBuckets, PairwiseJudge, WinRateStats, win_rate, win_rate_by_length_ratio

log = logging.getLogger(__name__)


def judge_safely(judge: PairwiseJudge, prompts: list[str], completions_a: list[str],
                 completions_b: list[str]) -> list[Judgement]:
    """`judge.judge(...)`, but a judge that raises or returns the wrong number of verdicts makes
    every item `invalid` (with the reason in `error`) and logs a warning instead of raising."""
    n = len(prompts)
    try:
        out = list(judge.judge(list(prompts), list(completions_a), list(completions_b)))
        reason = None if len(out) == n else f"judge returned {len(out)} judgements for {n} items"
    except Exception as err:  # a judge failure must never end a training run
        reason = f"judge raised {type(err).__name__}: {err}"
    if reason is not None:
        log.warning("%s: %s; all %d items counted as invalid", type(judge).__name__, reason, n)
        return [Judgement("invalid", error=reason) for _ in range(n)]
    invalid = sum(j.winner == "invalid" for j in out)
    if invalid:
        first = next(j.error for j in out if j.winner == "invalid")
        log.warning("%s: %d of %d verdicts invalid (first: %s)", type(judge).__name__, invalid, n, first)
    return out


class JudgeEvaluation(NamedTuple):
    """Everything one evaluation produced: `stats` (the policy's (a) win rate over the baseline (b),
    Wilson interval), `metrics` (`{prefix}/{name}` floats, `judge_metrics`), `rows` (one dict per
    prompt) and `buckets` (win rate per log(len_policy / len_baseline) bucket)."""

    stats: WinRateStats
    metrics: dict[str, float]
    rows: list[dict[str, Any]]
    buckets: LengthRatioBuckets


def token_length(tokenizer: Any, text: str) -> int:
    """Length of a completion in tokens of `tokenizer`, without special tokens (EOS not counted)."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def judge_metrics(stats: WinRateStats, policy_lengths: Sequence[int], baseline_lengths: Sequence[int],
                  prefix: str = "val/judge") -> dict[str, float]:
    """`{prefix}/win_rate`, `win_rate_ci_low`, `win_rate_ci_high`, `tie_rate`, `invalid_rate`,
    `num_prompts`, `num_valid`, `policy_length_tokens`, `baseline_length_tokens` (means) and
    `length_ratio` (mean policy length / mean baseline length)."""
    mean_policy = sum(policy_lengths) / max(1, len(policy_lengths))
    mean_baseline = sum(baseline_lengths) / max(1, len(baseline_lengths))
    values = {"win_rate": stats.win_rate, "win_rate_ci_low": stats.ci_low, "win_rate_ci_high": stats.ci_high,
              "tie_rate": stats.tie_rate, "invalid_rate": stats.invalid_rate, "num_prompts": stats.n,
              "num_valid": stats.num_valid, "policy_length_tokens": mean_policy,
              "baseline_length_tokens": mean_baseline,
              "length_ratio": mean_policy / mean_baseline if mean_baseline > 0 else math.nan}
    return {f"{prefix}/{k}": float(v) for k, v in values.items()}


def evaluate_completions(judge: PairwiseJudge, prompts: list[str], policy_texts: list[str], baseline_texts: list[str],
                         tokenizer: Any, num_buckets: int = 6, prefix: str = "val/judge") -> JudgeEvaluation:
    """Judge policy (a) against baseline (b) on each prompt and summarise (never raises for a
    judge failure: see `judge_safely`)."""
    if not (len(prompts) == len(policy_texts) == len(baseline_texts)):
        raise ValueError(f"prompts, policy and baseline completions differ in number: "
                         f"{len(prompts)}, {len(policy_texts)}, {len(baseline_texts)}")
    judgements = judge_safely(judge, prompts, policy_texts, baseline_texts)
    len_policy = [token_length(tokenizer, t) for t in policy_texts]
    len_baseline = [token_length(tokenizer, t) for t in baseline_texts]
    stats = win_rate(judgements)
    rows = [
        {"prompt": p, "policy": a, "baseline": b, "winner": j.winner, "raw": j.raw, "error": j.error,
         "swapped": j.swapped, "policy_length_tokens": la, "baseline_length_tokens": lb}
        for p, a, b, j, la, lb in zip(prompts, policy_texts, baseline_texts, judgements, len_policy, len_baseline)
    ]
    buckets = win_rate_by_length_ratio(judgements, len_policy, len_baseline, num_buckets=num_buckets)
    return JudgeEvaluation(stats, judge_metrics(stats, len_policy, len_baseline, prefix), rows, buckets)
