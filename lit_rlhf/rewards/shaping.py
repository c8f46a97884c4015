"""Format and length rewards, usually added to a correctness reward with `reward_weights`."""

from __future__ import annotations

import re
from typing import Any


class FormatReward:
    """`reward` when the completion matches `pattern` (`re.DOTALL | re.MULTILINE`), else `otherwise`:
    the whole stripped completion with `full_match` (`<think>.*?</think>\\s*<answer>.*?</answer>`),
    else anywhere in it (`#### -?[\\d,.]+`).

    Args:
        pattern: the regular expression.
        full_match: match the whole stripped completion (True) or search anywhere (False).
        reward: reward of a completion with the structure.
        otherwise: reward of one without.
    """

    def __init__(self, pattern: str, full_match: bool = True, reward: float = 1.0, otherwise: float = 0.0) -> None:
        try:
            self.regex = re.compile(pattern, re.DOTALL | re.MULTILINE)
        except re.error as err:
            raise ValueError(f"FormatReward pattern {pattern!r} is not a valid regular expression: {err}") from err
        self.pattern = pattern
        self.full_match = full_match
        self.reward = float(reward)
        self.otherwise = float(otherwise)

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        find = self.regex.fullmatch if self.full_match else self.regex.search
        return [self.reward if find(c.strip() if self.full_match else c) else self.otherwise for c in completions]


class OverlongPenalty:
    """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13), on the completion's token length.

    With L_max = `max_length` and L_cache = `cache_length`, a completion of |y| tokens gets

        0                                   if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
        -1                                   if |y| > L_max

    added to the correctness reward; |y| is the batch column `length_column` (response tokens, EOS
    included).

    Args:
        max_length: L_max, usually the generation length `max_new_tokens`.
        cache_length: L_cache, the length of the soft-penalty interval (0 < L_cache <= L_max).
        length_column: the batch column with the token lengths.
    """

    def __init__(self, max_length: int, cache_length: int, length_column: str = "completion_length") -> None:
        if not 0 < cache_length <= max_length:
            raise ValueError(f"need 0 < cache_length <= max_length, got cache_length={cache_length}, "
                             f"max_length={max_length}")
        self.max_length = int(max_length)
        self.cache_length = int(cache_length)
        self.length_column = length_column

    def penalty(self, length: int) -> float:
        """Eq. 13 for one length in tokens."""
        expected = self.max_length - self.cache_length
        if length <= expected:
            return 0.0
        if length <= self.max_length:
            return (expected - length) / self.cache_length
        return -1.0

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if self.length_column not in columns:
            raise KeyError(f"OverlongPenalty needs the batch column {self.length_column!r} (token lengths); "
                           f"the batch has {sorted(columns)}")
        return [self.penalty(int(n)) for n in columns[self.length_column]]
