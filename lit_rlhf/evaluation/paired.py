"""Paired comparisons of two policies on the same prompts (pure Python + scipy, no torch).

Every evaluation item i is scored twice, once for each policy (`before[i]`, `after[i]`), so the
comparison is paired: the prompt-to-prompt spread cancels in the differences d_i = after_i -
before_i, and intervals are far tighter than two independent means would give.

- `paired_difference`: the mean of d with a Student-t 95% interval,
  mean(d) +- t_{0.975, n-1} * sd(d) / sqrt(n), and the two-sided paired t-test p-value; for an
  interval that does not lean on normality, `bootstrap_interval` resamples items (percentile
  bootstrap, seeded, so a report is reproducible).
- `paired_win_rate`: how often `after` beats `before` item by item (ties count half, as in
  `lit_rlhf.judges.stats`), with the Wilson interval, which stays inside [0, 1].
- `proportion`: a success count with its Wilson interval (accuracies, agreement rates).

Decision rule used by the reports: a difference is called an improvement when its whole 95%
interval lies above zero, a regression when it lies below, and "no detectable change" otherwise.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple, Sequence

from lit_rlhf.judges.stats import wilson_interval


class PairedDifference(NamedTuple):
    """Summary of after - before over n paired items (see the module docstring)."""

    n: int
    mean_before: float
    mean_after: float
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def verdict(self) -> str:
        if self.ci_low > 0:
            return "improved"
        if self.ci_high < 0:
            return "regressed"
        return "no detectable change"

    def as_dict(self) -> dict[str, float | int | str]:
        return {**self._asdict(), "verdict": self.verdict}


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
    """Percentile bootstrap interval of mean(after - before), resampling items with replacement."""
    diffs = _check_pairs(before, after)
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(num_resamples))
    tail = (1 - confidence) / 2
    return means[int(math.floor(tail * (num_resamples - 1)))], means[int(math.ceil((1 - tail) * (num_resamples - 1)))]


def proportion(successes: float, n: int) -> Proportion:
    """`successes` of `n` with its Wilson 95% interval."""
    low, high = wilson_interval(successes, n)
    return Proportion(n, float(successes), successes / n if n else math.nan, low, high)


def paired_win_rate(before: Sequence[float], after: Sequence[float]) -> Proportion:
    """Fraction of items where `after` scores higher than `before`, ties as half a win."""
    diffs = _check_pairs(before, after)
    return proportion(sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs), len(diffs))
