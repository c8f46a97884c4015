"""Paired comparisons of two policies on the same prompts (pure Python + scipy, no torch).

Every item is scored for both policies, so the prompt-to-prompt spread cancels in d_i = after_i -
before_i. `paired_difference`: mean(d) with the Student-t 95% interval mean(d) +- t_{0.975, n-1}
sd(d) / sqrt(n) and the paired t-test p-value (`bootstrap_interval`: a seeded percentile bootstrap
over items instead). `paired_win_rate`: how often `after` beats `before` (ties half, as
`lit_rlhf.judges.stats`) with the Wilson interval; `proportion`: a count with its Wilson interval;
`clopper_pearson_interval`: the exact binomial interval. Over prompts AND training seeds,
`bootstrap_mean` / `paired_bootstrap` resample seeds, then prompts (`hierarchical_bootstrap`), so
both sources of variance count; `sign_test` is the exact two-sided sign test (McNemar's exact
test on 0/1 scores). A difference is an improvement when its whole 95% interval lies above zero,
a regression when below, else "no detectable change".
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from lit_rlhf.judges.stats import wilson_interval


def _verdict(low: float, high: float) -> str:
    return "improved" if low > 0 else "regressed" if high < 0 else "no detectable change"


def _with_verdict(self) -> dict[str, float | int | str]:
    return {**self._asdict(), "verdict": self.verdict}


class PairedDifference(NamedTuple):
    """Summary of after - before over n paired items (see the module docstring)."""

    n: int
    mean_before: float
    mean_after: float
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float

    verdict = property(lambda self: _verdict(self.ci_low, self.ci_high))
    as_dict = _with_verdict


class Proportion(NamedTuple):
    """successes / n with its 95% Wilson interval (successes may be fractional: ties as half)."""

    n: int
    successes: float
    rate: float
    ci_low: float
    ci_high: float

    def as_dict(self) -> dict[str, float | int]:
        return self._asdict()


def _check_pairs(before: Sequence[float], after: Sequence[float]) -> list[float]:
    if len(before) != len(after):
        raise ValueError(f"paired scores differ in length: {len(before)} before, {len(after)} after")
    if len(before) < 2:
        raise ValueError(f"a paired comparison needs at least 2 items, got {len(before)}")
    diffs = [float(a) - float(b) for b, a in zip(before, after)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError("paired scores must be finite")
    return diffs


def paired_difference(before: Sequence[float], after: Sequence[float], confidence: float = 0.95) -> PairedDifference:
    """Mean of after - before with a Student-t interval and the paired t-test p-value."""
    from scipy import stats

    diffs = _check_pairs(before, after)
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0.0:
        low = high = mean
        p = 1.0 if mean == 0 else 0.0
    else:
        se = sd / math.sqrt(n)
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
        low, high = mean - half, mean + half
        p = float(2 * stats.t.sf(abs(mean / se), n - 1))
    return PairedDifference(n, sum(map(float, before)) / n, sum(map(float, after)) / n, mean, low, high, p)


def bootstrap_interval(before: Sequence[float], after: Sequence[float], num_resamples: int = 10000,
                       confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(after - before), resampling items with replacement
    (`hierarchical_bootstrap` with one seed)."""
    diffs = _check_pairs(before, after)
    means = hierarchical_bootstrap([diffs], num_resamples, seed)
    return _percentiles(means, confidence)


class BootstrapMean(NamedTuple):
    """A mean over seeds x prompts with its hierarchical percentile bootstrap interval.

    p_value: two-sided bootstrap p-value of "mean = 0", 2 * min(P*(mean <= 0), P*(mean >= 0))
    over the resampled means (capped at 1); meaningful for differences, not for a plain mean.
    """

    num_seeds: int
    num_prompts: int
    mean: float
    ci_low: float
    ci_high: float
    p_value: float

    verdict = property(lambda self: _verdict(self.ci_low, self.ci_high))
    as_dict = _with_verdict


def _grid(values_by_seed: Sequence[Sequence[float]]) -> np.ndarray:
    grid = np.asarray([[float(v) for v in row] for row in values_by_seed], dtype=np.float64)
    if grid.ndim != 2 or grid.shape[0] < 1 or grid.shape[1] < 1:
        raise ValueError(f"need one equally long row of per-prompt values per seed, got shape {grid.shape}")
    if not np.isfinite(grid).all():
        raise ValueError("per-prompt values must be finite")
    return grid


def hierarchical_bootstrap(values_by_seed: Sequence[Sequence[float]], num_resamples: int = 10000,
                           seed: int = 0) -> np.ndarray:
    """Bootstrap means of a (seeds, prompts) grid -> (num_resamples,): each resample draws S seeds,
    then P prompts, with replacement (prompts are crossed with seeds), and averages the S x P cells.
    Its variance is var(a)/S + var(b)/P + mean(e^2)/(S P) (seed, prompt and interaction effects), so
    both spreads count; one seed is the plain item bootstrap. Seeded (numpy PCG64)."""
    grid = _grid(values_by_seed)
    seeds, prompts = grid.shape
    rng = np.random.default_rng(seed)
    means = np.empty(num_resamples)
    for start in range(0, num_resamples, 1000):  # blocks bound the memory to 1000 x S x P cells
        size = min(1000, num_resamples - start)
        rows = rng.integers(0, seeds, size=(size, seeds))  # (R, S)
        cols = rng.integers(0, prompts, size=(size, prompts))  # (R, P)
        means[start:start + size] = grid[rows[:, :, None], cols[:, None, :]].mean(axis=(1, 2))
    return means


def _percentiles(means: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def bootstrap_mean(values_by_seed: Sequence[Sequence[float]], num_resamples: int = 10000, confidence: float = 0.95,
                   seed: int = 0) -> BootstrapMean:
    """The mean of a (seeds, prompts) grid with its hierarchical percentile bootstrap interval.
    The interval lies within the values' range, so a mean of 0/1 scores stays inside [0, 1]."""
    grid = _grid(values_by_seed)
    means = hierarchical_bootstrap(grid, num_resamples, seed)
    low, high = _percentiles(means, confidence)
    p = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    return BootstrapMean(grid.shape[0], grid.shape[1], float(grid.mean()), low, high, p)


def paired_bootstrap(ours_by_seed: Sequence[Sequence[float]], theirs_by_seed: Sequence[Sequence[float]],
                     num_resamples: int = 10000, confidence: float = 0.95, seed: int = 0) -> BootstrapMean:
    """mean(ours - theirs) over seeds x prompts, paired cell by cell, with the hierarchical
    bootstrap interval and p-value. `theirs_by_seed` may hold ONE row (a policy without
    training seeds, e.g. the starting policy): it is then paired with every seed of ours."""
    ours, theirs = _grid(ours_by_seed), _grid(theirs_by_seed)
    if theirs.shape[0] == 1:
        theirs = np.repeat(theirs, ours.shape[0], axis=0)
    if ours.shape != theirs.shape:
        raise ValueError(f"paired grids differ in shape: {ours.shape} (seeds, prompts) against {theirs.shape}")
    return bootstrap_mean(ours - theirs, num_resamples, confidence, seed)


class SignTest(NamedTuple):
    """Exact two-sided sign test: `positive` of the `positive + negative` non-zero differences
    are positive; zeros (ties) are dropped and counted."""

    positive: int
    negative: int
    ties: int
    p_value: float


def sign_test(differences: Sequence[float]) -> SignTest:
    """Exact two-sided sign test of "a difference is as likely positive as negative".

    With n non-zero differences, k of them positive: p = min(1, 2 P(X <= min(k, n - k))),
    X ~ Binomial(n, 1/2), computed exactly (no normal approximation). With paired 0/1 scores
    the non-zero differences are the discordant pairs: this is McNemar's exact test. p = 1 when
    every difference is 0."""
    values = [float(d) for d in differences]
    if not all(math.isfinite(d) for d in values):
        raise ValueError("differences must be finite")
    positive = sum(d > 0 for d in values)
    negative = sum(d < 0 for d in values)
    n = positive + negative
    tail = sum(math.comb(n, i) for i in range(min(positive, negative) + 1))
    p = min(1.0, 2 * tail / 2**n) if n else 1.0
    return SignTest(positive, negative, len(values) - n, p)


def clopper_pearson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion, inside [0, 1]:
    low = Beta(alpha/2; k, n - k + 1), high = Beta(1 - alpha/2; k + 1, n - k) quantiles, with
    low = 0 at k = 0 and high = 1 at k = n. (nan, nan) when n == 0."""
    from scipy import stats

    if n < 0 or not 0 <= successes <= n or int(successes) != successes:
        raise ValueError(f"need an integer 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return math.nan, math.nan
    alpha = 1 - confidence
    low = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes, n - successes + 1))
    high = 1.0 if successes == n else float(stats.beta.ppf(1 - alpha / 2, successes + 1, n - successes))
    return low, high


def proportion(successes: float, n: int) -> Proportion:
    """`successes` of `n` with its Wilson 95% interval."""
    low, high = wilson_interval(successes, n)
    return Proportion(n, float(successes), successes / n if n else math.nan, low, high)


def paired_win_rate(before: Sequence[float], after: Sequence[float]) -> Proportion:
    """Fraction of items where `after` scores higher than `before`, ties as half a win."""
    diffs = _check_pairs(before, after)
    return proportion(sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs), len(diffs))
