"""Log-probs of a causal LM (`lit_rlhf.models.logprobs`): left and right padding agree (D5), and
the chunked path (hidden states + output layer, logits recomputed in backward) equals the dense
logits: values and gradients, tied and untied output layers, bf16 autocast, fallback."""

import logging

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from lit_rlhf.models.logprobs import per_token_logps, response_logps
from lit_rlhf.models.output_layer import chunked_layers
from lit_rlhf.ops import position_ids_from_mask

V, H = 96, 32


def test_left_and_right_padding_give_same_logps(tiny_model, tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    rows = [tiny_tokenizer(text)["input_ids"] for text in ("hello world, this is a test", "a b")]
    width = max(len(r) for r in rows)
    right = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    left = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    right_mask, left_mask = right != pad, left != pad
    # score every real token except the first of each row (it has no context)
    right_loss = right_mask & (position_ids_from_mask(right_mask) > 0)
    left_loss = left_mask & (position_ids_from_mask(left_mask) > 0)
    with torch.no_grad():
        right_logps = per_token_logps(tiny_model, right, right_mask, right_loss)
        left_logps = per_token_logps(tiny_model, left, left_mask, left_loss)
    for b, row in enumerate(rows):
        n = len(row)
        assert (right_logps[b, n:] == 0).all() and (left_logps[b, : width - n] == 0).all()
        torch.testing.assert_close(left_logps[b, width - n :], right_logps[b, :n], atol=1e-5, rtol=0)
        assert (right_logps[b, 1:n] < 0).all()  # real log-probs, not the masked zeros


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
        with caplog.at_level(logging.WARNING, logger="lit_rlhf.models.output_layer"):
            assert chunked_layers(model, ids) is None
        assert why in caplog.text and "dense" in caplog.text
        with torch.no_grad():
            torch.testing.assert_close(per_token_logps(model, ids, attention, loss, chunk_size=4),
                                       per_token_logps(model, ids, attention, loss))
    assert chunked_layers(_llama(tied=True), ids) is not None
