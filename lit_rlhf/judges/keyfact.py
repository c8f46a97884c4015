"""Programmatic gold judges for summaries: how much of the post's key fact a summary states, how
much else it says, and whether it asserts something the post contradicts.

The bundled `keyfact` data (`lit_rlhf/data/bundled/make_keyfact.py`) gives every post one key
fact (its reference summary) and labels its pairs by this gold with Bradley-Terry noise, the
synthetic-gold set-up of Gao et al. (2023, "Scaling Laws for Reward Model Overoptimization").

    content words: lower-cased, contractions expanded, alphanumeric tokens, stop words dropped,
        each word reduced by `stem`;
    recall = |content(reference) & content(summary)| / |content(reference)|;
    F1: the harmonic mean of recall and precision |content(reference) & content(summary)| /
        |content(summary)|, so padding and copied distractors cost score.

Both cannot see meaning; `listed_matches` checks an answer against the regular expressions the
generator wrote per post (`keyfact_checks`: statements the post contradicts, planted
distractors), a lower bound on the answers that state something false. `content_words_v1` /
`keyfact_recall_v1` are the gold the bundled pairs were labelled with, kept unchanged so the data
stay reproducible ("can't" gave the word "t", only a trailing "s" was stripped).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from lit_rlhf.judges.base import Judgement, PairwiseJudge, check_lengths

STOP_WORDS = frozenset(
    "a an the my me i i'm im to of and or but with in on at for is are was were be been it its "
    "this that these those they them their he she his her him we our us you your so as by from "
    "up out about into over after before again not no do does did has have had just very all "
    "any some what how when who why can will would should could keeps keep".split()
)
# the current gold's stop words: the list above plus the words the contractions expand to
STOP_WORDS_EXPANDED = STOP_WORDS | frozenset("am shall".split())
_WORD = re.compile(r"[a-z0-9]+")
_CONTRACTIONS = [(re.compile(p), r) for p, r in [
    (r"\bwon't\b", "will not"), (r"\bcan't\b", "can not"), (r"\bshan't\b", "shall not"), (r"n't\b", " not"),
    (r"'m\b", " am"), (r"'re\b", " are"), (r"'ve\b", " have"), (r"'ll\b", " will"), (r"'d\b", " would"),
    (r"'s\b", ""),
]]


def _consonant(word: str, i: int) -> bool:
    if word[i] in "aeiou":
        return False
    return word[i] != "y" or i == 0 or not _consonant(word, i - 1)


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in [C](VC)^m[V]."""
    forms = re.sub(r"v+", "v", re.sub(r"c+", "c", "".join("c" if _consonant(stem, i) else "v" for i in range(len(stem)))))
    return forms.count("vc")


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _cvc(stem: str) -> bool:
    """*o: the stem ends consonant-vowel-consonant, the last not w, x or y."""
    n = len(stem)
    return n >= 3 and _consonant(stem, n - 3) and not _consonant(stem, n - 2) and _consonant(stem, n - 1) and stem[-1] not in "wxy"


def _step1(word: str) -> str:
    # 1a: sses -> ss, ies -> i, ss -> ss, s -> ""
    if word.endswith("sses") or word.endswith("ies"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    # 1b: (m>0) eed -> ee; (*v*) ed -> ""; (*v*) ing -> "", then at/bl/iz -> +e, a double consonant
    # other than l, s, z -> single, (m=1 and *o) -> +e
    stripped = None
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    elif word.endswith("ed") and _has_vowel(word[:-2]):
        stripped = word[:-2]
    elif word.endswith("ing") and _has_vowel(word[:-3]):
        stripped = word[:-3]
    if stripped is not None:
        word = stripped
        if word.endswith(("at", "bl", "iz")):
            word += "e"
        elif len(word) >= 2 and word[-1] == word[-2] and _consonant(word, len(word) - 1) and word[-1] not in "lsz":
            word = word[:-1]
        elif _measure(word) == 1 and _cvc(word):
            word += "e"
    # 1c: (*v*) y -> i
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


def stem(word: str) -> str:
    """Porter's (1980, "An algorithm for suffix stripping") steps 1a-1c and 5a on a lower-cased word.

    Light on purpose: it conflates the inflections an answer paraphrases with ("quoted" /
    "quotes" / "quote", "paying" / "pays", "moved" / "move") and leaves derivations alone (steps
    2-4 would map "general" and "generous" together). Irregular forms ("paid", "ate") stay
    apart. Words of one or two letters and tokens with a digit are returned unchanged."""
    if len(word) <= 2 or any(c.isdigit() for c in word):
        return word
    word = _step1(word)
    # 5a: (m>1) e -> ""; (m=1 and not *o) e -> ""
    if word.endswith("e"):
        m = _measure(word[:-1])
        if m > 1 or (m == 1 and not _cvc(word[:-1])):
            word = word[:-1]
    return word


def normalise(text: str) -> str:
    """Lower-cased, typographic apostrophes made plain, contractions expanded (module docstring)."""
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def content_words(text: str) -> frozenset[str]:
    """The set of stemmed content words of `text` (see the module docstring)."""
    return frozenset(stem(w) for w in _WORD.findall(normalise(text)) if w not in STOP_WORDS_EXPANDED)


def _key(reference: str, words: Callable[[str], frozenset[str]] = content_words) -> frozenset[str]:
    key = words(reference)
    if not key:
        raise ValueError(f"the reference {reference!r} has no content words to recall")
    return key


def keyfact_recall(summary: str, reference: str) -> float:
    """Fraction of the reference's content words that `summary` contains, in [0, 1].

    A reference without content words is refused: its recall would be undefined."""
    key = _key(reference)
    return len(key & content_words(summary)) / len(key)


def keyfact_f1(summary: str, reference: str) -> float:
    """Harmonic mean of the key-fact recall and the precision of `summary`'s content words, in [0, 1];
    0 for a summary without content words."""
    key, said = _key(reference), content_words(summary)
    hits = len(key & said)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(said), hits / len(key)
    return 2 * precision * recall / (precision + recall)


def listed_matches(summary: str, patterns: Sequence[str]) -> list[str]:
    """The patterns (case-insensitive regular expressions, matched against the `normalise`d text)
    that `summary` matches: the false statements or distractor details a post's checks list."""
    text = normalise(summary)
    return [p for p in patterns if re.search(p, text, re.IGNORECASE)]


def content_words_v1(text: str) -> frozenset[str]:
    """The content words of the bundled pairs' labels: "'s" removed, alphanumeric tokens (so
    "can't" gives "t"), stop words dropped, a trailing "s" removed from words over three letters
    not ending "ss"."""
    words = set()
    for word in _WORD.findall(text.lower().replace("'s", "")):
        if word in STOP_WORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        words.add(word)
    return frozenset(words)


def keyfact_recall_v1(summary: str, reference: str) -> float:
    """`keyfact_recall` with `content_words_v1`: the gold the bundled pairs were labelled with."""
    key = _key(reference, content_words_v1)
    return len(key & content_words_v1(summary)) / len(key)


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
