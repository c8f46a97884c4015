"""n sampled answers per problem of a verifiable task, checked, for `lit_rlhf.evaluation.pass_at_k`
(used by `python -m lit_rlhf.apps.pass_at_k` and `callbacks.PassAtKCallback`): each prompt sampled
n times (`generate_completions`: reproducible, the training RNG untouched), each answer checked
against the reference (`rewards.math_answer.answers_match`) and grouped with equivalent ones for
majority voting (`answer_keys`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from lit_rlhf.evaluation.completions import generate_completions
from lit_rlhf.evaluation.pass_at_k import per_problem_metrics
from lit_rlhf.evaluation.prompts import EvalPrompts
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.rewards.math_answer import answer_keys, answers_match


class SampledAnswers(NamedTuple):
    """Per problem: its n completions, their verdicts and answer keys, and each metric's value."""

    completions: list[list[str]]
    correct: list[list[bool]]
    answers: list[list[int | None]]
    values: dict[str, list[float]]

    def records(self, prompts: EvalPrompts) -> list[dict[str, Any]]:
        """One JSON-ready row per problem (prompt, reference, completions, verdicts, metrics)."""
        return [{"prompt": prompts.prompts[i], "reference": prompts.references[i],
                 "completions": self.completions[i], "correct": self.correct[i], "answers": self.answers[i],
                 **{name: v[i] for name, v in self.values.items()}} for i in range(len(self.completions))]


def check_answers(completions: Sequence[Sequence[str]], references: Sequence[str], ks: Sequence[int]) -> SampledAnswers:
    """Verdicts, answer keys and per-problem metrics of each problem's completions.

    A reference that cannot be parsed is a data error: ValueError naming the problem."""
    if len(completions) != len(references):
        raise ValueError(f"{len(completions)} problems' completions for {len(references)} references")
    correct = []
    for i, (texts, reference) in enumerate(zip(completions, references)):
        try:
            correct.append([answers_match(reference, t) for t in texts])
        except ValueError as err:
            raise ValueError(f"problem {i}: {err}") from err
    answers = [answer_keys(list(texts)) for texts in completions]
    values = per_problem_metrics(correct, answers, ks)
    return SampledAnswers([list(t) for t in completions], correct, answers, values)


def sample_answers(model: Any, tokenizer: Any, prompts: EvalPrompts, n: int, ks: Sequence[int],
                   sampling: SamplingConfig, batch_size: int = 16, seed: int = 0, synced_gpus: bool = False,
                   engine: Any = None) -> SampledAnswers:
    """n sampled completions of every problem, checked (see the module docstring).

    The rows are prompt-major (problem 0's n samples, then problem 1's ...), so a batch holds
    whole problems when `batch_size` is a multiple of n."""
    if n < max(ks):
        raise ValueError(f"{n} samples per problem cannot give k={max(ks)}")
    if n > 1 and not sampling.do_sample:
        raise ValueError("n > 1 samples per problem need do_sample: true (greedy answers are all the same)")
    references = prompts.require_references()
    rows = [ids for ids in prompts.prompt_ids for _ in range(n)]
    texts = generate_completions(model, tokenizer, rows, sampling, batch_size, synced_gpus=synced_gpus, seed=seed,
                                 engine=engine)
    return check_answers([texts[i * n:(i + 1) * n] for i in range(len(prompts))], references, ks)
