"""generate_responses end to end (D23 cut + PAD fill) and sequence_token_logps (temperature, D5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_rlhf.generation import SamplingConfig, generate_responses, sequence_token_logps
from lit_rlhf.models import load_causal_lm


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def markov_lm(tokenizer, transitions: dict[int, int]):
    """The tiny Llama turned into a deterministic Markov chain: next token = transitions[current].

    Every layer's output projections are zeroed, so the last hidden state is the (normalised)
    embedding of the current token; each token of the chain gets a one-hot embedding and the
    LM head puts a logit of 80 on its successor (other tokens: 0, so sampling is deterministic).
    """
    model = load_causal_lm("tiny-random-llama", tokenizer)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.get_input_embeddings().weight
        emb.zero_()
        model.lm_head.weight.zero_()
        tokens = sorted(set(transitions) | set(transitions.values()))
        for dim, tok in enumerate(tokens):
            emb[tok, dim] = 1.0
        for tok, nxt in transitions.items():
            model.lm_head.weight[nxt, tokens.index(tok)] = 10.0  # RMSNorm scales a one-hot by 8
    return model


def test_eos_cases_through_generate(tiny_tokenizer):
    tok = tiny_tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a, b, c, d, e, f, g = (tok.convert_tokens_to_ids(ch) for ch in "abcdefg")
    p1, p2, p3, p4 = (tok.convert_tokens_to_ids(ch) for ch in "WXYZ")
    transitions = {
        p1: eos,  # EOS first
        eos: g, g: eos,  # what would follow an EOS if generation went on: "several EOS"
        p2: a, a: b, b: c, c: eos,  # EOS exactly at the last of R=4 positions
        p3: d, d: d,  # never EOS
        p4: e, e: eos,  # EOS second, then (without the cut) g, EOS
    }
    model = markov_lm(tok, transitions)
    # left padded prompts of different lengths (D5)
    rows = [[f, p1], [p2], [f, f, p3], [p4]]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    torch.manual_seed(0)
    responses, response_mask, has_eos = generate_responses(
        model, ids, mask, SamplingConfig(max_new_tokens=4, temperature=1.0), eos, pad
    )
    assert responses.tolist() == [
        [eos, pad, pad, pad],
        [a, b, c, eos],
        [d, d, d, d],
        [e, eos, pad, pad],
    ]
    assert response_mask.tolist() == [
        [True, False, False, False],
        [True, True, True, True],
        [True, True, True, True],
        [True, True, False, False],
    ]
    assert has_eos.tolist() == [True, True, False, True]
    assert model.training  # the caller's mode is restored

    # every row stops early: the output is still PAD-filled to exactly R = max_new_tokens
    early, early_mask, early_eos = generate_responses(
        model, ids[[0, 3]], mask[[0, 3]], SamplingConfig(max_new_tokens=6, temperature=1.0), eos, pad
    )
    assert early.shape == (2, 6)
    assert early.tolist() == [[eos] + [pad] * 5, [e, eos] + [pad] * 4]
    assert early_mask.sum(dim=1).tolist() == [1, 2] and early_eos.all()


def test_generate_rejects_pad_equal_eos_and_right_padding(tiny_tokenizer, tiny_model):
    tok = tiny_tokenizer
    ids = torch.tensor([[5, 6, tok.pad_token_id]])
    right_padded = torch.tensor([[True, True, False]])
    with pytest.raises(ValueError, match="left padded"):
        generate_responses(tiny_model, ids, right_padded, SamplingConfig(max_new_tokens=2), tok.eos_token_id, tok.pad_token_id)
    with pytest.raises(ValueError, match="PAD must differ from EOS"):
        generate_responses(tiny_model, ids, right_padded, SamplingConfig(max_new_tokens=2), tok.eos_token_id, tok.eos_token_id)


def test_sequence_logps_temperature_padding_and_micro_batches(tiny_tokenizer, tiny_model):
    tok = tiny_tokenizer
    pad = tok.pad_token_id
    prompt = tok("TL;DR:", add_special_tokens=False)["input_ids"]
    response = torch.tensor([tok(" a cat", add_special_tokens=False)["input_ids"]])
    R = response.shape[1]
    # the same prompt under 0, 3 and 7 tokens of left padding (D5: position ids from the mask)
    pads = [0, 3, 7]
    width = len(prompt) + max(pads)
    ids = torch.tensor([[pad] * (width - len(prompt)) + prompt for _ in pads])
    mask = torch.tensor([[False] * (width - len(prompt)) + [True] * len(prompt) for _ in pads])
    ids[0, : width - len(prompt)] = pad
    responses = response.repeat(3, 1)
    response_mask = torch.ones_like(responses, dtype=torch.bool)
    response_mask[2, -2:] = False  # a shorter (cut) response: its tail scores 0

    temperature = 0.7
    logps = sequence_token_logps(tiny_model, ids, mask, responses, response_mask, temperature)  # (3, R)
    assert logps.shape == (3, R)
    torch.testing.assert_close(logps[1], logps[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logps[2, :-2], logps[0, :-2], atol=1e-5, rtol=0)
    assert (logps[2, -2:] == 0).all()

    # by hand, unpadded, logits divided once by the temperature
    full = torch.tensor([prompt + response[0].tolist()])
    with torch.no_grad():
        logits = tiny_model(input_ids=full).logits[0, len(prompt) - 1: -1] / temperature  # (R, V)
    expected = F.log_softmax(logits, dim=-1).gather(1, response[0].unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(logps[0], expected, atol=1e-5, rtol=0)

    micro = sequence_token_logps(tiny_model, ids, mask, responses, response_mask, temperature, micro_batch_size=1)
    torch.testing.assert_close(micro, logps, atol=1e-6, rtol=0)


def hf_generate(model, ids, mask, config: SamplingConfig, eos: int, pad: int):
    """transformers' own sampler, with the model's generation_config defaults neutralised."""
    kwargs = {"do_sample": True, "temperature": config.temperature, "top_k": config.top_k or None,
              "top_p": config.top_p} if config.do_sample else {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    out = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=config.max_new_tokens, eos_token_id=eos,
                         pad_token_id=pad, use_cache=True, repetition_penalty=None, **kwargs)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("config", [
    SamplingConfig(max_new_tokens=12, temperature=0.7),
    SamplingConfig(max_new_tokens=12, temperature=1.3, top_k=7, top_p=0.8),
    SamplingConfig(max_new_tokens=12, temperature=1.0, top_p=0.5),
    SamplingConfig(max_new_tokens=12, temperature=1.0, do_sample=False),
], ids=["t0.7", "t1.3-k7-p0.8", "p0.5", "greedy"])
@pytest.mark.parametrize("unpadded", [False, True], ids=["left-padded", "unpadded"])
def test_sampler_draws_the_same_tokens_as_transformers_generate(tiny_tokenizer, tiny_model, config, unpadded):
    """Same seed, same left-padded prompts -> token for token what `model.generate` samples, with
    an EOS that rows actually emit (so rows finish early, go on with PAD, and the loop stops)."""
    from lit_rlhf.generation import sample_tokens

    tok, model = tiny_tokenizer, tiny_model.eval()
    pad = tok.pad_token_id
    rows = [[11, 12, 13, 14, 15, 16], [21, 22], [31, 32, 33, 34], [41], [51, 52, 53], [61, 62, 63, 64, 65]]
    if unpadded:  # every prompt as long as the longest: no mask needed
        rows = [(r * 6)[:6] for r in rows]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    # a second token of a first sample plays EOS, so that its row ends early (seed 0)
    torch.manual_seed(0)
    first = hf_generate(model, ids, mask, config, eos=tok.eos_token_id, pad=pad)
    eos = next(int(row[1]) for row in first if not {int(row[0]), int(row[1])} & {tok.eos_token_id, pad})
    finished_early = 0
    for seed in range(3):  # seed 0 repeats the first sample's draws up to each row's EOS
        torch.manual_seed(seed)
        theirs = hf_generate(model, ids, mask, config, eos, pad)
        torch.manual_seed(seed)
        ours = sample_tokens(model, ids, mask, config, eos, pad)
        assert torch.equal(ours, theirs), (seed, ours.tolist(), theirs.tolist())
        finished_early += int(((ours == eos).cumsum(dim=1) > 0)[:, :-1].logical_and(ours[:, 1:] == pad).any())
    assert finished_early >= 1  # rows went on with PAD after their EOS


def test_filter_logits_by_hand():
    from lit_rlhf.generation import filter_logits

    inf = float("-inf")
    scores = torch.tensor([[2.0, 4.0, 0.0, 4.0, -2.0]])
    assert filter_logits(scores, 2.0).tolist() == [[1.0, 2.0, 0.0, 2.0, -1.0]]
    # top-k keeps every token tied with the k-th score
    assert filter_logits(scores, 1.0, top_k=2).tolist() == [[inf, 4.0, inf, 4.0, inf]]
    assert filter_logits(scores, 1.0, top_k=3).tolist() == [[2.0, 4.0, inf, 4.0, inf]]
    # top-p on probabilities [0.1, 0.2, 0.3, 0.4] (ascending cumsum 0.1, 0.3, 0.6, 1.0): p = 0.75
    # drops the tokens whose ascending cumulative mass is <= 0.25 (only the 0.1 token)
    logits = torch.tensor([[0.4, 0.1, 0.3, 0.2]]).log()
    kept = filter_logits(logits, 1.0, top_p=0.75).isfinite().tolist()
    assert kept == [[True, False, True, True]]
    assert filter_logits(logits, 1.0, top_p=0.35).isfinite().tolist() == [[True, False, False, False]]
    assert filter_logits(logits, 1.0, top_p=0.01).isfinite().sum() == 1  # the most likely token always stays


@pytest.mark.parametrize("config", [SamplingConfig(max_new_tokens=10, temperature=0.7),
                                    SamplingConfig(max_new_tokens=10, temperature=1.0, do_sample=False)],
                         ids=["t0.7", "greedy"])
def test_repeated_prompts_share_one_prefill_and_sample_as_transformers_generate(tiny_tokenizer, tiny_model, config,
                                                                                monkeypatch):
    """GRPO's G copies of a prompt: the prefill runs on the distinct prompts only, and the tokens
    are still transformers' own, draw for draw."""
    from lit_rlhf.generation import sample_tokens

    model, pad = tiny_model.eval(), tiny_tokenizer.pad_token_id
    rows = [[11, 12, 13, 14], [21, 22]]
    ids = torch.tensor([[pad] * (4 - len(r)) + r for r in rows]).repeat_interleave(3, dim=0)  # (6, 4): 2 prompts x 3
    mask = (torch.arange(4) >= torch.tensor([0, 2]).repeat_interleave(3)[:, None])
    prefill_rows = []
    forward = model.forward

    def counting(*args, **kwargs):
        prefill_rows.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    torch.manual_seed(3)
    ours = sample_tokens(model, ids, mask, config, tiny_tokenizer.eos_token_id, pad)
    monkeypatch.setattr(model, "forward", forward)
    torch.manual_seed(3)
    theirs = hf_generate(model, ids, mask, config, tiny_tokenizer.eos_token_id, pad)
    assert torch.equal(ours, theirs)
    assert prefill_rows[0] == (2, 4) and all(shape[0] == 6 for shape in prefill_rows[1:])
