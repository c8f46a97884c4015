"""The trainer's log-probs are the sampler's: the HF sampler's own log-prob of each drawn token
(temperature, top-k, top-p: `lit_rlhf.ops.sampling.filter_logits`) against every trainer path
replaying the same filter on its own logits (dense and chunked output layer; padded, shared-prompt
and packed layouts; micro-batches of 1 and 4), on CPU in float32."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.generation import SamplingConfig, generate_responses
from lit_rlhf.generation import sequence_token_logps
from lit_rlhf.models.packed import packed_token_logps
from lit_rlhf.ops import linear_token_logps
from lit_rlhf.ops.logprobs import filtered_token_logps

pytestmark = pytest.mark.usefixtures("one_thread")

BOUND = 1e-5  # nats per token, float32 on CPU


def test_filtered_token_logps_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    top2 = math.log(math.e ** 2 + math.e)
    got = filtered_token_logps(logits.repeat(2, 1), torch.tensor([0, 3]), 1.0, top_k=2)
    # the sampled token is in the top 2; a token outside it keeps its own score (a moved policy)
    torch.testing.assert_close(got, torch.tensor([2.0 - top2, -1.0 - math.log(math.exp(-1.0) + math.e ** 2 + math.e)]))
    half = filtered_token_logps(logits, torch.tensor([1]), 0.5, top_p=0.9)  # at T=0.5: p(0) = 0.867, p(1) = 0.117
    torch.testing.assert_close(half, torch.tensor([2.0 - math.log(math.e ** 4 + math.e ** 2)]))
    torch.testing.assert_close(filtered_token_logps(logits, torch.tensor([2]), 2.0),
                               torch.log_softmax(logits / 2.0, -1)[:, 2])  # no filter: the full vocabulary


def test_chunked_filter_matches_dense_values_and_gradients():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 6, generator=gen, requires_grad=True)
    weight = (torch.randn(40, 6, generator=gen) * 2).requires_grad_()
    targets = torch.randint(0, 40, (7,), generator=gen)
    dense = filtered_token_logps(hidden @ weight.T, targets, 0.7, top_k=8, top_p=0.8)
    chunked = linear_token_logps(hidden, weight, None, targets, 0.7, chunk_size=3, top_k=8, top_p=0.8)
    torch.testing.assert_close(chunked, dense)
    grads = [torch.autograd.grad(x.sum(), (hidden, weight)) for x in (dense, chunked)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def _sample(model, tokenizer, temperature, top_k, top_p):
    """Two prompts of different lengths, each twice (a group of 2), left padded; 12 new tokens."""
    texts = ["The quick brown fox jumps over", "Hello"]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(2)]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.bool)
    config = SamplingConfig(max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p)
    response, response_mask, _, logps = generate_responses(model, ids, mask, config, tokenizer.eos_token_id,
                                                           tokenizer.pad_token_id, generator=torch.Generator().manual_seed(1),
                                                           return_logps=True)
    return ids, mask, response, response_mask, logps


def _trainer_logps(model, sample, temperature, top_k, top_p):
    """Every trainer path's log-probs of the sampled tokens, flattened in row order."""
    ids, mask, response, response_mask, _ = sample
    filt = dict(top_k=top_k, top_p=top_p)
    out = {}
    for chunk in (None, 5):
        for micro in (1, 4):
            padded = sequence_token_logps(model, ids, mask, response, response_mask, temperature, micro, chunk, **filt)
            out[f"padded mb{micro} chunk {chunk}"] = padded[response_mask]
        shared = sequence_token_logps(model, ids, mask, response, response_mask, temperature, 4, chunk, **filt,
                                      groups=torch.tensor([0, 0, 1, 1]))
        out[f"shared chunk {chunk}"] = shared[response_mask]
        # every row's prompt and response end to end in one packed row, positions restarting
        pieces = [torch.cat([ids[b][mask[b]], response[b][response_mask[b]]]) for b in range(ids.shape[0])]
        positions = torch.cat([torch.arange(len(p)) for p in pieces])[None]
        scored = torch.cat([torch.arange(len(p)) >= int(mask[b].sum()) for b, p in enumerate(pieces)])[None]
        packed = packed_token_logps(model, torch.cat(pieces)[None], positions, scored, temperature, chunk, **filt)
        out[f"packed chunk {chunk}"] = packed[scored]
    return out


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize(("top_k", "top_p"), [(50, 1.0), (0, 0.9), (50, 0.9)])
@torch.no_grad()
def test_trainer_logps_equal_the_sampler_s(tiny_model, tiny_tokenizer, temperature, top_k, top_p):
    tiny_model.float().eval()
    sample = _sample(tiny_model, tiny_tokenizer, temperature, top_k, top_p)
    sampler = sample[4][sample[3]]  # (S,) the sampler's log-probs of its kept tokens
    assert sampler.numel() >= 24
    for path, trainer in _trainer_logps(tiny_model, sample, temperature, top_k, top_p).items():
        gap = float((trainer - sampler).abs().max())
        assert gap < BOUND, f"{path}: max |log pi_train - log pi_sampler| = {gap:.3g} nats"
    # the filter not replayed: every token's ratio is off by the mass the filter removed
    for path, trainer in _trainer_logps(tiny_model, sample, temperature, 0, 1.0).items():
        assert float((trainer - sampler).abs().min()) > 1e-3, path
