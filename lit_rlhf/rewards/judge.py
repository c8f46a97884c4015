"""A pairwise judge as a reward source (each sample's win rate against its prompt's other samples),
so an LLM-as-judge can be the reward of any online method and the annotator of online DPO (Guo et
al. 2024, OAIF). A failing judge never stops a run: a call that raises or returns the wrong
results, and an `invalid` verdict, count as ties (`failed_calls`, `invalid_verdicts`, logged).
"""

from __future__ import annotations

import logging
from typing import Any

from lit_rlhf.judges.base import Judgement, PairwiseJudge

log = logging.getLogger(__name__)


class PairwiseJudgeReward:
    """Reward function `(prompts, completions, **columns) -> rewards` from a `PairwiseJudge`.

    Every pair of a prompt's samples (contiguous rows with the same prompt text) is judged once,
    all in one `judge.judge` call; sample i's reward is its wins (a tie 1/2) over its G - 1
    comparisons, in [0, 1] (with G = 2 the winner gets 1); a prompt with one sample gets 1/2.

    Args:
        judge: any `lit_rlhf.judges.PairwiseJudge` (in YAML `{class_path, init_args}`).
    """

    def __init__(self, judge: PairwiseJudge) -> None:
        self.judge = judge
        self.calls = 0
        self.failed_calls = 0  # calls that raised or returned something other than one Judgement per pair
        self.invalid_verdicts = 0  # verdicts that were neither "a", "b" nor "tie"

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        n = len(completions)
        starts = [i for i in range(n) if i == 0 or prompts[i] != prompts[i - 1]] + [n]
        pairs = [(i, j) for lo, hi in zip(starts, starts[1:]) for i in range(lo, hi) for j in range(i + 1, hi)]
        winners = self.verdicts([prompts[i] for i, _ in pairs], [completions[i] for i, _ in pairs],
                                [completions[j] for _, j in pairs])
        wins = [0.0] * n
        for (i, j), winner in zip(pairs, winners):
            wins[i] += 1.0 if winner == "a" else 0.5 if winner == "tie" else 0.0
            wins[j] += 1.0 if winner == "b" else 0.5 if winner == "tie" else 0.0
        sizes = {i: hi - lo for lo, hi in zip(starts, starts[1:]) for i in range(lo, hi)}
        return [wins[i] / (sizes[i] - 1) if sizes[i] > 1 else 0.5 for i in range(n)]

    def verdicts(self, prompts: list[str], firsts: list[str], seconds: list[str]) -> list[str]:
        """One winner per pair, "a", "b" or "tie"; whatever the judge does, nothing raises."""
        if not prompts:
            return []
        self.calls += 1
        name = type(self.judge).__name__
        try:
            out = list(self.judge.judge(prompts, firsts, seconds))
        except Exception as err:  # noqa: BLE001 - a judge (an API, a model) must not stop the run
            self.failed_calls += 1
            log.warning("judge %s raised %s: %s; its %d pairs count as ties (%d failed calls so far)",
                        name, type(err).__name__, err, len(prompts), self.failed_calls)
            return ["tie"] * len(prompts)
        if len(out) != len(prompts) or not all(isinstance(j, Judgement) for j in out):
            self.failed_calls += 1
            log.warning("judge %s returned %d results that are not %d Judgements; they count as ties",
                        name, len(out), len(prompts))
            return ["tie"] * len(prompts)
        bad = sum(j.winner not in ("a", "b", "tie") for j in out)
        if bad:
            self.invalid_verdicts += bad
            log.warning("judge %s gave %d invalid verdicts of %d (first error: %s); they count as ties "
                        "(%d so far)", name, bad, len(out), next((j.error for j in out if j.error), None),
                        self.invalid_verdicts)
        return [j.winner if j.winner in ("a", "b") else "tie" for j in out]
