"""pass@k (Chen et al. 2021, Eq. 1), avg@k and maj@k worked by hand, and their intervals."""

from __future__ import annotations

import itertools
import math

import pytest

from lit_rlhf.evaluation.pass_at_k import (
    avg_at_k,
    compare,
    maj_at_k,
    majority_answer,
    metric_names,
    pass_at_k,
    per_problem_metrics,
    summarise,
)


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - 3 / 10),        # 1 - C(3,2)/C(5,2)
    (4, 1, 1, 0.25),              # pass@1 = c/n
    (10, 3, 5, 1 - 21 / 252),     # 1 - C(7,5)/C(10,5)
    (5, 0, 3, 0.0),               # nothing right
    (5, 4, 2, 1.0),               # n - c = 1 < k: every 2-subset holds a right answer
    (3, 3, 3, 1.0),
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_answer():
    for n in range(1, 8):
        for c in range(n + 1):
            verdicts = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(verdicts, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_avg_at_k_is_the_mean_over_all_samples():
    assert avg_at_k([True, False, False, True], 2) == 0.5
    assert avg_at_k([True, False, False, False], 4) == 0.25
    with pytest.raises(ValueError):
        avg_at_k([True], 2)


def test_majority_vote_by_hand():
    keys = [0, 1, 1, None, 0]
    correct = [False, True, True, False, False]
    assert maj_at_k(keys, correct, 3) == 1.0      # votes 0, 1, 1: answer 1, right
    assert maj_at_k(keys, correct, 5) == 0.0      # 0 and 1 tie at 2 votes: 0 appeared first, wrong
    assert maj_at_k(keys, correct, 1) == 0.0
    assert maj_at_k([None, None, 2], [False, False, True], 2) == 0.0  # no answer among the first 2
    assert maj_at_k([None, None, 2], [False, False, True], 3) == 1.0  # unanswered samples do not vote
    assert majority_answer(["b", "a", "a", "b"]) == "b"
    assert majority_answer([None]) is None


def test_per_problem_metrics_and_their_intervals():
    correct = [[True, False, False, True], [False, False, False, False], [True, True, True, True]]
    keys = [[0, 1, 1, 0], [0, 0, None, 1], [0, 0, 0, 0]]
    values = per_problem_metrics(correct, keys, [1, 2])
    assert list(values) == metric_names([1, 2]) == ["avg@1", "pass@1", "maj@1", "avg@2", "pass@2", "maj@2"]
    assert values["avg@1"] == values["pass@1"] == [0.5, 0.0, 1.0]
    assert values["pass@2"] == pytest.approx([1 - 1 / 6, 0.0, 1.0])   # 1 - C(2,2)/C(4,2)
    assert values["maj@1"] == [1.0, 0.0, 1.0]
    assert values["maj@2"] == [1.0, 0.0, 1.0]      # keys 0, 1 tie: the first (0) is right
    summary = summarise(values, num_resamples=2000)
    assert summary["avg@1"]["mean"] == pytest.approx(0.5) and summary["avg@1"]["n"] == 3
    assert 0.0 <= summary["avg@1"]["ci_low"] < 0.5 < summary["avg@1"]["ci_high"] <= 1.0
    with pytest.raises(ValueError, match="problem 1 has 1 samples"):
        per_problem_metrics([[True, True], [False]], [[0, 0], [None]], [2])


def test_paired_difference_of_two_policies():
    before = {"pass@1": [0.0, 0.5, 0.25, 0.0]}
    after = {"pass@1": [1.0, 1.5, 1.25, 1.0]}  # every problem up by exactly 1
    diff = compare(before, after, num_resamples=500)["pass@1"]
    assert diff["mean"] == pytest.approx(1.0) and diff["ci_low"] == pytest.approx(1.0)
    assert diff["verdict"] == "improved"
    same = compare(before, before, num_resamples=500)["pass@1"]
    assert same["mean"] == 0.0 and same["verdict"] == "no detectable change"
