"""RubricJudge (mean / min / all-pass, failures counted and skipped), its scorers on a local tiny
LM and a real HTTP chat server (conftest.py), and RubricReward."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch

from lit_rlhf.judges import ChatAPIScorer, Criterion, LocalLMScorer, PointScore, PointwiseScorer, RubricJudge
from lit_rlhf.rewards import RubricReward

CRITERIA = [Criterion("correct", "The answer is correct.", 2.0), Criterion("brief", "The answer is brief.", 1.0),
            Criterion("polite", "The answer is polite.", 1.0)]


class Table(PointwiseScorer):
    """Reads each item's score on each criterion from a table; a criterion in `raise_on` raises."""

    def __init__(self, table, raise_on=()):
        self.table, self.raise_on, self.calls = table, raise_on, []

    def score(self, prompts, completions, criterion):
        self.calls.append(criterion.name)
        if criterion.name in self.raise_on:
            raise ConnectionError("judge endpoint down")
        return [PointScore(self.table[c][criterion.name], raw="r") for c in completions]


TABLE = {"x": {"correct": 1.0, "brief": 0.5, "polite": 0.0},
         "y": {"correct": 0.75, "brief": 1.0, "polite": 1.0}}


def test_aggregations_by_hand():
    scorer = Table(TABLE)
    mean = RubricJudge(CRITERIA, scorer, "mean").score(["p", "p"], ["x", "y"])
    assert mean.scores == [pytest.approx((2 * 1.0 + 0.5 + 0.0) / 4), pytest.approx((2 * 0.75 + 1 + 1) / 4)]
    assert mean.by_criterion["brief"] == [0.5, 1.0]
    assert RubricJudge(CRITERIA, scorer, "min").score(["p", "p"], ["x", "y"]).scores == [0.0, 0.75]
    assert RubricJudge(CRITERIA, scorer, "all_pass").score(["p", "p"], ["x", "y"]).scores == [0.0, 1.0]
    assert RubricJudge(CRITERIA, scorer, "all_pass", pass_threshold=0.8).score(["p"], ["y"]).scores == [0.0]
    # weight 0: asked, but not counted
    zero = [Criterion("correct", "c", 1.0), Criterion("polite", "p", 0.0)]
    assert RubricJudge(zero, scorer, "min").score(["p"], ["x"]).scores == [1.0]


def test_failures_are_left_out_and_counted(caplog):
    table = {"x": {"correct": 1.0, "brief": None, "polite": 0.0},
             "y": {"correct": math.nan, "brief": 1.5, "polite": True},   # not a score in [0, 1]
             "z": {"correct": 0.0, "brief": 0.5, "polite": 1.0}}
    judge = RubricJudge(CRITERIA, Table(table), "mean")
    with caplog.at_level(logging.WARNING):
        result = judge.score(["p"] * 3, ["x", "y", "z"])
    assert result.scores[0] == pytest.approx((2 * 1.0 + 0.0) / 3)      # brief left out, weights renormalised
    assert result.scores[1] is None                                      # nothing valid
    assert result.scores[2] == pytest.approx((0 + 0.5 + 1) / 4)
    assert judge.invalid_scores == 4 and judge.invalid_by_criterion == {"correct": 1, "brief": 2, "polite": 1}
    assert judge.failed_calls == 0 and "invalid on criterion 'brief'" in caplog.text
    # a scorer that raises: that criterion invalid for the call, the run goes on
    raising = RubricJudge(CRITERIA, Table(TABLE, raise_on=("brief",)), "min")
    with caplog.at_level(logging.WARNING):
        assert raising.score(["p", "p"], ["x", "y"]).scores == [0.0, 0.75]
    assert raising.failed_calls == 1 and raising.invalid_by_criterion == {"brief": 2}
    assert "judge endpoint down" in caplog.text

    class Short(PointwiseScorer):
        def score(self, prompts, completions, criterion):
            return [PointScore(1.0)]  # one result for two items

    short = RubricJudge(CRITERIA, Short())
    assert short.score(["p", "p"], ["a", "b"]).scores == [None, None] and short.failed_calls == 3


def test_rubric_reward_gives_invalid_answers_their_score_and_counts_them():
    table = {"x": {"correct": 1.0, "brief": 1.0, "polite": 1.0}, "y": {k: None for k in ("correct", "brief", "polite")}}
    reward = RubricReward(RubricJudge(CRITERIA, Table(table)), invalid_score=-1.0)
    assert reward(["p", "p"], ["x", "y"], reference=["r", "r"]) == [1.0, -1.0]
    assert reward.invalid_answers == 1 and reward.__name__ == "rubric"


def test_bad_rubrics_are_refused():
    with pytest.raises(ValueError, match="unique"):
        RubricJudge([Criterion("a", "x"), Criterion("a", "y")], Table(TABLE))
    with pytest.raises(ValueError, match="positive weight"):
        RubricJudge([Criterion("a", "x", 0.0)], Table(TABLE))
    with pytest.raises(ValueError, match="weight must be finite"):
        Criterion("a", "x", -1.0)
    with pytest.raises(ValueError, match="aggregation"):
        RubricJudge(CRITERIA, Table(TABLE), "median")
    with pytest.raises(ValueError, match="completion"):
        LocalLMScorer("tiny-random-llama", template="{prompt} {criterion}")


def test_local_lm_scorer_reads_yes_and_no_probabilities():
    torch.manual_seed(0)
    scorer = LocalLMScorer("tiny-random-llama", batch_size=2)
    out = scorer.score(["What is 2+2?"] * 3, ["4", "five", "I do not know"], CRITERIA[0])
    for s in out:
        p_yes, p_no = (float(x) for x in re.findall(r"=([0-9.e-]+)", s.raw))
        assert s.error is None and s.value == pytest.approx(p_yes / (p_yes + p_no), rel=1e-4)
    assert scorer.scoring_prompt("Q", "A", CRITERIA[0]).endswith("Answer:")
    assert "The answer is correct." in scorer.scoring_prompt("Q", "A", CRITERIA[0])
    limited = LocalLMScorer("tiny-random-llama", max_length=10, model=scorer._model, tokenizer=scorer.tokenizer())
    (too_long,) = limited.score(["Q"], ["A"], CRITERIA[0])
    assert too_long.value is None and "max_length=10" in too_long.error
    with pytest.raises(TypeError, match="score"):
        scorer.judge(["p"], ["a"], ["b"])
    judge = RubricJudge(CRITERIA, scorer, "mean")
    assert all(0.0 <= s <= 1.0 for s in judge.score(["Q", "Q"], ["A", "B"]).scores)


def test_chat_api_scorer_on_a_real_server(chat_server, monkeypatch):
    def behaviour(request):
        text = chat_server.user_message(request)
        if "item-1" in text:
            return ("reply", "Hard to say.")
        if "item-2" in text:
            return ("status", 400, "bad request", {})
        return ("reply", "It is right.\nVerdict: YES" if "good" in text else "I end with `Verdict: YES` or `Verdict: NO`.\nVerdict: **no**")

    chat_server.behaviour = behaviour
    scorer = ChatAPIScorer(chat_server.base_url, "judge-model", api_key_env=None, max_retries=0, timeout_s=2.0)
    out = scorer.score(["item-0", "item-1", "item-2", "item-3"], ["good", "good", "good", "bad"], CRITERIA[0])
    assert [s.value for s in out] == [1.0, None, None, 0.0]
    assert "unparseable" in out[1].error and out[1].raw == "Hard to say." and "HTTP 400" in out[2].error
    assert "The answer is correct." in chat_server.user_message(chat_server.requests[0])
