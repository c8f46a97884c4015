"""`sdpa_varlen`: each packed example's attention alone (`lit_rlhf.models.attention`).

Equal to `sdpa` with the block-diagonal causal mask (values and gradients), `sdpa` itself for
every call without example boundaries, no pair across examples ever computed, and a model
switched to it still saves as a plain `sdpa` model.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lit_rlhf.models import attention as varlen_attention
from lit_rlhf.models.attention import SDPA_VARLEN, boundaries_from_positions, sdpa_varlen_forward, use_varlen_attention

TOL = dict(rtol=1e-5, atol=1e-5)
HEADS, KV_HEADS, DIM = 4, 2, 8


class Attention(torch.nn.Module):
    """What transformers' attention functions read from the module."""

    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def qkv(rows: int, width: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(rows, HEADS, width, DIM), (rows, KV_HEADS, width, DIM), (rows, KV_HEADS, width, DIM)]
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


def positions(rows_of_lengths: list[list[int]]) -> torch.Tensor:
    return torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in rows_of_lengths])


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(rows, 1, L, L) bool: query i sees key j when j <= i and both are in the same example."""
    example = (position_ids == 0).cumsum(-1)
    same = example[:, :, None] == example[:, None, :]
    causal = torch.ones(position_ids.shape[-1], position_ids.shape[-1], dtype=torch.bool).tril()
    return (same & causal)[:, None]


def test_boundaries_from_positions():
    pos = positions([[3, 2], [4, 1]])
    got = boundaries_from_positions(pos)
    assert got["cu_seq_lens_q"].tolist() == [0, 3, 5, 9, 10] and got["cu_seq_lens_k"] is got["cu_seq_lens_q"]
    assert got["max_length_q"] == got["max_length_k"] == 4
    with pytest.raises(ValueError, match="start with position 0"):
        boundaries_from_positions(torch.tensor([[1, 2, 0, 1]]))


def test_equals_sdpa_with_the_block_mask_values_and_gradients():
    pos = positions([[5, 1, 6], [9, 3]])  # two rows of 12 tokens, grouped-query heads
    q, k, v = qkv(2, 12)
    got, _ = sdpa_varlen_forward(Attention(), q, k, v, None, scaling=0.3, **boundaries_from_positions(pos))
    grads_got = torch.autograd.grad(got.square().sum(), (q, k, v))
    want, _ = sdpa_attention_forward(Attention(), q, k, v, block_causal_mask(pos), scaling=0.3)
    grads_want = torch.autograd.grad(want.square().sum(), (q, k, v))
    assert got.shape == want.shape == (2, 12, HEADS, DIM)
    torch.testing.assert_close(got, want, **TOL)
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, **TOL)


def test_no_pair_across_examples_is_computed(monkeypatch):
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        calls.append((query.shape[2], key.shape[2], kwargs["is_causal"]))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(varlen_attention.F, "scaled_dot_product_attention", spy)
    q, k, v = qkv(1, 10)
    sdpa_varlen_forward(Attention(), q, k, v, None, **boundaries_from_positions(positions([[4, 2, 4]])))
    assert calls == [(4, 4, True), (2, 2, True), (4, 4, True)]  # 36 (query, key) pairs, not the row's 100


def test_without_boundaries_it_is_sdpa():
    q, k, v = qkv(2, 6)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    mask[1, :, :, 4:] = False  # padding in the second row
    for m in (None, mask):
        got, _ = sdpa_varlen_forward(Attention(), q, k, v, m, scaling=0.5)
        want, _ = sdpa_attention_forward(Attention(), q, k, v, m, scaling=0.5)
        assert torch.equal(got, want)


def test_refuses_boundaries_it_cannot_follow():
    q, k, v = qkv(2, 4)
    spans_rows = torch.tensor([0, 3, 8], dtype=torch.int32)  # the second example runs from row 0 into row 1
    with pytest.raises(ValueError, match="spans rows 0 and 1"):
        sdpa_varlen_forward(Attention(), q, k, v, None, cu_seq_lens_q=spans_rows)
    with pytest.raises(ValueError, match="rise from 0 to 8"):
        sdpa_varlen_forward(Attention(), q, k, v, None, cu_seq_lens_q=torch.tensor([0, 4], dtype=torch.int32))
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="same example boundaries"):
        sdpa_varlen_forward(Attention(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=torch.tensor([0, 2, 8]))
    with pytest.raises(ValueError, match="no KV cache"):
        sdpa_varlen_forward(Attention(), q, k[:, :, :2], v[:, :, :2], None, cu_seq_lens_q=cu)


def tiny_llama(attn: str):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, attn_implementation=attn)
    return AutoModelForCausalLM.from_config(config).eval()


def test_packed_forward_builds_no_mask_and_equals_each_example_alone(monkeypatch):
    from lit_rlhf.models.packed import _packed_forward

    masks = []
    real = varlen_attention.sdpa_varlen_forward

    def spy(module, query, key, value, attention_mask, **kwargs):
        masks.append(attention_mask)
        return real(module, query, key, value, attention_mask, **kwargs)

    model = tiny_llama("sdpa")
    use_varlen_attention(model)
    monkeypatch.setitem(AttentionInterface._global_mapping, SDPA_VARLEN, spy)
    lengths = [6, 3, 5]
    ids = torch.randint(0, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        packed = _packed_forward(model, ids, positions([lengths])).logits
        alone = torch.cat([model(input_ids=x).logits for x in ids.split(lengths, dim=1)], dim=1)
        padding = torch.ones_like(ids)
        padding[0, -2:] = 0
        model(input_ids=ids, attention_mask=padding)  # a padded batch: sdpa's mask again
    torch.testing.assert_close(packed, alone, **TOL)
    assert len(masks) == 2 + 3 * 2 + 2  # two layers per forward
    assert masks[:2] == [None, None]  # the packed rows: boundaries, no (rows, 1, L, L) mask
    assert masks[-1] is not None and masks[-1].shape[-2:] == (sum(lengths), sum(lengths))


def test_switching_a_model(tmp_path):
    model = tiny_llama("sdpa")
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    before = model(input_ids=ids, attention_mask=mask).logits
    assert use_varlen_attention(model) and model.config._attn_implementation == SDPA_VARLEN
    assert use_varlen_attention(model)  # idempotent
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)  # padded batches: sdpa
    generated = model.generate(ids[:1], max_new_tokens=3, do_sample=False)  # a KV cache: sdpa
    assert generated.shape == (1, 10)
    model.save_pretrained(tmp_path)  # what is saved is a plain transformers model
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"
    eager = tiny_llama("eager")
    assert not use_varlen_attention(eager) and eager.config._attn_implementation == "eager"


def test_boundaries_are_read_once_per_forward_pass(monkeypatch):
    reads = []
    real = varlen_attention._read_segments
    monkeypatch.setattr(varlen_attention, "_read_segments", lambda *a: reads.append(a[1:]) or real(*a))
    q, k, v = qkv(2, 6)
    boundaries = boundaries_from_positions(positions([[4, 2], [3, 3]]))
    first, _ = sdpa_varlen_forward(Attention(), q, k, v, None, **boundaries)
    again, _ = sdpa_varlen_forward(Attention(), q, k, v, None, **boundaries)  # the next layer: same boundaries
    assert torch.equal(first, again) and reads == [(2, 6)]
    sdpa_varlen_forward(Attention(), q, k, v, None, **boundaries_from_positions(positions([[4, 2], [3, 3]])))
    assert reads == [(2, 6), (2, 6)]  # a new boundary tensor is read again
