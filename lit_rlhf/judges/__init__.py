"""Pairwise judges and the statistics of their verdicts.

- `PairwiseJudge`: the interface, `judge(prompts, completions_a, completions_b) -> list[Judgement]`.
- `RewardModelJudge`: the completion with the higher reward wins.
- `KeyFactJudge`: a programmatic gold, the recall of each post's key fact (`lit_rlhf.judges.keyfact`, with
  its F1 and the listed checks of false statements and distractors).
- `ChatAPIJudge`: an LLM behind an OpenAI-compatible chat-completions endpoint.
- `LocalLMJudge`: a local causal LM, read from the next-token probabilities of "A" and "B".
- `RubricJudge`: pointwise scores on weighted `Criterion`s (mean / min / all-pass), each scored by
  a `PointwiseScorer`: `LocalLMScorer` (P(Yes) of a local LM) or `ChatAPIScorer` (a chat API).
- `win_rate` / `win_rate_by_length_ratio`: win rate with a Wilson 95% interval, overall and
  bucketed by log length ratio; `agreement`: how often two judges pick the same winner.

LM judges show each pair in a seeded random order and map verdicts back to the caller's a/b.
"""

from lit_rlhf.judges.base import Judgement, PairwiseJudge, RandomOrderJudge, order_is_swapped
from lit_rlhf.judges.chat_api import ChatAPIJudge
from lit_rlhf.judges.keyfact import KeyFactJudge, keyfact_f1, keyfact_recall, listed_matches
from lit_rlhf.judges.local_lm import LocalLMJudge
from lit_rlhf.judges.pointwise import ChatAPIScorer, LocalLMScorer
from lit_rlhf.judges.reward import RewardModelJudge
from lit_rlhf.judges.rubric import Criterion, PointScore, PointwiseScorer, RubricJudge, RubricResult
from lit_rlhf.judges.stats import (
    AgreementStats, LengthRatioBuckets, WinRateStats, agreement, wilson_interval, win_rate, win_rate_by_length_ratio
)
from lit_rlhf.judges.templates import JudgeTemplate, get_template

__all__ = [
    "AgreementStats", "ChatAPIJudge", "ChatAPIScorer", "Criterion", "JudgeTemplate", "KeyFactJudge", "Judgement",
    "LengthRatioBuckets", "LocalLMJudge", "LocalLMScorer", "PairwiseJudge", "PointScore", "PointwiseScorer",
    "RandomOrderJudge", "RewardModelJudge", "RubricJudge", "RubricResult", "WinRateStats", "agreement", "get_template",
    "keyfact_f1", "keyfact_recall", "listed_matches", "order_is_swapped", "wilson_interval", "win_rate",
    "win_rate_by_length_ratio"
]
