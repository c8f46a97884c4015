"""The chunked log-prob path (hidden states + output layer, logits recomputed in backward) against
the dense logits: values and gradients, tied and untied output layers, bf16 autocast, fallback."""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from lit_rlhf.ops import linear_token_logps, per_token_logps, response_logps
from lit_rlhf.ops.logprobs import chunked_layers

V, H = 96, 32


def _dense(hidden, weight, bias, targets, temperature):
    z = F.linear(hidden, weight, bias) / temperature  # (N, V)
    logp = F.log_softmax(z, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), entropy


def _leaves(n, dtype=torch.float32, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=gen, dtype=dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=gen, dtype=dtype) / H**0.5).requires_grad_()
    b = torch.randn(V, generator=gen, dtype=dtype).requires_grad_() if bias else None
    targets = torch.randint(0, V, (n,), generator=gen)
    return hidden, weight, b, targets


@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_equal_the_dense_logits_fp32(bias):
    hidden, weight, b, targets = _leaves(23, bias=bias)
    leaves = [t for t in (hidden, weight, b) if t is not None]
    gen = torch.Generator().manual_seed(1)
    g_lp, g_ent = torch.randn(23, generator=gen), torch.randn(23, generator=gen)
    # 23 rows in chunks of 5: the last chunk is partial
    logps, entropy = linear_token_logps(hidden, weight, b, targets, temperature=0.7, chunk_size=5, with_entropy=True)
    grads = torch.autograd.grad((logps * g_lp).sum() + (entropy * g_ent).sum(), leaves)
    ref_logps, ref_entropy = _dense(hidden, weight, b, targets, 0.7)
    ref_grads = torch.autograd.grad((ref_logps * g_lp).sum() + (ref_entropy * g_ent).sum(), leaves)
    assert logps.dtype == torch.float32 and entropy.dtype == torch.float32
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)
    for got, want in zip(grads, ref_grads):  # hidden states, output weight (and bias)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_without_entropy_values_and_gradients_equal_the_dense_logits_fp32(bias):
    hidden, weight, b, targets = _leaves(23, bias=bias)
    leaves = [t for t in (hidden, weight, b) if t is not None]
    g_lp = torch.randn(23, generator=torch.Generator().manual_seed(1))
    logps, entropy = linear_token_logps(hidden, weight, b, targets, temperature=0.7, chunk_size=5)
    assert entropy is None
    grads = torch.autograd.grad((logps * g_lp).sum(), leaves)
    ref_logps, _ = _dense(hidden, weight, b, targets, 0.7)
    ref_grads = torch.autograd.grad((ref_logps * g_lp).sum(), leaves)
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=0)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_in_place_logsumexp_equals_torchs_bit_for_bit():
    from lit_rlhf.ops.linear_logprobs import _logsumexp_

    z = torch.randn(6, 1000, generator=torch.Generator().manual_seed(2)) * 30
    z[1, 7] = float("inf")  # a row with an infinite logit: lse = inf
    z[2] = float("-inf")  # a row of -inf only: lse = -inf
    z[3, :500] = float("-inf")
    want = torch.logsumexp(z, dim=-1)
    got = _logsumexp_(z.clone())
    assert torch.equal(got, want)


def test_one_chunk_of_logits_lives_at_a_time_in_forward_and_backward():
    """The largest buffers of the chunked path are (chunk, V) logits: without entropies, the
    forward and the backward pass each hold one of them at a time (the log-sum-exp and the softmax
    are computed in the logits' own memory)."""
    vocab, hidden_size, chunk, n = 4096, 8, 16, 50
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, hidden_size, generator=gen).requires_grad_()
    weight = torch.randn(vocab, hidden_size, generator=gen).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen)
    chunk_bytes = chunk * vocab * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        logps, _ = linear_token_logps(hidden, weight, None, targets, chunk_size=chunk)
        logps.sum().backward()
    live, most = set(), 0
    for event in sorted((e for e in _allocations(prof)), key=lambda e: e.start_time_ns):
        size, ptr = event.typed[1].alloc_size, event.typed[1].ptr
        if size == chunk_bytes:
            live.add(ptr)
        elif size == -chunk_bytes:
            live.discard(ptr)
        most = max(most, len(live))
    assert most == 1


def _allocations(prof):
    from torch._C._profiler import _EventType

    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] == _EventType.Allocation:
            yield node


def test_float64_gradcheck_with_entropy_and_temperature():
    gen = torch.Generator().manual_seed(3)
    hidden, weight, b = (torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_() for shape in ((7, 4), (9, 4), (9,)))
    targets = torch.randint(0, 9, (7,), generator=gen)

    def fn(h, w, bb):
        return linear_token_logps(h, w, bb, targets, temperature=1.3, chunk_size=3, with_entropy=True)

    assert torch.autograd.gradcheck(fn, (hidden, weight, b))


def test_bad_arguments_are_refused():
    hidden, weight, b, targets = _leaves(4)
    with pytest.raises(ValueError, match="temperature"):
        linear_token_logps(hidden, weight, b, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_token_logps(hidden, weight, b, targets, chunk_size=0)


# ------------------------------------------------------------------------------------------------
# through a causal LM: per_token_logps / response_logps
# ------------------------------------------------------------------------------------------------


def _llama(tied: bool) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=tied, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    return model


def _batch():
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, V, (3, 14), generator=gen)
    attention = torch.ones(3, 14, dtype=torch.bool)
    attention[0, :4] = False  # left padding
    attention[2, :9] = False
    ids[~attention] = 0
    loss = attention.clone()
    loss[:, :8] = False  # the completion: last 6 columns
    return ids, attention, loss


def _logps_and_grads(model, chunk_size, temperature=0.8):
    ids, attention, loss = _batch()
    model.zero_grad()
    logps = per_token_logps(model, ids, attention, loss, temperature, chunk_size=chunk_size)
    weights = torch.linspace(-1, 1, logps.numel()).view_as(logps)  # a loss that weighs every token differently
    (logps * weights).sum().backward()
    return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
def test_model_logps_and_every_gradient_equal_the_dense_path(tied):
    model = _llama(tied)
    dense, dense_grads = _logps_and_grads(model, None)
    chunked, chunked_grads = _logps_and_grads(model, 4)  # 18 scored tokens in chunks of 4
    _, loss = _batch()[1:]
    assert (chunked[~loss] == 0).all() and (chunked[loss] < 0).all()
    torch.testing.assert_close(chunked, dense, atol=1e-5, rtol=0)
    assert dense_grads.keys() == chunked_grads.keys()
    assert ("lm_head.weight" in dense_grads) is not tied  # tied: the one weight is `model.embed_tokens.weight`
    for name, grad in dense_grads.items():  # output layer (tied: the embedding) and the decoder below it
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5, rtol=0, msg=name)


def test_bf16_autocast_matches_the_dense_path_within_bf16_rounding():
    model = _llama(tied=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dense, dense_grads = _logps_and_grads(model, None)
        chunked, chunked_grads = _logps_and_grads(model, 4)
    assert chunked.dtype == torch.float32
    # the output layer runs in bf16 on both paths; they differ only by bf16 rounding (temperature
    # divides bf16 logits on the dense path, float32 ones here)
    torch.testing.assert_close(chunked, dense, atol=5e-3, rtol=0)  # measured 5e-4
    for name, grad in dense_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(chunked_grads[name], grad, atol=2e-2 * scale, rtol=0, msg=name)  # measured <= 7e-3


def test_response_logps_chunked_equals_dense_on_the_response_tokens():
    model = _llama(tied=False)
    ids, attention, _ = _batch()
    attention[1, -2:] = False  # a response that ended early (right padding of the response)
    with torch.no_grad():
        dense = response_logps(model, ids, attention, 6, 0.9)
        chunked = response_logps(model, ids, attention, 6, 0.9, chunk_size=5)
    kept = attention[:, -6:]
    torch.testing.assert_close(chunked[kept], dense[kept], atol=1e-5, rtol=0)
    assert (chunked[~kept] == 0).all()


def test_no_logits_of_the_whole_batch_are_kept_for_backward():
    """Dense: the (N, V) logits are saved for backward; chunked: nothing vocabulary-sized but the
    output weight itself."""
    model = _llama(tied=False)
    ids, attention, loss = _batch()
    n_scored = int(loss[:, 1:].sum())

    def largest_saved_with_vocab(chunk_size):
        sizes = []

        def pack(t):
            if t.shape and t.shape[-1] == V and t.data_ptr() != model.lm_head.weight.data_ptr():
                sizes.append(t.numel() // V)  # rows of vocabulary-sized activations
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            per_token_logps(model, ids, attention, loss, chunk_size=chunk_size)
        return max(sizes, default=0)

    assert largest_saved_with_vocab(None) >= n_scored
    assert largest_saved_with_vocab(4) == 0


# ------------------------------------------------------------------------------------------------
# models whose logits the chunked path cannot reproduce: dense, with a warning
# ------------------------------------------------------------------------------------------------


class _ScaledLogits(nn.Module):
    """A causal LM that scales its logits in forward without announcing it in its config."""

    def __init__(self, inner: LlamaForCausalLM) -> None:
        super().__init__()
        self.inner = inner

    def get_decoder(self):
        return self.inner.model

    def get_output_embeddings(self):
        return self.inner.lm_head

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = out.logits * 2.0
        return out


def test_final_logit_transforms_fall_back_to_the_dense_path(caplog):
    softcapped = _llama(tied=False)
    softcapped.config.final_logit_softcapping = 30.0
    scaled = _ScaledLogits(_llama(tied=False))
    ids, attention, loss = _batch()
    for model, why in ((softcapped, "final_logit_softcapping"), (scaled, "differ from the output layer")):
        with caplog.at_level(logging.WARNING, logger="lit_rlhf.ops.logprobs"):
            assert chunked_layers(model, ids) is None
        assert why in caplog.text and "dense" in caplog.text
        with torch.no_grad():
            torch.testing.assert_close(per_token_logps(model, ids, attention, loss, chunk_size=4),
                                       per_token_logps(model, ids, attention, loss))
    assert chunked_layers(_llama(tied=True), ids) is not None
