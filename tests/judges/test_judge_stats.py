"""win_rate, the Wilson interval, length-ratio buckets, the seeded order, Judgement."""

from __future__ import annotations

import math

import pytest

from lit_rlhf.judges import Judgement, order_is_swapped, wilson_interval, win_rate, win_rate_by_length_ratio
from lit_rlhf.judges.base import shown_to_winner


def J(winner: str) -> Judgement:
    return Judgement(winner)


def test_wilson_interval_against_hand_computed_values():
    # 7 of 10, z = 1.959964, z^2 = 3.841459:
    #   centre = (0.7 + z^2/20) / (1 + z^2/10) = 0.892073 / 1.384146 = 0.644493
    #   half   = z / (1 + z^2/10) * sqrt(0.21/10 + z^2/400) = 1.416016 * 0.174939 = 0.247715
    #   -> (0.396778, 0.892209), the textbook Wilson interval for 7/10
    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.396778, abs=2e-6)
    assert high == pytest.approx(0.892209, abs=2e-6)
    # 0 of 10: (0, z^2/(n + z^2)) = (0, 3.841459/13.841459) = (0, 0.277533)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.277533, abs=2e-6)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_win_rate_counts_ties_as_half_and_excludes_invalid():
    judgements = [J("a")] * 6 + [J("tie")] * 2 + [J("b")] * 2 + [J("invalid")] * 5
    stats = win_rate(judgements)
    assert (stats.n, stats.num_valid, stats.wins_a, stats.wins_b, stats.ties, stats.invalid) == (15, 10, 6, 2, 2, 5)
    assert stats.win_rate == pytest.approx(0.7)  # (6 + 2/2) / 10
    assert (stats.ci_low, stats.ci_high) == pytest.approx(wilson_interval(7, 10))
    assert stats.tie_rate == pytest.approx(0.2) and stats.invalid_rate == pytest.approx(5 / 15)
    metrics = stats.as_metrics("val/judge/")
    assert metrics["val/judge/win_rate"] == pytest.approx(0.7) and metrics["val/judge/n"] == 15.0


def test_win_rate_of_nothing_valid_is_nan():
    stats = win_rate([J("invalid")] * 3)
    assert math.isnan(stats.win_rate) and math.isnan(stats.ci_low) and stats.invalid_rate == 1.0
    empty = win_rate([])
    assert empty.n == 0 and math.isnan(empty.invalid_rate)


def test_win_rate_by_length_ratio_buckets():
    # log ratios: a twice as long (+0.69) wins, equal lengths (0) tie, a half as long (-0.69) loses
    judgements = [J("a"), J("a"), J("tie"), J("b"), J("b"), J("invalid")]
    len_a = [20, 20, 10, 5, 5, 10]
    len_b = [10, 10, 10, 10, 10, 10]
    buckets = win_rate_by_length_ratio(judgements, len_a, len_b, num_buckets=3)
    log2 = math.log(2)
    assert buckets.edges == pytest.approx([-log2, -log2 / 3, log2 / 3, log2])
    assert buckets.centres == pytest.approx([-2 * log2 / 3, 0.0, 2 * log2 / 3])
    assert buckets.win_rates == pytest.approx([0.0, 0.5, 1.0])
    assert buckets.counts == [2, 1, 2]
    assert buckets.stats[1].invalid == 1  # the invalid item sits in its bucket, outside the rate
    # a fixed range with an empty bucket; empty completions are floored at length 1
    fixed = win_rate_by_length_ratio([J("a"), J("b")], [0, 30], [1, 10], num_buckets=2, value_range=(-2.0, 2.0))
    assert fixed.counts == [0, 2] and math.isnan(fixed.win_rates[0]) and fixed.win_rates[1] == 0.5
    with pytest.raises(ValueError):
        win_rate_by_length_ratio([J("a")], [1, 2], [1, 2], num_buckets=2)


def test_order_is_seeded_deterministic_and_balanced():
    orders = [order_is_swapped(3, i) for i in range(1000)]
    assert orders == [order_is_swapped(3, i) for i in range(1000)]
    assert orders != [order_is_swapped(4, i) for i in range(1000)]
    assert 0.45 < sum(orders) / 1000 < 0.55  # a fair coin: sd 0.016 for n = 1000


def test_shown_verdicts_map_back_and_judgement_validates():
    assert shown_to_winner("first", False) == "a" and shown_to_winner("first", True) == "b"
    assert shown_to_winner("second", False) == "b" and shown_to_winner("second", True) == "a"
    assert shown_to_winner("tie", True) == "tie" and shown_to_winner(None, True) == "invalid"
    with pytest.raises(ValueError):
        Judgement("A")
    with pytest.raises(AttributeError):
        J("a").winner = "b"  # frozen
