"""Win-rate statistics over pairwise judgements (pure Python, no torch).

Counting convention, used everywhere here:
- an item is *valid* when its winner is "a", "b" or "tie"; "invalid" items (transport errors,
  unparseable replies) are counted in `n` and `invalid_rate` but excluded from the win rate;
- the win rate of a is `(wins_a + ties / 2) / num_valid`: a tie is half a win for each side.

Confidence interval: the Wilson score interval for a binomial proportion (Wilson, 1927),

    centre = (p + z^2 / (2n)) / (1 + z^2 / n)
    half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / (4 n^2))

with p the win rate, n = num_valid and z = 1.959963984540054 (two-sided 95%). Unlike the Wald
interval it stays inside [0, 1] and does not collapse when p is 0 or 1 (small evaluation sets).
A tie, half a success, has less variance than a coin flip: the interval is slightly conservative.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from lit_rlhf.judges.base import Judgement

Z_95 = 1.959963984540054  # the 97.5% quantile of the standard normal


class WinRateStats(NamedTuple):
    """Summary of a list of judgements (the module docstring's conventions): `win_rate` (wins_a +
    ties/2) / num_valid and its 95% Wilson interval `ci_low`, `ci_high` (nan when no item is
    valid); `n` items, `num_valid` with winner a, b or tie; the counts; `tie_rate` ties /
    num_valid; `invalid_rate` invalid / n."""

    win_rate: float
    ci_low: float
    ci_high: float
    n: int
    num_valid: int
    wins_a: int
    wins_b: int
    ties: int
    invalid: int
    tie_rate: float
    invalid_rate: float

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat float metrics for a logger, e.g. `as_metrics("val/judge/")` -> {"val/judge/win_rate": ...}."""
        keys = ("win_rate", "ci_low", "ci_high", "n", "num_valid", "tie_rate", "invalid_rate")
        return {f"{prefix}{k}": float(getattr(self, k)) for k in keys}


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for `successes` out of `n` trials (successes may be fractional).

    Returns (nan, nan) when n == 0. Bounds are clipped to [0, 1] against rounding.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def win_rate(judgements: Iterable[Judgement]) -> WinRateStats:
    """Win rate of completion a over b, ties as half, invalid items excluded but counted."""
    counts = Counter(j.winner if j.winner in ("a", "b", "tie") else "invalid" for j in judgements)
    wins_a, wins_b, ties, invalid = (counts[k] for k in ("a", "b", "tie", "invalid"))
    num_valid = wins_a + wins_b + ties
    n, successes = num_valid + invalid, wins_a + 0.5 * ties
    low, high = wilson_interval(successes, num_valid)
    return WinRateStats(successes / num_valid if num_valid else math.nan, low, high, n, num_valid, wins_a, wins_b, ties,
                        invalid, ties / num_valid if num_valid else math.nan, invalid / n if n else math.nan)


class AgreementStats(NamedTuple):
    """How often two judges pick the same winner (`agreement`): `rate` = agree / num_decisive (items
    where both said "a" or "b"; nan when none) with its 95% Wilson interval; `undecided_x`,
    `undecided_y`: items judge x (or y) called "tie" or "invalid"."""

    rate: float
    ci_low: float
    ci_high: float
    n: int
    num_decisive: int
    agree: int
    undecided_x: int
    undecided_y: int


def agreement(judgements_x: Sequence[Judgement], judgements_y: Sequence[Judgement]) -> AgreementStats:
    """The agreement rate of two judges on the same items: among the items where both name a winner
    ("a" or "b"), the fraction where they name the same one; ties and invalid items are excluded
    and counted per judge (as the N+ paper's Detail 17 compares a reward model with a judge)."""
    if len(judgements_x) != len(judgements_y):
        raise ValueError(f"the two judges judged different numbers of items: {len(judgements_x)} and {len(judgements_y)}")
    decisive = agree = undecided_x = undecided_y = 0
    for x, y in zip(judgements_x, judgements_y):
        undecided_x += x.winner not in ("a", "b")
        undecided_y += y.winner not in ("a", "b")
        if x.winner in ("a", "b") and y.winner in ("a", "b"):
            decisive += 1
            agree += x.winner == y.winner
    low, high = wilson_interval(agree, decisive)
    return AgreementStats(agree / decisive if decisive else math.nan, low, high, len(judgements_x), decisive, agree,
                          undecided_x, undecided_y)


@dataclass(frozen=True)
class LengthRatioBuckets:
    """Win rate of a per bucket of log(len_a / len_b) (the N+ paper's Figure 8 x-axis): `edges`
    (num_buckets + 1; bucket k is [edges[k], edges[k+1]), the last one closed), their `centres`,
    and one `WinRateStats` per bucket."""

    edges: list[float]
    centres: list[float]
    stats: list[WinRateStats]

    @property
    def win_rates(self) -> list[float]:
        return [s.win_rate for s in self.stats]

    @property
    def counts(self) -> list[int]:
        return [s.num_valid for s in self.stats]


def log_length_ratio(len_a: float, len_b: float) -> float:
    """log(len_a / len_b), with each length floored at 1 so empty completions stay finite."""
    if len_a < 0 or len_b < 0:
        raise ValueError(f"lengths must be non-negative, got {len_a}, {len_b}")
    return math.log(max(len_a, 1) / max(len_b, 1))


def win_rate_by_length_ratio(judgements: Sequence[Judgement], len_a: Sequence[float], len_b: Sequence[float],
                             num_buckets: int = 10, value_range: tuple[float, float] | None = None) -> LengthRatioBuckets:
    """The win rate of a in `num_buckets` equal-width buckets of log(len_a / len_b) (lengths in any
    unit), spanning `value_range` (items outside dropped) or the valid items' min..max (widened by
    0.5 each side when all are equal); invalid items count in their bucket's `invalid` and `n`."""
    if not (len(judgements) == len(len_a) == len(len_b)):
        raise ValueError(f"judgements, len_a and len_b differ in length: {len(judgements)}, {len(len_a)}, {len(len_b)}")
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    ratios = [log_length_ratio(a, b) for a, b in zip(len_a, len_b)]
    if value_range is not None:
        lo, hi = float(value_range[0]), float(value_range[1])
        if not hi > lo:
            raise ValueError(f"value_range must be increasing, got {value_range}")
    else:
        valid = [r for r, j in zip(ratios, judgements) if j.winner != "invalid"] or ratios
        lo, hi = (min(valid), max(valid)) if valid else (-0.5, 0.5)
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
    width = (hi - lo) / num_buckets
    edges = [lo + k * width for k in range(num_buckets)] + [hi]
    members: list[list[Judgement]] = [[] for _ in range(num_buckets)]
    for r, j in zip(ratios, judgements):
        if r < lo or r > hi:
            continue
        k = min(int((r - lo) / width), num_buckets - 1)
        members[k].append(j)
    centres = [(edges[k] + edges[k + 1]) / 2 for k in range(num_buckets)]
    return LengthRatioBuckets(edges=edges, centres=centres, stats=[win_rate(m) for m in members])
