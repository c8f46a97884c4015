"""A pointwise rubric judge: weighted criteria, each scored by an LLM judge, aggregated.

A `Criterion` is a name, a sentence an answer should satisfy, and a weight; a `PointwiseScorer`
(`lit_rlhf.judges.pointwise`) scores each (prompt, completion) on one criterion in [0, 1].
`RubricJudge` aggregates each answer's scores by `mean` (weighted, over the criteria scored),
`min` (weight 0 leaves a criterion out) or `all_pass` (1 when every scored criterion of positive
weight reaches `pass_threshold`).

Failures never stop a run: a scorer call that raises or returns the wrong results makes that
criterion invalid for the call, an unreadable item (or a score outside [0, 1]) for that item.
Invalid criteria are left out of the aggregate, counted (`invalid_scores`, `failed_calls`,
`invalid_by_criterion`) and logged; an answer with no valid criterion has no score (None).
"""

from __future__ import annotations

import abc
import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal, NamedTuple, Sequence

log = logging.getLogger(__name__)

Aggregation = Literal["mean", "min", "all_pass"]

POINTWISE_TEMPLATE = (
    "Read the request and the response, then decide whether the response meets the criterion.\n\n"
    "[Request]\n{prompt}\n\n[Response]\n{completion}\n\n[Criterion]\n{criterion}\n\n"
    "Does the response meet the criterion? Answer Yes or No."
)


@dataclass(frozen=True)
class Criterion:
    """One rubric line: `description` is what the judge is asked about the response."""

    name: str
    description: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or not self.description:
            raise ValueError(f"a criterion needs a name and a description, got {self!r}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"criterion {self.name!r}: weight must be finite and >= 0, got {self.weight}")


class PointScore(NamedTuple):
    """A scorer's reading of one item on one criterion: `value` in [0, 1], or None (invalid,
    with the reason in `error`); `raw` is what the judge produced."""

    value: float | None
    raw: str = ""
    error: str | None = None


class PointwiseScorer(abc.ABC):
    """Scores each (prompt, completion) on one criterion in [0, 1].

    Contract (as `PairwiseJudge`'s): exactly one `PointScore` per item, in order; a failure
    confined to one item makes that item invalid (value None, `error` set) instead of raising."""

    @abc.abstractmethod
    def score(self, prompts: list[str], completions: list[str], criterion: Criterion) -> list[PointScore]:
        """One PointScore per item."""


def check_pairs(prompts: Sequence[str], completions: Sequence[str]) -> None:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")


class RubricResult(NamedTuple):
    """`scores[i]`: answer i's aggregate (None when no criterion could be scored);
    `by_criterion[name][i]`: its score on one criterion (None: invalid)."""

    scores: list[float | None]
    by_criterion: dict[str, list[float | None]]


class RubricJudge:
    """Scores answers on weighted criteria with a `PointwiseScorer` and aggregates them.

    Args:
        criteria: the rubric (in YAML a list of `{name, description, weight}`); names are unique
            and at least one weight is positive.
        scorer: a `PointwiseScorer` (`lit_rlhf.judges.LocalLMScorer`, `ChatAPIScorer`).
        aggregation: `mean`, `min` or `all_pass` (see the module docstring).
        pass_threshold: the score a criterion must reach to pass (`all_pass`).
    """

    def __init__(self, criteria: Sequence[Criterion], scorer: PointwiseScorer, aggregation: Aggregation = "mean",
                 pass_threshold: float = 0.5) -> None:
        self.criteria = [c if isinstance(c, Criterion) else Criterion(**c) for c in criteria]
        names = [c.name for c in self.criteria]
        if not self.criteria or len(set(names)) != len(names):
            raise ValueError(f"a rubric needs at least one criterion with unique names, got {names}")
        if not any(c.weight > 0 for c in self.criteria):
            raise ValueError("a rubric needs at least one criterion of positive weight")
        if aggregation not in ("mean", "min", "all_pass"):
            raise ValueError(f"aggregation must be 'mean', 'min' or 'all_pass', got {aggregation!r}")
        self.scorer = scorer
        self.aggregation = aggregation
        self.pass_threshold = float(pass_threshold)
        self.calls = 0
        self.failed_calls = 0  # scorer calls that raised or returned something other than one PointScore per item
        self.invalid_scores = 0  # (item, criterion) scores that were invalid, failed calls included
        self.invalid_by_criterion: Counter[str] = Counter()

    def score(self, prompts: list[str], completions: list[str]) -> RubricResult:
        """Every criterion's scores and each answer's aggregate; never raises for a judge failure."""
        check_pairs(prompts, completions)
        by_criterion = {c.name: self._criterion_scores(list(prompts), list(completions), c) for c in self.criteria}
        scores = [self.aggregate({name: values[i] for name, values in by_criterion.items()})
                  for i in range(len(completions))]
        return RubricResult(scores, by_criterion)

    def aggregate(self, values: dict[str, float | None]) -> float | None:
        """One answer's score from its criteria's scores (None: invalid, left out)."""
        scored = [(c.weight, values[c.name]) for c in self.criteria if values[c.name] is not None and c.weight > 0]
        if not scored:
            return None
        if self.aggregation == "mean":
            return sum(w * v for w, v in scored) / sum(w for w, _ in scored)
        if self.aggregation == "min":
            return min(v for _, v in scored)
        return float(all(v >= self.pass_threshold for _, v in scored))

    def _criterion_scores(self, prompts: list[str], completions: list[str], criterion: Criterion) -> list[float | None]:
        n = len(prompts)
        if n == 0:
            return []
        self.calls += 1
        name = type(self.scorer).__name__
        try:
            out = list(self.scorer.score(prompts, completions, criterion))
        except Exception as err:  # noqa: BLE001 - a judge (an API, a model) must not stop the run
            out, failure = None, f"raised {type(err).__name__}: {err}"
        else:
            failure = None if len(out) == n and all(isinstance(s, PointScore) for s in out) else \
                f"returned {len(out)} results that are not {n} PointScores"
        if failure is not None:
            self.failed_calls += 1
            self._count_invalid(criterion.name, n)
            log.warning("rubric scorer %s %s on criterion %r; its %d items are invalid (%d failed calls so far)",
                        name, failure, criterion.name, n, self.failed_calls)
            return [None] * n
        values = [s.value if _valid(s.value) else None for s in out]
        bad = sum(v is None for v in values)
        if bad:
            self._count_invalid(criterion.name, bad)
            first = next((s.error or f"value {s.value!r}" for s, v in zip(out, values) if v is None), None)
            log.warning("rubric scorer %s: %d of %d items invalid on criterion %r (first: %s; %d invalid so far)",
                        name, bad, n, criterion.name, first, self.invalid_scores)
        return [None if v is None else float(v) for v in values]

    def _count_invalid(self, criterion: str, count: int) -> None:
        self.invalid_scores += count
        self.invalid_by_criterion[criterion] += count


def _valid(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0.0 <= value <= 1.0
