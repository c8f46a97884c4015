"""The pairwise judge interface and the per-item A/B order randomisation shared by LM judges.

A judge compares `completions_a[i]` with `completions_b[i]` for each prompt and returns one
`Judgement` per item, its winner in the caller's a/b terms. LM judges prefer one position more
often than the content warrants; showing each pair in a random order, a pure function of
`(seed, item index)`, turns that bias into noise that averages out, reproducibly.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass
from typing import Literal, Sequence

Winner = Literal["a", "b", "tie", "invalid"]
WINNERS: tuple[str, ...] = ("a", "b", "tie", "invalid")

# What a judge said about the pair in the order it was shown: the first shown, the second shown,
# a tie, or nothing usable (None).
ShownVerdict = Literal["first", "second", "tie"]


@dataclass(frozen=True)
class Judgement:
    """One pairwise verdict: `winner` "a" | "b" | "tie" | "invalid" (the caller's a/b, mapped back
    through the randomised order); `raw`, what the judge produced (a reply, two probabilities or
    two rewards), in the order it saw; `swapped`, b was shown first; `error`, why it is invalid."""

    winner: Winner
    raw: str = ""
    swapped: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        if self.winner not in WINNERS:
            raise ValueError(f"winner must be one of {WINNERS}, got {self.winner!r}")


def order_is_swapped(seed: int, index: int) -> bool:
    """Whether item `index` is shown as (b, a) under `seed`: a fair coin per item, seeded from the
    string f"{seed}:{index}" (hashed with SHA-512 by `random`: the same in every process)."""
    return random.Random(f"{seed}:{index}").random() < 0.5


def shown_to_winner(verdict: ShownVerdict | None, swapped: bool) -> Winner:
    """Map a verdict about the shown order back to the caller's a/b."""
    if verdict in (None, "tie"):
        return "invalid" if verdict is None else "tie"
    if verdict not in ("first", "second"):
        raise ValueError(f"unknown shown verdict {verdict!r}")
    return "a" if (verdict == "first") != swapped else "b"


def check_lengths(prompts: Sequence[str], completions_a: Sequence[str], completions_b: Sequence[str]) -> int:
    n = len(prompts)
    if len(completions_a) != n or len(completions_b) != n:
        raise ValueError(
            f"prompts, completions_a and completions_b must have the same length, got "
            f"{n}, {len(completions_a)}, {len(completions_b)}"
        )
    return n


class PairwiseJudge(abc.ABC):
    """Compares two completions of each prompt. Subclasses implement `judge`.

    Contract: `judge` returns exactly one `Judgement` per item, in input order, and does not raise
    for a failure confined to one item (that item is `invalid`, with `error` set); it raises only
    for misuse (mismatched lengths) or a failure that makes every item meaningless.
    """

    @abc.abstractmethod
    def judge(self, prompts: list[str], completions_a: list[str], completions_b: list[str]) -> list[Judgement]:
        """One Judgement per item: which of completions_a[i] / completions_b[i] answers prompts[i] better."""


class RandomOrderJudge(PairwiseJudge):
    """A judge shown each pair in a seeded random order (`order_is_swapped`). Subclasses implement
    `_judge_shown(prompts, firsts, seconds)`: per item `(shown verdict or None, raw, error)`."""

    def __init__(self, seed: int = 0, randomise_order: bool = True) -> None:
        self.seed = int(seed)
        self.randomise_order = bool(randomise_order)

    def swaps(self, n: int) -> list[bool]:
        """The presentation order of items 0..n-1: True = b is shown first."""
        if not self.randomise_order:
            return [False] * n
        return [order_is_swapped(self.seed, i) for i in range(n)]

    def judge(self, prompts: list[str], completions_a: list[str], completions_b: list[str]) -> list[Judgement]:
        n = check_lengths(prompts, completions_a, completions_b)
        swapped = self.swaps(n)
        firsts = [b if s else a for a, b, s in zip(completions_a, completions_b, swapped)]
        seconds = [a if s else b for a, b, s in zip(completions_a, completions_b, swapped)]
        shown = self._judge_shown(list(prompts), firsts, seconds)
        if len(shown) != n:
            raise RuntimeError(f"{type(self).__name__}._judge_shown returned {len(shown)} results for {n} items")
        return [
            Judgement(winner=shown_to_winner(verdict, s), raw=raw, swapped=s, error=error)
            for (verdict, raw, error), s in zip(shown, swapped)
        ]

    @abc.abstractmethod
    def _judge_shown(
        self, prompts: list[str], firsts: list[str], seconds: list[str]
    ) -> list[tuple[ShownVerdict | None, str, str | None]]:
        """Judge pairs in the order shown: per item (verdict about first/second or None, raw, error)."""
