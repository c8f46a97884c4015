"""Judges and the statistics of their verdicts: pairwise (`PairwiseJudge.judge(prompts,
completions_a, completions_b) -> list[Judgement]`: `RewardModelJudge`, the key-fact gold
`KeyFactJudge`, `ChatAPIJudge`, `LocalLMJudge`, the LM ones showing each pair in a seeded random
order), pointwise (`RubricJudge` on weighted `Criterion`s, scored by `LocalLMScorer` or
`ChatAPIScorer`), `win_rate` (Wilson 95% interval), `win_rate_by_length_ratio` and `agreement`.
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
