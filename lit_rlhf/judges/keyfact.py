"""A programmatic gold judge for summaries: how much of the post's key fact a summary states.

The bundled `keyfact` data (`lit_rlhf/data/bundled/make_keyfact.py`) gives every post one key
fact, stored as the row's reference summary. Its comparison pairs are labelled by this gold score
with Bradley-Terry noise, the synthetic-gold set-up of Gao et al. (2023, "Scaling Laws for Reward
Model Overoptimization"): a reward model learns the gold from noisy pairs, a policy optimises the
reward model, and the gold, which the policy never sees, measures whether it got better.

    content words: lower-cased alphanumeric tokens ("$200" -> "200"), a trailing plural "s"
        removed (not after "s": "boss" stays), stop words dropped;
    key-fact recall(summary, reference) = |content(reference) & content(summary)| / |content(reference)|.

The score is in [0, 1]; it is 1 for the reference itself and 0 for a summary sharing no content
word with it. Word order and paraphrase are ignored on purpose: the gold is a fixed, transparent
function, not a model, so nothing trained here can share its errors.
"""

from __future__ import annotations

import re
from typing import Sequence

from lit_rlhf.judges.base import Judgement, PairwiseJudge, check_lengths

STOP_WORDS = frozenset(
    "a an the my me i i'm im to of and or but with in on at for is are was were be been it its "
    "this that these those they them their he she his her him we our us you your so as by from "
    "up out about into over after before again not no do does did has have had just very all "
    "any some what how when who why can will would should could keeps keep".split()
)
_WORD = re.compile(r"[a-z0-9]+")


def content_words(text: str) -> frozenset[str]:
    """The set of content words of `text` (see the module docstring)."""
    words = set()
    for word in _WORD.findall(text.lower().replace("'s", "")):
        if word in STOP_WORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        words.add(word)
    return frozenset(words)


def keyfact_recall(summary: str, reference: str) -> float:
    """Fraction of the reference's content words that `summary` contains, in [0, 1].

    A reference without content words is refused: its recall would be undefined."""
    key = content_words(reference)
    if not key:
        raise ValueError(f"the reference {reference!r} has no content words to recall")
    return len(key & content_words(summary)) / len(key)


class KeyFactJudge(PairwiseJudge):
    """Pairwise gold judge: the completion with the higher key-fact recall of the reference wins.

    Built with the references of the prompts it will judge (`references[i]` belongs to prompt i),
    or called through `scores`. Equal recalls are a tie. Deterministic, so no order is randomised.
    """

    def __init__(self, references: Sequence[str] = ()) -> None:
        self.references = list(references)

    def scores(self, completions: Sequence[str], references: Sequence[str] | None = None) -> list[float]:
        """The gold score of each completion against its reference."""
        references = self.references if references is None else list(references)
        if len(references) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        return [keyfact_recall(c, r) for c, r in zip(completions, references)]

    def judge(self, prompts: list[str], completions_a: list[str], completions_b: list[str]) -> list[Judgement]:
        check_lengths(prompts, completions_a, completions_b)
        out = []
        for a, b, score_a, score_b in zip(completions_a, completions_b, self.scores(completions_a), self.scores(completions_b)):
            winner = "a" if score_a > score_b else "b" if score_b > score_a else "tie"
            out.append(Judgement(winner=winner, raw=f"{score_a:.3f} {score_b:.3f}"))
        return out
