"""Two small example reward functions; the tests learn from them."""

from __future__ import annotations

from typing import Any


class CharacterFractionReward:
    """Reward = fraction of the completion's characters that are in `chars` (0 for an empty one).

    Args:
        chars: the characters that earn reward.
        scale: multiplies the fraction.
    """

    def __init__(self, chars: str = "abcdefghijklmnopqrstuvwxyz", scale: float = 1.0) -> None:
        if not chars:
            raise ValueError("chars must not be empty")
        self.chars = set(chars)
        self.scale = scale

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [self.scale * (sum(c in self.chars for c in text) / len(text) if text else 0.0) for text in completions]


class ReferenceMatchReward:
    """Verifiable reward: 1 when the completion (stripped) equals the `reference` column, else 0.

    Args:
        column: the batch column holding the expected answer.
        strip: compare stripped texts.
    """

    def __init__(self, column: str = "reference", strip: bool = True) -> None:
        self.column = column
        self.strip = strip

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if self.column not in columns:
            raise KeyError(f"ReferenceMatchReward needs the batch column {self.column!r}; the batch has {sorted(columns)}")
        norm = (lambda s: (s or "").strip()) if self.strip else (lambda s: s or "")
        return [float(norm(c) == norm(r)) for c, r in zip(completions, columns[self.column])]
