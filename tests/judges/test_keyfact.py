"""The key-fact gold judge: content words, recall worked out by hand, pairwise verdicts."""

from __future__ import annotations

import pytest

from lit_rlhf.judges.keyfact import KeyFactJudge, content_words, keyfact_recall


def test_content_words_drop_stop_words_plurals_and_punctuation():
    assert content_words("My roommate owes me $200 and avoids paying.") == {"roommate", "owe", "200", "avoid", "paying"}
    assert content_words("The boss's ideas") == {"boss", "idea"}  # possessive gone, "boss" keeps its s
    assert content_words("the and of") == frozenset()


def test_recall_by_hand():
    ref = "Roommate returns my car with an empty tank."  # roommate, return, car, empty, tank
    assert keyfact_recall(ref, ref) == 1.0
    assert keyfact_recall("my roommate took the car", ref) == pytest.approx(2 / 5)
    assert keyfact_recall("\n\n- I'm 26 and live in Boston.", ref) == 0.0
    assert keyfact_recall("TANKS! empty. Cars", ref) == pytest.approx(3 / 5)  # case, plural, punctuation
    with pytest.raises(ValueError, match="no content words"):
        keyfact_recall("anything", "the and of")


def test_judge_prefers_higher_recall_and_ties_equal_recall():
    refs = ["Sister forgot my birthday three years running."] * 3
    judge = KeyFactJudge(refs)
    verdicts = judge.judge(["p"] * 3, ["sister forgot my birthday", "nothing here", "sister"],
                           ["sister", "forgot birthday", "sister!"])
    assert [v.winner for v in verdicts] == ["a", "b", "tie"]
    assert judge.scores(["sister forgot my birthday three years running"]  * 3) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="references"):
        judge.scores(["x"])
