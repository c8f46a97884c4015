"""D2 / D3 formatting and D5 collation on hand-made inputs."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from lit_rlhf.data.collate import PreferenceCollator, PromptCollator, SFTCollator, SingleCollator, pad_left, pad_right
from lit_rlhf.data.formatting import (
    COMPLETION_TOO_LONG,
    PROMPT_TOO_LONG,
    BadRow,
    NoChatTemplateError,
    chat_prompt_and_completion,
    encode_completion,
    encode_prompt,
    fit_completion,
    format_tldr_completion,
    format_tldr_query,
    require_chat_template,
    truncate_tldr_query,
)


def test_d2_template_exact():
    assert format_tldr_query("AskReddit", "A title", "A post.") == (
        "SUBREDDIT: r/AskReddit\n\nTITLE: A title\n\nPOST: A post.\n\nTL;DR:"
    )


def test_d2_fits_untouched(tiny_tokenizer):
    q = truncate_tldr_query(tiny_tokenizer, "s", "t", "p1\n\np2", 512)
    assert q.text == format_tldr_query("s", "t", "p1\n\np2")
    assert q.paragraphs_dropped == 0 and not q.hard_truncated
    assert q.input_ids == tiny_tokenizer(q.text, add_special_tokens=False)["input_ids"]


def test_d2_paragraph_truncation(tiny_tokenizer):
    paragraphs = ["a" * 40, "b" * 40, "c" * 40, "d" * 40]
    post = "\n\n".join(paragraphs)
    overhead = len(format_tldr_query("s", "t", ""))  # one token per byte
    # room for exactly the first two paragraphs
    limit = overhead + len("\n\n".join(paragraphs[:2]))
    q = truncate_tldr_query(tiny_tokenizer, "s", "t", post, limit)
    assert q.text == format_tldr_query("s", "t", "\n\n".join(paragraphs[:2]))
    assert len(q.input_ids) <= limit and not q.hard_truncated
    # one byte less: only the first paragraph remains
    q = truncate_tldr_query(tiny_tokenizer, "s", "t", post, limit - 1)
    assert q.text == format_tldr_query("s", "t", paragraphs[0])


def test_d2_hard_truncation_last_resort(tiny_tokenizer):
    overhead = len(format_tldr_query("s", "t", ""))
    q = truncate_tldr_query(tiny_tokenizer, "s", "t", "x" * 100 + "\n\n" + "y" * 100, overhead + 30)
    assert q.hard_truncated
    assert q.text == format_tldr_query("s", "t", "x" * 30)
    assert q.text.endswith("\n\nTL;DR:") and len(q.input_ids) == overhead + 30


def test_d2_template_alone_too_long_is_bad_row(tiny_tokenizer):
    with pytest.raises(BadRow) as err:
        truncate_tldr_query(tiny_tokenizer, "s", "T" * 100, "post", 50)
    assert err.value.reason == PROMPT_TOO_LONG and err.value.field == "title"


def test_d3_completion(tiny_tokenizer):
    assert format_tldr_completion("Summary.") == " Summary."
    assert format_tldr_completion(" Summary.") == " Summary."
    assert format_tldr_completion("   Summary.") == " Summary."
    ids = encode_completion(tiny_tokenizer, " Summary.")
    assert ids[-1] == tiny_tokenizer.eos_token_id and tiny_tokenizer.decode(ids) == " Summary.</s>"
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id


def test_completion_cap(tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    ids = encode_completion(tiny_tokenizer, " " + "z" * 20)  # 22 tokens
    assert fit_completion(ids, 22, eos, truncate=False, field="f") == ids
    with pytest.raises(BadRow) as err:
        fit_completion(ids, 10, eos, truncate=False, field="summary")
    assert err.value.reason == COMPLETION_TOO_LONG and err.value.field == "summary"
    cut = fit_completion(ids, 10, eos, truncate=True, field="f")
    assert len(cut) == 10 and cut[-1] == eos and cut[:9] == ids[:9]


def test_chat_split_is_the_template_continuation(tiny_tokenizer):
    messages = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    prompt, completion = chat_prompt_and_completion(tiny_tokenizer, messages)
    full = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert prompt == tiny_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    # the tiny template ends a turn with <|im_end|>\n and its EOS is </s>: the turn end is kept, EOS follows
    assert prompt + completion == full.rstrip()
    ids = encode_prompt(tiny_tokenizer, prompt, chat=True) + encode_completion(tiny_tokenizer, completion)
    assert tiny_tokenizer.decode(ids) == full.rstrip() + tiny_tokenizer.eos_token


def test_no_chat_template_error(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        require_chat_template(tok, "UltraFeedback")


def test_padding_helpers():
    ids, mask = pad_right([[1, 2, 3], [4]], 0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    ids, mask = pad_left([[1, 2, 3], [4]], 0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[True] * 3, [False, False, True]]


def _ex(p, c, **kw):
    return {"_prompt_ids": p, "_completion_ids": c, "prompt": "P", **kw}


def test_collators_masks_and_meta():
    pad, eos = 0, 9
    sft = SFTCollator(pad)([_ex([1, 2], [3, eos]), _ex([1], [4, 5, eos])])
    assert sft.input_ids.tolist() == [[1, 2, 3, eos], [1, 4, 5, eos]]
    assert sft.loss_mask.tolist() == [[False, False, True, True], [False, True, True, True]]
    assert sft.attention_mask.all() and sft.meta == {"prompt": ["P", "P"]}

    pref = PreferenceCollator(pad, with_margin=True)(
        [{"_prompt_ids": [1], "_chosen_ids": [2, eos], "_rejected_ids": [3, 3, 3, eos], "_margin": 2.0, "id": "a"},
         {"_prompt_ids": [1, 1], "_chosen_ids": [eos], "_rejected_ids": [4, eos], "_margin": 1.0, "id": "b"}])
    assert pref.input_ids.shape == (4, 5) and pref.num_pairs == 2
    assert pref.input_ids[0].tolist() == [1, 2, eos, pad, pad]  # chosen of pair 0
    assert pref.input_ids[2].tolist() == [1, 3, 3, 3, eos]  # rejected of pair 0
    assert pref.prompt_lengths.tolist() == [1, 2, 1, 2]
    assert pref.loss_mask[3].tolist() == [False, False, True, True, False]
    assert pref.margin.tolist() == [2.0, 1.0] and pref.meta == {"id": ["a", "b"]}

    single = SingleCollator(pad, reward_mean=1.0, reward_std=2.0, with_labels=True, label_threshold=2.0)(
        [_ex([1], [eos], _reward=5.0), _ex([1], [eos], _reward=1.0)])
    assert single.rewards.tolist() == [2.0, 0.0] and single.labels.tolist() == [True, False]

    prompts = PromptCollator(pad)([_ex([1, 2, 3], []), _ex([4], [])])
    assert prompts.input_ids.tolist() == [[1, 2, 3], [pad, pad, 4]]
    assert prompts.attention_mask.tolist() == [[True] * 3, [False, False, True]]
    for collator in (SFTCollator(pad), PreferenceCollator(pad), SingleCollator(pad, 0.0, 1.0), PromptCollator(pad)):
        pickle.loads(pickle.dumps(collator))  # DataLoader workers need picklable collators


def test_d2_post_starting_with_a_newline_is_hard_truncated_not_emptied(tiny_tokenizer):
    """Dropping paragraphs stops before the post would be empty; the last resort cuts tokens."""
    post = "\n" + "w" * 600 + "\nTail paragraph."
    q = truncate_tldr_query(tiny_tokenizer, "s", "t", post, 200)
    assert q.hard_truncated and len(q.input_ids) <= 200
    assert q.text.startswith(format_tldr_query("s", "t", "\n" + "w" * 10)[:-len("\n\nTL;DR:")])
