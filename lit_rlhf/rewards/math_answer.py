"""A math answer checker on the `math-verify` library: 1 for a right final answer, else 0.

The final answer of a text is the text after the last `####` (GSM8K), else what
`math_verify.parse` finds in the whole text (the last `\\boxed{}`, then LaTeX, then a plain
expression), bare LaTeX retried as `$...$`. `math_verify.verify` compares answers symbolically
and numerically (`\\frac{1}{2}` = `0.5`, `1,000` = `1000`). An unparseable completion scores
`incorrect`; an unparseable reference raises, naming it.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_MARKER_LINE = re.compile(r"####\s*([^\n]*)")


def _parse(text: str) -> list:
    from math_verify import parse

    parsed = parse(text)
    if not parsed and "\\" in text and "$" not in text:  # bare LaTeX such as \dfrac{3}{4}
        parsed = parse(f"${text}$")
    return parsed


@functools.lru_cache(maxsize=4096)
def _cached_parse(text: str) -> tuple:
    return tuple(_parse(text))


def final_answer_text(text: str) -> str:
    """The text the answer is read from: what follows the last `####` (GSM8K), else all of it."""
    found = _MARKER_LINE.findall(text or "")
    return found[-1].strip() if found else (text or "").strip()


def parse_answer(text: str) -> list:
    """The parsed final answer of `text` (`math_verify.parse` output; empty when none parses)."""
    candidate = final_answer_text(text)
    return list(_cached_parse(candidate)) if candidate else []


def answers_match(reference: str, completion: str) -> bool:
    """Whether `completion`'s final answer equals `reference`'s; False when it cannot be parsed.

    Raises ValueError when the reference itself cannot be parsed."""
    from math_verify import verify

    gold = parse_answer(reference)
    if not gold:
        raise ValueError(f"the reference answer {reference!r} cannot be parsed as a math answer")
    pred = parse_answer(completion)
    return bool(pred) and bool(verify(gold, pred))


class MathAnswerReward:
    """Verifiable reward: `correct` when the completion's final answer equals the reference's.

    Args:
        column: the batch column holding the reference answer (a number, LaTeX, a `\\boxed{}`
            solution or a GSM8K `... #### 42` solution).
        correct: reward of a right answer.
        incorrect: reward of a wrong or unparseable answer.
    """

    def __init__(self, column: str = "reference", correct: float = 1.0, incorrect: float = 0.0) -> None:
        self.column = column
        self.correct = float(correct)
        self.incorrect = float(incorrect)

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if self.column not in columns:
            raise KeyError(f"MathAnswerReward needs the batch column {self.column!r}; the batch has {sorted(columns)}")
        return [self.correct if answers_match(ref, c) else self.incorrect
                for c, ref in zip(completions, columns[self.column])]


def answer_keys(completions: list[str]) -> list[int | None]:
    """A key per completion for majority voting: equal keys for equivalent final answers (the
    checker `MathAnswerReward` uses, `math_verify.verify` against each group's first answer),
    None for a completion whose answer cannot be parsed. Keys number the groups in order of
    first appearance."""
    from math_verify import verify

    groups: list[list] = []  # the parsed answer that opened each group
    keys: list[int | None] = []
    for text in completions:
        pred = parse_answer(text)
        if not pred:
            keys.append(None)
            continue
        key = next((i for i, first in enumerate(groups) if verify(first, pred)), None)
        if key is None:
            groups.append(pred)
            key = len(groups) - 1
        keys.append(key)
    return keys
