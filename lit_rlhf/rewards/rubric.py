"""A rubric judge (`lit_rlhf.judges.RubricJudge`) as a reward source: each answer's aggregate score
on weighted criteria; an answer with no criterion scored gets `invalid_score` (counted in
`invalid_answers`, logged). With weight 0 in `reward_weights` it is a logged, unoptimised monitor
(`train/rewards/rubric`, `callbacks.DivergenceMonitor`).
"""

from __future__ import annotations

import logging
from typing import Any

from lit_rlhf.judges.rubric import RubricJudge

log = logging.getLogger(__name__)


class RubricReward:
    """Reward function `(prompts, completions, **columns) -> rewards` from a `RubricJudge`.

    Args:
        judge: the rubric judge (in YAML `{class_path: lit_rlhf.judges.RubricJudge, init_args:
            {criteria: [...], scorer: {...}, aggregation: mean}}`).
        invalid_score: the reward of an answer none of whose criteria could be scored.
        name: the source's name in the logged metrics (`train/rewards/{name}`).
    """

    def __init__(self, judge: RubricJudge, invalid_score: float = 0.0, name: str = "rubric") -> None:
        self.judge = judge
        self.invalid_score = float(invalid_score)
        self.__name__ = name
        self.invalid_answers = 0

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        scores = self.judge.score(list(prompts), list(completions)).scores
        missing = sum(s is None for s in scores)
        if missing:
            self.invalid_answers += missing
            log.warning("rubric reward %s: %d of %d answers had no criterion scored; they get %g (%d so far)",
                        self.__name__, missing, len(scores), self.invalid_score, self.invalid_answers)
        return [self.invalid_score if s is None else s for s in scores]
