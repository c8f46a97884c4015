"""Paired statistics against values worked out by hand or in closed form."""

from __future__ import annotations

import math

import pytest

import numpy as np

from lit_rlhf.evaluation.paired import (
    bootstrap_interval,
    bootstrap_mean,
    clopper_pearson_interval,
    hierarchical_bootstrap,
    paired_bootstrap,
    paired_difference,
    paired_win_rate,
    proportion,
    sign_test,
)


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


def test_hierarchical_bootstrap_variance_is_the_closed_form():
    # grid = a_s + b_p + e_sp; resampling seeds, then prompts (crossed), the bootstrap variance of
    # the grid mean is var(a)/S + var(b)/P + mean(e^2)/(S P) (population variances)
    rng = np.random.default_rng(0)
    grid = rng.normal(size=(3, 1))*2 + rng.normal(size=(1, 40)) + 0.5 * rng.normal(size=(3, 40))
    grand = grid.mean()
    a, b = grid.mean(axis=1) - grand, grid.mean(axis=0) - grand
    e = grid - grand - a[:, None] - b[None, :]
    expected = a.var() / 3 + b.var() / 40 + (e**2).mean() / (3 * 40)
    means = hierarchical_bootstrap(grid.tolist(), num_resamples=40000, seed=1)
    assert means.mean() == pytest.approx(grand, abs=0.02)
    assert means.var() == pytest.approx(expected, rel=0.04)
    # nesting prompts inside seeds instead (fresh prompts per seed) would count var(b) S times less
    assert expected > a.var() / 3 + b.var() / 120 + (e**2).mean() / 120 + 0.002


def test_bootstrap_mean_of_two_seeds_and_prompts_by_hand():
    # seeds constant within: resampled means are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4
    means = hierarchical_bootstrap([[0.0, 0.0], [1.0, 1.0]], num_resamples=20000, seed=2)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0}
    assert (means == 0.5).mean() == pytest.approx(0.5, abs=0.015)
    cell = bootstrap_mean([[0.0, 0.0], [1.0, 1.0]], num_resamples=20000)
    assert (cell.mean, cell.ci_low, cell.ci_high, cell.num_seeds, cell.num_prompts) == (0.5, 0.0, 1.0, 2, 2)
    # 0/1 scores: the interval stays inside [0, 1] (a t interval over 3 seeds would not)
    accuracy = bootstrap_mean([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert 0.0 <= accuracy.ci_low <= accuracy.mean <= accuracy.ci_high <= 1.0
    assert accuracy.ci_low == 0.0
    constant = bootstrap_mean([[0.25, 0.25], [0.25, 0.25]], num_resamples=100)
    assert (constant.ci_low, constant.ci_high) == (0.25, 0.25)


def test_paired_bootstrap_pairs_cells_and_broadcasts_a_seedless_policy():
    ours = [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]]
    start = [[0.0, 0.0, 0.0, 1.0]]  # the starting policy: one row, paired with every seed
    d = paired_bootstrap(ours, start, num_resamples=4000)
    assert d.mean == pytest.approx(((1 + 0 + 1 + 0) + (1 + 1 + 0 + 0)) / 8)
    assert d.ci_low <= d.mean <= d.ci_high
    same = paired_bootstrap(ours, ours, num_resamples=100)
    assert (same.mean, same.ci_low, same.ci_high, same.p_value, same.verdict) == (0.0, 0.0, 0.0, 1.0,
                                                                                   "no detectable change")
    better = paired_bootstrap([[1.0] * 30] * 3, [[0.0] * 30], num_resamples=500)
    assert better.verdict == "improved" and better.p_value == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        paired_bootstrap(ours, [[0.0, 1.0]])
    with pytest.raises(ValueError, match="finite"):
        bootstrap_mean([[0.0, math.nan]])


def test_sign_test_exact_values():
    # 9 of 10 non-zero differences positive: p = 2 (C(10,0) + C(10,1)) / 2^10 = 22/1024
    t = sign_test([1.0] * 9 + [-2.0] + [0.0] * 5)
    assert (t.positive, t.negative, t.ties) == (9, 1, 5)
    assert t.p_value == pytest.approx(22 / 1024, abs=1e-15)
    # 10 of 10: 2/1024; a balanced 3-3 split is capped at 1; no non-zero difference: 1
    assert sign_test([0.5] * 10).p_value == pytest.approx(2 / 1024)
    assert sign_test([1, 1, 1, -1, -1, -1]).p_value == 1.0
    assert sign_test([0.0, 0.0]).p_value == 1.0
    # 6 of 8: 2 (1 + 8 + 28) / 256 = 0.2890625 (McNemar's exact test on 8 discordant pairs)
    assert sign_test([1] * 6 + [-1] * 2).p_value == pytest.approx(74 / 256)


def test_clopper_pearson_closed_forms():
    # k = 0: high = 1 - (alpha/2)^(1/n); k = n: low = (alpha/2)^(1/n)
    assert clopper_pearson_interval(0, 10) == pytest.approx((0.0, 1 - 0.025 ** 0.1), abs=1e-9)
    assert clopper_pearson_interval(10, 10) == pytest.approx((0.025 ** 0.1, 1.0), abs=1e-9)
    # n = 1, k = 1: low = 0.025 (Beta(1, 1) is uniform)
    assert clopper_pearson_interval(1, 1) == pytest.approx((0.025, 1.0), abs=1e-12)
    # 5 of 10: the published (0.187086, 0.812914)
    assert clopper_pearson_interval(5, 10) == pytest.approx((0.187086, 0.812914), abs=1e-6)
    low, high = clopper_pearson_interval(3, 100)
    assert 0.0 < low < 0.03 < high < 1.0
    assert clopper_pearson_interval(3, 100)[0] < proportion(3, 100).ci_low  # exact is wider than Wilson
    assert all(math.isnan(x) for x in clopper_pearson_interval(0, 0))
    with pytest.raises(ValueError):
        clopper_pearson_interval(11, 10)
