"""Paired statistics against values worked out by hand or in closed form."""

from __future__ import annotations

import math

import pytest

from lit_rlhf.evaluation.paired import bootstrap_interval, paired_difference, paired_win_rate, proportion


def test_paired_t_interval_by_hand():
    # differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t_{0.975, 2} = 4.302653 -> half width 2.48414
    d = paired_difference([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    assert (d.n, d.mean_before, d.mean_after, d.mean_diff) == (3, 0.0, 2.0, 2.0)
    assert d.ci_low == pytest.approx(2 - 2.484138, abs=1e-5)
    assert d.ci_high == pytest.approx(2 + 2.484138, abs=1e-5)
    # t = 2 / (1/sqrt 3) = 3.4641 with 2 degrees of freedom: two-sided p = 0.07418
    assert d.p_value == pytest.approx(0.0741799, abs=1e-5)
    assert d.verdict == "no detectable change"


def test_pairing_removes_the_prompt_spread():
    before = [0.0, 10.0, 20.0, 30.0]
    after = [b + 1.0 + 0.1 * (i % 2) for i, b in enumerate(before)]  # a steady gain over very different prompts
    d = paired_difference(before, after)
    assert d.ci_low > 0.9 and d.verdict == "improved"
    assert paired_difference(after, before).verdict == "regressed"


def test_constant_differences_and_bad_input():
    d = paired_difference([1.0, 2.0], [1.5, 2.5])
    assert (d.ci_low, d.ci_high, d.p_value) == (0.5, 0.5, 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least 2"):
        paired_difference([1.0], [2.0])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1.0, math.nan], [1.0, 2.0])


def test_bootstrap_is_seeded_and_brackets_the_mean():
    before, after = [0.0] * 8, [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    low, high = bootstrap_interval(before, after, num_resamples=2000, seed=3)
    assert (low, high) == bootstrap_interval(before, after, num_resamples=2000, seed=3)
    assert 0.0 <= low < 0.625 < high <= 1.0


def test_win_rate_counts_ties_half_with_wilson_bounds():
    w = paired_win_rate([0, 0, 0, 0], [1, 0, -1, 1])  # two wins, one tie, one loss
    assert (w.n, w.successes, w.rate) == (4, 2.5, 0.625)
    assert 0.0 <= w.ci_low < w.rate < w.ci_high <= 1.0
    p = proportion(0, 10)
    assert p.ci_low == 0.0 and 0 < p.ci_high < 0.35  # Wilson: a real upper bound at 0 successes
