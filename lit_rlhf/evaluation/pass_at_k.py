"""pass@k, avg@k and maj@k of n sampled answers per problem (pure Python, no torch).

Every sampled answer has a verdict and, for majority voting, an answer key (equal for equivalent
answers, `lit_rlhf.rewards.math_answer.answer_keys`; None when unreadable). With n samples of one
problem, c of them right:

- **pass@k**: P(at least one of k samples is right), estimated without bias from n >= k samples
  (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Eq. 1):
  `1 - C(n - c, k) / C(n, k)`, computed as `1 - prod_{i = n - c + 1}^{n} (1 - k / i)`; 1 when
  n - c < k.
- **avg@k**: the mean accuracy of k samples, estimated by c / n (equal to pass@1).
- **maj@k**: whether the majority answer of the first k samples is right (self-consistency, Wang
  et al. 2023): unanswered samples do not vote, a tie goes to the answer seen first, no answer is
  wrong, and the winner's verdict is that of its first sample.

`per_problem_metrics` gives the per-problem values, `summarise` their means with percentile
bootstrap intervals over problems (`paired.bootstrap_mean`), `compare` the paired differences of
two policies (`paired_bootstrap`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Sequence

from lit_rlhf.evaluation.paired import bootstrap_mean, paired_bootstrap


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c right (Chen et al. 2021, Eq. 1)."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes integers, got n={n!r}, c={c!r}, k={k!r}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (pass@{k} from {n} samples)")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def avg_at_k(correct: Sequence[bool], k: int) -> float:
    """Mean accuracy of k samples, estimated from all n >= k samples: c / n."""
    n = len(correct)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (avg@{k} from {n} samples)")
    return sum(bool(x) for x in correct) / n


def majority_answer(keys: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent non-None key; a tie goes to the key seen first; None when none."""
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(key for key in keys if key is not None and counts[key] == top)


def maj_at_k(keys: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """1.0 when the majority answer of the first k samples is right, else 0.0."""
    if len(keys) != len(correct):
        raise ValueError(f"{len(keys)} answers for {len(correct)} verdicts")
    if not 1 <= k <= len(keys):
        raise ValueError(f"need 1 <= k <= n (maj@{k} from {len(keys)} samples)")
    winner = majority_answer(keys[:k])  # scored by the verdict of the answer's first sample
    return 0.0 if winner is None else float(bool(correct[list(keys).index(winner)]))


def metric_names(ks: Sequence[int]) -> list[str]:
    """`avg@k`, `pass@k` and `maj@k` for each k, in that order."""
    return [f"{metric}@{k}" for k in ks for metric in ("avg", "pass", "maj")]


def per_problem_metrics(correct: Sequence[Sequence[bool]], keys: Sequence[Sequence[Hashable | None]],
                        ks: Sequence[int]) -> dict[str, list[float]]:
    """{`avg@k` / `pass@k` / `maj@k`: one value per problem} from each problem's n verdicts and
    answer keys (every problem needs n >= max(ks) samples)."""
    if len(correct) != len(keys) or not correct:
        raise ValueError(f"need verdicts and answers for the same problems, got {len(correct)} and {len(keys)}")
    out: dict[str, list[float]] = {name: [] for name in metric_names(ks)}
    for i, (verdicts, answers) in enumerate(zip(correct, keys)):
        n, c = len(verdicts), sum(bool(x) for x in verdicts)
        if n < max(ks):
            raise ValueError(f"problem {i} has {n} samples, fewer than k={max(ks)}")
        for k in ks:
            out[f"avg@{k}"].append(avg_at_k(verdicts, k))
            out[f"pass@{k}"].append(pass_at_k(n, c, k))
            out[f"maj@{k}"].append(maj_at_k(answers, verdicts, k))
    return out


def summarise(values: dict[str, Sequence[float]], num_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Each metric's mean over problems with its 95% percentile bootstrap interval (problems
    resampled with replacement)."""
    means = {name: bootstrap_mean([list(v)], num_resamples, seed=seed) for name, v in values.items()}
    return {name: {"n": r.num_prompts, "mean": r.mean, "ci_low": r.ci_low, "ci_high": r.ci_high}
            for name, r in means.items()}


def compare(before: dict[str, Sequence[float]], after: dict[str, Sequence[float]], num_resamples: int = 10000,
            seed: int = 0) -> dict[str, Any]:
    """Each metric's paired difference after - before over the same problems, with its 95%
    bootstrap interval, p-value and verdict (`lit_rlhf.evaluation.paired.BootstrapMean`)."""
    return {name: paired_bootstrap([list(after[name])], [list(before[name])], num_resamples, seed=seed).as_dict()
            for name in before}
