"""Reward functions: the math answer checker, format and overlong rewards, error reporting, and
per-source normalisation before the weighted sum."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.rewards import (
    FormatReward,
    MathAnswerReward,
    OverlongPenalty,
    RewardFunctionError,
    answers_match,
    call_reward_fn,
    combine_rewards,
    final_answer_text,
    normalize_reward,
)


@pytest.mark.parametrize("reference, completion", [
    ("42", "The answer is \\boxed{42}."),
    ("Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72 clips.\n#### 72", "48 + 24 = 72\n#### 72"),
    ("\\frac{1}{2}", "so the probability is $0.5$"),
    ("0.5", "\\boxed{\\frac12}"),
    ("\\boxed{2\\sqrt{2}}", "the length is \\boxed{\\sqrt{8}}"),
    ("1000", "#### 1,000"),
    ("3/4", "\\dfrac{3}{4}"),  # bare LaTeX without $ delimiters
    ("-2", "\\boxed{-2}"),
    ("8", "\\boxed{7}. Actually \\boxed{8}."),  # the last boxed answer counts
    ("The roots satisfy ... so $x = \\boxed{\\frac{3}{4}}$.", "0.75"),  # MATH solution as reference
    ("18", "She sells 16 - 3 - 4 = 9 eggs for 9 * 2 = 18 dollars."),
])
def test_right_answers_in_equivalent_forms(reference, completion):
    assert answers_match(reference, completion)
    assert MathAnswerReward()([""], [completion], reference=[reference]) == [1.0]


@pytest.mark.parametrize("reference, completion", [
    ("42", "I think it is 41"),
    ("42", "no idea"),  # unparseable: 0, never full marks
    ("42", ""),
    ("2", "\\boxed{}"),
    ("7", "\\boxed{7} but maybe \\boxed{8}"),
    ("8", "\\boxed{7}, no wait: \\boxed{8}"),  # read as the set {7, 8}: hedging earns nothing
    ("72", "the answer is 72 #### 70"),  # the #### line is the answer, not an earlier number
    ("5", "x = 5, y = 7"),
])
def test_wrong_or_unparseable_answers_score_zero(reference, completion):
    assert not answers_match(reference, completion)
    assert MathAnswerReward(incorrect=-0.5)([""], [completion], reference=[reference]) == [-0.5]


def test_gsm8k_marker_and_bad_references():
    assert final_answer_text("work\n#### 1,234\n") == "1,234"
    assert final_answer_text("  no marker ") == "no marker"
    with pytest.raises(ValueError, match="cannot be parsed"):
        answers_match("banana", "42")
    with pytest.raises(KeyError, match="reference"):
        MathAnswerReward()(["q"], ["42"], answer=["42"])


def test_answer_keys_group_equivalent_answers_for_majority_voting():
    from lit_rlhf.rewards import answer_keys

    texts = ["#### 0.5", "so it is \\frac{1}{2}", "no idea", "#### 3", "\\boxed{1/2}", "3.0"]
    assert answer_keys(texts) == [0, 0, None, 1, 0, 1]
    assert answer_keys([]) == []


def test_format_reward_tags_and_search():
    tags = FormatReward(r"<think>.*?</think>\s*<answer>.*?</answer>")
    assert tags([""] * 4, [
        "<think>a\nb</think>\n<answer>3</answer>", "  <think></think><answer>x</answer>\n",
        "<answer>3</answer>", "<think>a</think><answer>3</answer> trailing",
    ]) == [1.0, 1.0, 0.0, 0.0]
    marker = FormatReward(r"^#### -?[\d,.]+\s*$", full_match=False, reward=0.5, otherwise=-0.5)
    assert marker([""] * 2, ["so\n#### 12\n", "so 12"]) == [0.5, -0.5]
    with pytest.raises(ValueError, match="not a valid regular expression"):
        FormatReward("(unclosed")


def test_overlong_penalty_is_dapo_eq13():
    # L_max = 20, L_cache = 4: free up to 16 tokens, then linear to -1 at 20, -1 beyond
    fn = OverlongPenalty(max_length=20, cache_length=4)
    got = fn([""] * 6, [""] * 6, completion_length=[3, 16, 17, 18, 20, 25])
    assert got == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError, match="cache_length"):
        OverlongPenalty(max_length=4, cache_length=5)
    with pytest.raises(KeyError, match="completion_length"):
        fn([""], [""], reference=["1"])


def test_a_raising_reward_function_names_itself_and_the_row():
    def picky(prompts, completions, **columns):
        return [1.0 / len(c) if c != "boom" else int("boom") for c in completions]

    with pytest.raises(RewardFunctionError, match=r"'picky' raised ValueError.*row 2 of the rollout \(dataset row 17\)"
                       r".*completion 'boom'"):
        call_reward_fn(picky, ["p0", "p1", "p2"], ["a", "bb", "boom"], {"index": [5, 9, 17]})

    def nan(prompts, completions, **columns):
        return [0.0, float("nan")]

    with pytest.raises(ValueError, match=r"'nan' returned non-finite rewards at 1 row\(s\) \[1\].*row 1"):
        call_reward_fn(nan, ["p", "q"], ["a", "b"], {})


def test_rewards_normalised_separately_before_the_sum():
    # two prompts x G=2; correctness has a large spread, format a small one
    correct = torch.tensor([0.0, 10.0, 4.0, 4.0])
    fmt = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # group z-scores: group std of (0, 10) is 10/sqrt(2) -> (-/+ 0.7071); (4, 4) -> exactly 0
    z = normalize_reward(correct, "group", group_size=2, eps=0.0)
    assert z.tolist() == pytest.approx([-math.sqrt(0.5), math.sqrt(0.5), 0.0, 0.0])
    total = combine_rewards({"correct": correct, "format": fmt}, [1.0, 0.5], "group", group_size=2)
    s = math.sqrt(0.5)  # every group z-score is -/+ 1/sqrt(2) (the eps 1e-4 in the std: within rel 1e-3)
    expected = [-s + 0.5 * s, s - 0.5 * s, -0.5 * s, 0.5 * s]
    assert total.tolist() == pytest.approx(expected, rel=1e-3)
    # batch: one z-score over all four rows
    zb = normalize_reward(fmt, "batch", eps=0.0)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()
    assert zb.tolist() == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std])
    assert combine_rewards({"a": correct}, None).tolist() == correct.tolist()  # none: unchanged
    with pytest.raises(ValueError, match="group_size"):
        normalize_reward(correct, "group", group_size=3)


def test_keyfact_recall_reward_is_the_gold_recall_by_hand():
    from lit_rlhf.rewards import KeyFactRecallReward, function_name

    fn = KeyFactRecallReward()
    ref = "Roommate drums after midnight, I can't sleep."
    got = fn(["p"] * 3, [ref, "My roommate drums a lot.", "Nothing relevant here."], reference=[ref] * 3)
    # content(ref) = {roommat, drum, midnight, sleep} ("can't" -> "can not": stop words);
    # "My roommate drums a lot." has {roommat, drum, lot}: 2 of 4
    assert got == [1.0, pytest.approx(2 / 4), 0.0]
    assert function_name(fn) == "keyfact_recall"
    with pytest.raises(KeyError, match="reference"):
        fn(["p"], ["x"], other=["y"])
