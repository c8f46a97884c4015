"""LocalLMJudge: next-token verdict probabilities of a local causal LM."""

from __future__ import annotations

import re

import pytest

from lit_rlhf.judges import JudgeTemplate, LocalLMJudge, order_is_swapped
from lit_rlhf.judges.local_lm import verdict_token_ids

PROMPTS = [
    "SUBREDDIT: r/cats\n\nTITLE: My cat\n\nPOST: My cat ran away yesterday and came back at night.\n\nTL;DR:",
    "SUBREDDIT: r/cooking\n\nTITLE: Bread\n\nPOST: My bread never rises.\n\nTL;DR:",
    "SUBREDDIT: r/running\n\nTITLE: First race\n\nPOST: I finished my first 5k today, slowly.\n\nTL;DR:",
]
GOOD = [" Cat ran away, came back.", " Bread does not rise.", " Finished a first 5k."]
BAD = [" I like pizza a lot, it is very tasty and cheap.", " Pizza.", " My neighbour has a loud dog."]


def probs(raw: str) -> tuple[float, float]:
    m = re.fullmatch(r"P\(A\)=(\S+) P\(B\)=(\S+)", raw)
    assert m, raw
    return float(m.group(1)), float(m.group(2))


@pytest.fixture(scope="module")
def tiny_judge():
    return LocalLMJudge("tiny-random-llama", seed=1, batch_size=3)


def test_tiny_judge_gives_valid_deterministic_verdicts_with_probabilities(tiny_judge):
    judgements = tiny_judge.judge(PROMPTS, GOOD, BAD)
    again = LocalLMJudge("tiny-random-llama", seed=1, batch_size=3).judge(PROMPTS, GOOD, BAD)
    assert judgements == again
    assert [j.swapped for j in judgements] == [order_is_swapped(1, i) for i in range(3)]
    for j in judgements:
        assert j.winner in ("a", "b") and j.error is None
        p_a, p_b = probs(j.raw)
        assert 0.0 < p_a < 1.0 and 0.0 < p_b < 1.0 and p_a + p_b <= 1.0
        shown_winner = "A" if p_a > p_b else "B"  # the judge's letter, in the order it was shown
        expected = {("A", False): "a", ("B", False): "b", ("A", True): "b", ("B", True): "a"}
        assert j.winner == expected[(shown_winner, j.swapped)]


def test_left_padded_batches_match_one_at_a_time(tiny_judge):
    single = LocalLMJudge("tiny-random-llama", seed=1, batch_size=1)
    batched = [probs(j.raw) for j in tiny_judge.judge(PROMPTS, GOOD, BAD)]
    alone = [probs(j.raw) for j in single.judge(PROMPTS, GOOD, BAD)]
    flat = [p for pair in batched for p in pair]  # pytest.approx compares flat sequences only
    assert flat == pytest.approx([p for pair in alone for p in pair], rel=1e-4)


def test_same_shown_pair_gives_mirrored_verdicts(tiny_judge):
    # find two item indices with opposite orders, then give them mirrored pairs so the judge
    # is shown the very same text twice: the verdicts must be mirror images
    i = next(k for k in range(50) if not order_is_swapped(1, k))
    k = next(k for k in range(50) if order_is_swapped(1, k))
    n = max(i, k) + 1
    prompts, a, b = [PROMPTS[0]] * n, [GOOD[0]] * n, [BAD[0]] * n
    a[k], b[k] = BAD[0], GOOD[0]
    judgements = tiny_judge.judge(prompts, a, b)
    assert judgements[i].raw == judgements[k].raw
    assert {judgements[i].winner, judgements[k].winner} == {"a", "b"}


def test_verdict_tokens_and_prompt_length_limit(tiny_judge, tiny_tokenizer):
    # byte-level: " A" starts with the shared space token, which is dropped
    assert verdict_token_ids(tiny_tokenizer) == ([tiny_tokenizer.convert_tokens_to_ids("A")],
                                                 [tiny_tokenizer.convert_tokens_to_ids("B")])
    short = LocalLMJudge("tiny-random-llama", max_length=64, model=tiny_judge._model, tokenizer=tiny_judge._tokenizer)
    (j,) = short.judge(PROMPTS[:1], GOOD[:1], BAD[:1])
    assert j.winner == "invalid" and "max_length=64" in j.error
    text = tiny_judge.judge_prompt("the post", "first", "second")
    assert text.startswith("<|im_start|>user\nWhich of the following summaries")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\nPreferred:")


@pytest.mark.slow
def test_smollm2_judge_on_two_items():
    # a short custom template keeps this to ~60 tokens a row on a shared 2-core CPU
    short = JudgeTemplate("short", "Text: {prompt}\nSummary A:{a}\nSummary B:{b}\nWhich summary is better, A or B?",
                          answer_prefix="Better:")
    judge = LocalLMJudge("smollm2-135m-instruct", template=short, seed=0, batch_size=2)
    judgements = judge.judge(["My cat ran away but came back.", "My bread never rises."], GOOD[:2], BAD[1:3])
    ids_a, ids_b = judge._verdict_ids
    assert len(ids_a) == 2 and len(ids_b) == 2  # "A" and " A" are distinct BPE tokens
    for j in judgements:
        assert j.winner in ("a", "b") and j.error is None
        p_a, p_b = probs(j.raw)
        assert p_a + p_b > 0.05  # the forced "Preferred:" makes a verdict letter likely


def test_the_prompt_has_the_chat_template_before_the_first_verdict():
    """A fresh judge formats its prompt with its tokenizer's chat template (loaded on demand, the
    model not), whatever ran before it."""
    fresh = LocalLMJudge("tiny-random-llama")
    assert fresh.judge_prompt("the post", "first", "second").startswith("<|im_start|>user\nWhich of the following summaries")
    assert fresh._model is None
