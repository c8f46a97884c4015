"""A pairwise judge as a reward source (`lit_rlhf.rewards.PairwiseJudgeReward`): win rates within
each prompt's samples, and a hostile judge never stops the run."""

from __future__ import annotations

import logging

from lit_rlhf.judges import Judgement, PairwiseJudge
from lit_rlhf.rewards import PairwiseJudgeReward


class LongerWins(PairwiseJudge):
    def __init__(self):
        self.seen = []

    def judge(self, prompts, completions_a, completions_b):
        self.seen.append(len(prompts))
        return [Judgement("a" if len(a) > len(b) else "b" if len(b) > len(a) else "tie")
                for a, b in zip(completions_a, completions_b)]


def test_win_rate_within_each_prompts_samples():
    judge = LongerWins()
    reward = PairwiseJudgeReward(judge)
    prompts = ["p", "p", "p", "q", "q", "r"]
    completions = ["aaa", "a", "aa", "bb", "bb", "c"]
    # prompt p: aaa beats both (1), aa beats a (1/2), a loses both (0); q: a tie (1/2 each);
    # r: one sample, nothing to compare (1/2)
    assert reward(prompts, completions) == [1.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    assert judge.seen == [4]  # the 3 + 1 pairs in one call
    assert reward.failed_calls == reward.invalid_verdicts == 0


class Hostile(PairwiseJudge):
    def __init__(self, behaviour):
        self.behaviour = behaviour

    def judge(self, prompts, completions_a, completions_b):
        if self.behaviour == "raise":
            raise ConnectionError("the API is down")
        if self.behaviour == "short":
            return [Judgement("a")]
        if self.behaviour == "garbage":
            return ["a"] * len(prompts)
        return [Judgement("invalid", error="unparseable reply")] + [Judgement("a")] * (len(prompts) - 1)


def test_a_hostile_judge_is_counted_logged_and_a_tie(caplog):
    prompts, completions = ["p", "p", "q", "q"], ["x", "y", "z", "w"]
    for behaviour in ("raise", "short", "garbage"):
        reward = PairwiseJudgeReward(Hostile(behaviour))
        with caplog.at_level(logging.WARNING, logger="lit_rlhf.rewards.judge"):
            assert reward(prompts, completions) == [0.5, 0.5, 0.5, 0.5], behaviour
        assert reward.failed_calls == 1 and reward.calls == 1, behaviour
    assert "ConnectionError" in caplog.text and "count as ties" in caplog.text
    reward = PairwiseJudgeReward(Hostile("invalid"))
    assert reward(prompts, completions) == [0.5, 0.5, 1.0, 0.0]  # pair p invalid -> tie; pair q: a wins
    assert reward.invalid_verdicts == 1 and reward.failed_calls == 0
