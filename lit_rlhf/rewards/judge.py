"""A pairwise judge as a reward source: each sample's win rate against the other samples of its
prompt, so an LLM-as-judge (local LM or chat API, `lit_rlhf.judges`) can be the reward of any
online method, and the annotator of online DPO (Guo et al. 2024, OAIF).

A hostile judge never stops a run: a call that raises, a reply of the wrong length or type, and
a verdict that is not "a", "b" or "tie" (`invalid`) all count as ties; they are counted on the
object (`failed_calls`, `invalid_verdicts`) and logged as warnings.
"""

from __future__ import annotations

import logging
from typing import Any

from lit_rlhf.judges.base import Judgement, PairwiseJudge

log = logging.getLogger(__name__)


class PairwiseJudgeReward:
    """Reward function `(prompts, completions, **columns) -> rewards` from a `PairwiseJudge`.

    The rows of one prompt are the contiguous rows with the same prompt text (a prompt's G
    samples, as every online module lays them out). Every pair (i, j) of a prompt's rows is
    judged once, all pairs of the call in one `judge.judge` call; a win counts 1, a tie 1/2, and
    the reward of sample i is its wins over its G - 1 comparisons, in [0, 1]. A prompt with one
    sample (PPO, validation) has nothing to be compared with and gets 1/2. With G = 2 (online DPO)
    the winner gets 1, the loser 0, a tie 1/2 each.

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
