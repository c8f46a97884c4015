"""The key-fact golds: content words (contractions, Porter's light stemmer), recall and F1 worked
out by hand, the listed checks, the generation-time gold kept, pairwise verdicts."""

from __future__ import annotations

import pytest

from lit_rlhf.judges.keyfact import (
    KeyFactJudge,
    _step1,
    content_words,
    content_words_v1,
    keyfact_f1,
    keyfact_recall,
    keyfact_recall_v1,
    listed_matches,
    stem,
)


@pytest.mark.parametrize("word,expected", [
    # Porter (1980), step 1a, 1b and 1c, the paper's own examples
    ("caresses", "caress"), ("ponies", "poni"), ("ties", "ti"), ("caress", "caress"), ("cats", "cat"),
    ("feed", "feed"), ("agreed", "agree"), ("plastered", "plaster"), ("bled", "bled"), ("motoring", "motor"),
    ("sing", "sing"), ("conflated", "conflate"), ("troubled", "trouble"), ("sized", "size"), ("hopping", "hop"),
    ("tanned", "tan"), ("falling", "fall"), ("hissing", "hiss"), ("fizzed", "fizz"), ("failing", "fail"),
    ("filing", "file"), ("happy", "happi"), ("sky", "sky"),
])
def test_porter_step1_on_the_papers_examples(word, expected):
    assert _step1(word) == expected


def test_stem_conflates_inflections_and_keeps_short_words_and_numbers():
    assert {stem(w) for w in ("quoted", "quotes", "quote", "quoting")} == {"quot"}
    assert {stem(w) for w in ("moved", "move", "moving", "moves")} == {"move"}  # 5a keeps e after cvc
    assert {stem(w) for w in ("paying", "pays", "pay")} == {"pai"}
    assert {stem(w) for w in ("diary", "diaries")} == {"diari"}
    assert stem("boss") == "boss" and stem("paid") == "paid"  # irregular forms stay apart
    assert stem("is") == "is" and stem("7am") == "7am" and stem("200") == "200"


def test_content_words_expand_contractions_and_stem():
    assert content_words("My roommate owes me $200 and avoids paying.") == {"roommat", "ow", "200", "avoid", "pai"}
    assert content_words("The boss's ideas") == {"boss", "idea"}  # possessive gone, "boss" keeps its s
    assert content_words("I can't sleep, I'm 42 and won't pay. It\u2019s loud") == {"sleep", "42", "pai", "loud"}
    assert content_words("the and of") == frozenset()
    # the generation-time tokenisation, kept: "can't" gave "t", "I'm" gave "m"
    assert content_words_v1("I can't sleep, I'm 42") == {"t", "sleep", "m", "42"}


def test_recall_by_hand():
    ref = "Roommate returns my car with an empty tank."  # roommat, return, car, empti, tank
    assert keyfact_recall(ref, ref) == 1.0
    assert keyfact_recall("my roommate took the car", ref) == pytest.approx(2 / 5)
    assert keyfact_recall("\n\n- I'm 26 and live in Boston.", ref) == 0.0
    assert keyfact_recall("TANKS! empty. Cars returned", ref) == pytest.approx(4 / 5)  # case, stems, punctuation
    with pytest.raises(ValueError, match="no content words"):
        keyfact_recall("anything", "the and of")


def test_recall_fixes_against_the_generation_time_gold():
    drums = "Roommate drums after midnight, I can't sleep."
    # any negative contraction scored the "t" of "can't": 1 of {roommate, drum, midnight, t, sleep}
    assert keyfact_recall_v1("I don't know.", drums) == pytest.approx(1 / 5)
    assert keyfact_recall("I don't know.", drums) == 0.0
    diary = "Sister read my diary and quoted it in a fight."  # sister, read, diari, quot, fight
    answer = "My sister quotes my diaries in fights."
    assert keyfact_recall(answer, diary) == pytest.approx(4 / 5)
    assert keyfact_recall_v1(answer, diary) == pytest.approx(2 / 5)  # "quote" != "quoted", "diarie" != "diary"


def test_f1_by_hand_charges_for_words_beyond_the_key_fact():
    ref = "Roommate returns my car with an empty tank."  # 5 content words
    assert keyfact_f1(ref, ref) == 1.0
    # all 5 key words among 8 said (+ 26, live, boston): precision 5/8, recall 1, F1 = 10/13
    assert keyfact_f1(ref + " I'm 26 and live in Boston.", ref) == pytest.approx(10 / 13)
    # 2 of 3 said are key (roommat, car; took): precision 2/3, recall 2/5, F1 = 2 * (4/15) / (16/15) = 1/2
    assert keyfact_f1("my roommate took the car", ref) == pytest.approx(1 / 2)
    assert keyfact_f1("the and of", ref) == 0.0 and keyfact_f1("I'm 26", ref) == 0.0
    with pytest.raises(ValueError, match="no content words"):
        keyfact_f1("anything", "the and of")


def test_listed_matches_read_the_normalised_answer():
    patterns = [r"\bwill not pay\b", r"\bsister (?:has|is)\b[^.]*\bmove out\b", r"(?<![\d$])42(?!\d)"]
    assert listed_matches("He WON'T pay.", patterns) == [patterns[0]]
    assert listed_matches("My sister has two weeks to move out", patterns) == [patterns[1]]
    assert listed_matches("My sister's 42-year-old", patterns) == [patterns[2]]
    assert listed_matches("It cost $42 and 142 days", patterns) == []


def test_judge_prefers_higher_recall_and_ties_equal_recall():
    refs = ["Sister forgot my birthday three years running."] * 3
    judge = KeyFactJudge(refs)
    verdicts = judge.judge(["p"] * 3, ["sister forgot my birthday", "nothing here", "sister"],
                           ["sister", "forgot birthday", "sister!"])
    assert [v.winner for v in verdicts] == ["a", "b", "tie"]
    assert judge.scores(["sister forgot my birthday three years running"] * 3) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="references"):
        judge.scores(["x"])
